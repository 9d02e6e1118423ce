import { mkdir } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Logger } from 'pino';
import { type ApiKeys, createPlatformApi, listenApi, loadApiKeys } from '../api/index.js';
import { formatHostPort, type HostPort, type MoatConfig } from '../config.js';
import { AnswerCache, DnsInterceptor, HostResolver, UpstreamClient } from '../dns/index.js';
import { AddressPool, EnforcementTable } from '../enforce/index.js';
import { listenMetrics, MoatMetrics } from '../metrics/index.js';
import { compileInternalDenyList, type InternalDenyList, type IPAddress } from '../policy/index.js';
import { Dialer, EgressProxy, TransparentProxy, TunnelRegistry } from '../proxy/index.js';
import { ProcessRuntime, type SandboxRuntime } from '../runtime/index.js';
import { type SandboxRecord, SandboxService } from '../sandbox/index.js';
import { FileStore, type Store } from '../store/index.js';
import { createSandboxGateway } from './gateway.js';
import { VERSION } from './version.js';

export interface RunningMoat {
  readonly config: MoatConfig;
  readonly table: EnforcementTable;
  readonly metrics: MoatMetrics;
  readonly internal: InternalDenyList;
  readonly tunnels: TunnelRegistry;
  readonly dns: DnsInterceptor;
  /** Source addresses for new sandboxes, from config.sourcePool. */
  readonly sources: AddressPool;
  readonly store: Store;
  readonly runtime: SandboxRuntime;
  readonly sandboxes: SandboxService;
  readonly apiKeys: ApiKeys;
  /** Where each listener ended up (ports resolved when 0 was asked for). */
  readonly listening: Listening;
  stop(drainMs?: number): Promise<void>;
}

interface Listening {
  dns: HostPort;
  proxy: HostPort;
  transparent: HostPort | undefined;
  api: HostPort;
  sandbox: HostPort;
  /** The separate GET /metrics listener; undefined when switched off. */
  metrics: HostPort | undefined;
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

/**
 * What every process of a sandbox finds in its environment: its create `envVars`, then the
 * egress proxy with its credential (both spellings: curl reads only the lower-case http_proxy).
 */
function sandboxEnvironment(record: SandboxRecord, proxy: HostPort): Record<string, string> {
  const url = `http://${record.sandboxID}:${record.egressSecret}@${formatHostPort(proxy)}`;
  return {
    NO_PROXY: 'localhost,127.0.0.1,::1',
    no_proxy: 'localhost,127.0.0.1,::1',
    ...record.envVars,
    HTTP_PROXY: url,
    HTTPS_PROXY: url,
    ALL_PROXY: url,
    http_proxy: url,
    https_proxy: url,
    all_proxy: url,
    E2B_SANDBOX: 'true',
    E2B_SANDBOX_ID: record.sandboxID,
  };
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
  const listening: Listening = {
    dns: config.dnsListen,
    proxy: config.proxyListen,
    transparent: config.transparentListen,
    api: config.apiListen,
    sandbox: config.sandboxListen,
    metrics: config.metricsListen,
  };
  const tunnels = new TunnelRegistry(table);
  metrics.countTunnelsWith(() => tunnels.size);
  const dialer = new Dialer({
    resolver: new HostResolver(cache),
    connectTimeoutMs: config.proxyConnectTimeoutMs,
    isOwnListener: ownListenerCheck(() => [
      listening.dns,
      listening.proxy,
      listening.api,
      listening.sandbox,
      ...(listening.transparent ? [listening.transparent] : []),
      ...(listening.metrics ? [listening.metrics] : []),
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
  // Whatever started is stopped again if a later step fails (a port in use, a damaged store),
  // so a failed start leaves no listener open and no store lock held.
  const undo: Array<() => Promise<unknown>> = [];
  try {
    await mkdir(config.dataDir, { recursive: true, mode: 0o700 });
    const store = await FileStore.open(path.join(config.dataDir, 'store'), {
      onWarning: (message) => logger.warn({ store: config.dataDir }, message),
      onSync: (seconds) => metrics.storeSyncDuration.observe(seconds),
    });
    undo.push(() => store.close());
    const apiKeys = await loadApiKeys(config.apiKeys, config.dataDir);
    listening.dns = { ...config.dnsListen, port: await dns.start() };
    undo.push(() => dns.stop());
    listening.proxy = { ...config.proxyListen, port: await proxy.listen(config.proxyListen) };
    undo.push(() => proxy.close(0));
    if (transparent && config.transparentListen) {
      listening.transparent = {
        ...config.transparentListen,
        port: await transparent.listen(config.transparentListen),
      };
      undo.push(() => transparent.close());
    }
    const runtime = new ProcessRuntime(config.dataDir);
    undo.push(() => runtime.stop());
    const sources = new AddressPool(config.sourcePool);
    const sandboxes = new SandboxService({
      store,
      runtime,
      table,
      sources,
      internal,
      metrics,
      logger,
      maxPolicyEntries: config.maxPolicyEntries,
      namespace: config.namespace,
      now,
      environment: (record) => sandboxEnvironment(record, listening.proxy),
    });
    // Listeners are up first (their ports go into sandbox environments); until start() has
    // restored the stored sandboxes, the table is empty and every packet is refused.
    await sandboxes.start();
    undo.push(() => sandboxes.stop());
    const api = createPlatformApi({
      service: sandboxes,
      egress: {
        get proxy() {
          return listening.proxy;
        },
        get dns() {
          return listening.dns;
        },
        enforcement: runtime.enforcement,
      },
      keys: apiKeys.keys,
      metrics,
      logger,
      metricsRequireKey: config.metricsRequireKey,
      version: VERSION,
    });
    listening.api = await listenApi(api, config.apiListen);
    undo.push(() => api.close());
    const { gateway, ingress } = createSandboxGateway({
      sandboxes,
      runtime,
      logger,
      connectTimeoutMs: config.proxyConnectTimeoutMs,
      idleTimeoutMs: config.proxyIdleTimeoutMs,
    });
    listening.sandbox = {
      ...config.sandboxListen,
      port: await gateway.listen(config.sandboxListen),
    };
    undo.push(async () => {
      await gateway.close();
      ingress.close();
    });
    const metricsListener = config.metricsListen
      ? await listenMetrics(metrics.registry, config.metricsListen)
      : undefined;
    if (metricsListener && config.metricsListen) {
      listening.metrics = { ...config.metricsListen, port: metricsListener.port };
    }
    return {
      config,
      table,
      metrics,
      internal,
      tunnels,
      dns,
      sources,
      store,
      runtime,
      sandboxes,
      apiKeys,
      listening,
      async stop(drainMs = 0) {
        await metricsListener?.close();
        await api.close();
        await gateway.close();
        ingress.close();
        await sandboxes.stop();
        await runtime.stop();
        await proxy.close(drainMs);
        await transparent?.close();
        await dns.stop();
        await store.close();
      },
    };
  } catch (error) {
    for (const step of undo.reverse()) await step().catch(() => undefined);
    throw error;
  }
}
