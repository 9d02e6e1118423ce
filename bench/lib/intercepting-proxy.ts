import type { Logger } from 'pino';
import { pino } from 'pino';
import { ConnectionBudget, EnforcementTable } from '../../src/enforce/index.js';
import { FlowRecorder, FlowStore } from '../../src/flows/index.js';
import { MoatMetrics } from '../../src/metrics/index.js';
import {
  compileInternalDenyList,
  compilePolicy,
  type IPAddress,
  parseIP,
  parseNetworkConfig,
} from '../../src/policy/index.js';
import {
  Dialer,
  EgressProxy,
  FairShare,
  type FairShareBudgets,
  type HeaderInjection,
  type TcpIoSetting,
  TransparentProxy,
  TunnelRegistry,
} from '../../src/proxy/index.js';
import type { HostPort } from '../../src/net/index.js';
import { LOOPBACK_IS_OUTSIDE } from './loopback-outside.js';

export interface InterceptingProxyOptions {
  /** Names Moat resolves, to their addresses (no DNS is asked). */
  readonly names: ReadonlyMap<string, readonly string[]>;
  readonly injection: HeaderInjection;
  /** PEM of the CA the origins' certificates come from (`--upstream-ca`). */
  readonly upstreamCa?: string;
  /** The destination ports of redirected TLS and HTTP (the origins' ports on loopback). */
  readonly transparentPorts: { readonly tls: number; readonly http: number };
  readonly logger?: Logger;
  readonly handshakeTimeoutMs?: number;
  readonly maxTunnelsPerSandbox?: number;
  /** How the explicit proxy carries connections (default: Node's sockets). */
  readonly tcpIo?: TcpIoSetting;
  /** `--redact-secrets-in-responses`. */
  readonly redactSecretsInResponses?: boolean;
  /** Sandboxes' shares of costly work (`--proxy-requests-per-second`...); default: none. */
  readonly fairShare?: FairShareBudgets;
}

export interface InterceptingProxy {
  readonly proxy: HostPort;
  readonly transparent: HostPort;
  readonly table: EnforcementTable;
  readonly flows: FlowStore;
  readonly metrics: MoatMetrics;
  /** Registers a sandbox (egress secret, source address) with a network configuration. */
  register(sandboxID: string, secret: string, source: string, network: object): void;
  /** Publishes a new network configuration for a registered sandbox (as a PUT would). */
  publish(sandboxID: string, network: object): void;
  close(): Promise<void>;
}

function ipOf(text: string): IPAddress {
  const parsed = parseIP(text);
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.value;
}

/**
 * The egress proxy and the transparent listener with secretless egress on, on loopback, built
 * from the same parts `moat serve` builds them from (without its DNS, API and sandboxes): what
 * the interception tests and `npm run bench:tls` start.
 */
export async function startInterceptingProxy(
  options: InterceptingProxyOptions,
): Promise<InterceptingProxy> {
  const logger = options.logger ?? pino({ level: 'silent' });
  const metrics = new MoatMetrics({ defaultMetrics: false });
  const table = new EnforcementTable();
  const store = new FlowStore(10_000);
  const flows = new FlowRecorder({ store, metrics, logger, node: 'bench' });
  const internal = compileInternalDenyList([]);
  const compile = (network: object) => {
    const parsed = parseNetworkConfig(network);
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
    return compilePolicy(parsed.value, internal);
  };
  const dialer = new Dialer({
    resolver: {
      lookup: async (name) => {
        const addresses = options.names.get(name);
        if (addresses === undefined) throw new Error(`${name}: no such name`);
        return addresses.map(ipOf);
      },
    },
    connectTimeoutMs: 5000,
    host: LOOPBACK_IS_OUTSIDE,
  });
  const tunnels = new TunnelRegistry(table, (sandbox, target) =>
    dialer.check(sandbox, target, target.ip),
  );
  const proxyOptions = {
    table,
    dialer,
    tunnels,
    metrics,
    logger,
    flows,
    checkServerName: true,
    maxTunnelsPerSandbox: options.maxTunnelsPerSandbox ?? 256,
    connections: new ConnectionBudget({
      table,
      perSandbox: options.maxTunnelsPerSandbox ?? 256,
      total: Infinity,
      now: Date.now,
      refused: (refusal) => metrics.budgetRefusals.inc({ resource: refusal.resource }),
    }),
    sourceIsProof: false,
    handshakeTimeoutMs: options.handshakeTimeoutMs ?? 10_000,
    firstByteTimeoutMs: options.handshakeTimeoutMs ?? 10_000,
    keepAliveTimeoutMs: 30_000,
    idleTimeoutMs: 300_000,
    transparentPorts: options.transparentPorts,
    tcpIo: options.tcpIo ?? 'node',
    injection: options.injection,
    upstreamCa: options.upstreamCa,
    redactSecretsInResponses: options.redactSecretsInResponses,
    fairShare:
      options.fairShare === undefined
        ? undefined
        : new FairShare(options.fairShare, { table, metrics, logger }),
  };
  const egress = new EgressProxy(proxyOptions);
  const transparent = new TransparentProxy(proxyOptions);
  const proxyPort = await egress.listen({ host: '127.0.0.1', port: 0 });
  const transparentPort = await transparent.listen({ host: '127.0.0.1', port: 0 });
  return {
    proxy: { host: '127.0.0.1', port: proxyPort },
    transparent: { host: '127.0.0.1', port: transparentPort },
    table,
    flows: store,
    metrics,
    register(sandboxID, secret, source, network) {
      table.remove(sandboxID);
      table.register(
        sandboxID,
        { sourceAddress: ipOf(source), egressSecret: secret },
        compile(network),
      );
    },
    publish(sandboxID, network) {
      table.publish(sandboxID, compile(network));
    },
    async close() {
      await Promise.all([egress.close(), transparent.close()]);
    },
  };
}
