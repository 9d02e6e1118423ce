import os from 'node:os';
import type { Logger } from 'pino';
import type { HostPort, MoatConfig } from '../config.js';
import { AnswerCache, DnsInterceptor, HostResolver, UpstreamClient } from '../dns/index.js';
import { AddressPool, EnforcementTable } from '../enforce/index.js';
import { MoatMetrics } from '../metrics/index.js';
import { compileInternalDenyList, type InternalDenyList, type IPAddress } from '../policy/index.js';
import { Dialer, EgressProxy, TransparentProxy, TunnelRegistry } from '../proxy/index.js';

export interface RunningMoat {
  readonly config: MoatConfig;
  readonly table: EnforcementTable;
  readonly metrics: MoatMetrics;
  readonly internal: InternalDenyList;
  readonly tunnels: TunnelRegistry;
  readonly dns: DnsInterceptor;
  /** Source addresses for new sandboxes, from config.sourcePool. */
  readonly sources: AddressPool;
  /** Where each listener ended up (ports resolved when 0 was asked for). */
  readonly listening: {
    readonly dns: HostPort;
    readonly proxy: HostPort;
    readonly transparent: HostPort | undefined;
  };
  stop(drainMs?: number): Promise<void>;
}

const UNSPECIFIED = new Set(['0.0.0.0', '::']);

/** Moat's own listeners are never dialled: a sandbox must not reach Moat through Moat. */
function ownListenerCheck(listeners: () => HostPort[]): (ip: IPAddress, port: number) => boolean {
  const local = new Set(
    Object.values(os.networkInterfaces())
      .flat()
      .map((i) => i?.address),
  );
  return (ip, port) =>
    listeners().some(
      (l) =>
        l.port === port &&
        (l.host === ip.text ||
          (UNSPECIFIED.has(l.host) && (local.has(ip.text) || ip.text.startsWith('127.')))),
    );
}

/** Starts every part Moat runs, wired together as `moat serve` runs them. */
export interface StartOptions {
  readonly now?: () => number;
  readonly defaultMetrics?: boolean;
  /** Origin ports behind the transparent listener (tests use unprivileged ones). */
  readonly transparentPorts?: { readonly tls: number; readonly http: number };
}

export async function startMoat(
  config: MoatConfig,
  logger: Logger,
  options: StartOptions = {},
): Promise<RunningMoat> {
  const now = options.now ?? Date.now;
  const metrics = new MoatMetrics({ defaultMetrics: options.defaultMetrics });
  const internal = compileInternalDenyList(config.internalDeny);
  const table = new EnforcementTable({ now });
  const upstream = new UpstreamClient(config.dnsUpstream, {
    timeoutMs: config.dnsTimeoutMs,
    attemptTimeoutMs: Math.max(100, Math.floor(config.dnsTimeoutMs / 3)),
    onLatency: (seconds) => metrics.dnsUpstreamDuration.observe(seconds),
  });
  const cache = new AnswerCache(upstream, {
    capacity: config.dnsCacheSize,
    maxTtl: config.dnsMaxTtl,
    maxNegativeTtl: Math.min(config.dnsMaxTtl, 3600),
    now,
    onLookup: (hit) => metrics.dnsCacheLookups.inc({ result: hit ? 'hit' : 'miss' }),
  });
  const dns = new DnsInterceptor({
    listen: config.dnsListen,
    table,
    cache,
    metrics,
    logger,
    minLearnTtl: config.dnsMinTtl,
    maxLearnTtl: config.dnsMaxTtl,
    rateLimit: config.dnsRateLimit,
    now,
  });
  const listening: { dns: HostPort; proxy: HostPort; transparent: HostPort | undefined } = {
    dns: config.dnsListen,
    proxy: config.proxyListen,
    transparent: config.transparentListen,
  };
  const tunnels = new TunnelRegistry(table);
  metrics.countTunnelsWith(() => tunnels.size);
  const dialer = new Dialer({
    resolver: new HostResolver(cache),
    connectTimeoutMs: config.proxyConnectTimeoutMs,
    isOwnListener: ownListenerCheck(() => [
      listening.dns,
      listening.proxy,
      ...(listening.transparent ? [listening.transparent] : []),
    ]),
    onDial: (seconds) => metrics.proxyDialDuration.observe(seconds),
  });
  const proxyOptions = {
    table,
    dialer,
    tunnels,
    metrics,
    logger,
    checkServerName: config.proxyCheckServerName,
    maxTunnelsPerSandbox: config.proxyMaxTunnels,
    handshakeTimeoutMs: config.proxyHandshakeTimeoutMs,
    idleTimeoutMs: config.proxyIdleTimeoutMs,
    transparentPorts: options.transparentPorts,
  };
  const proxy = new EgressProxy(proxyOptions);
  const transparent = config.transparentListen ? new TransparentProxy(proxyOptions) : undefined;
  listening.dns = { ...config.dnsListen, port: await dns.start() };
  listening.proxy = { ...config.proxyListen, port: await proxy.listen(config.proxyListen) };
  if (transparent && config.transparentListen) {
    listening.transparent = {
      ...config.transparentListen,
      port: await transparent.listen(config.transparentListen),
    };
  }
  return {
    config,
    table,
    metrics,
    internal,
    tunnels,
    dns,
    sources: new AddressPool(config.sourcePool),
    listening,
    async stop(drainMs = 0) {
      await proxy.close(drainMs);
      await transparent?.close();
      await dns.stop();
    },
  };
}
