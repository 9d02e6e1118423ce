/**
 * The namespace gateway: where namespaced sandboxes reach Moat (its DNS, proxy and transparent
 * listeners on one gateway address) and the kernel enforcer that writes their firewalls.
 */
import { createHash } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import type { MoatConfig } from '../config.js';
import type { HostPort } from '../net/index.js';
import type { DnsInterceptor } from '../dns/index.js';
import type { FlowRecorder } from '../flows/index.js';
import {
  DNS_PORT,
  type EnforcedSandbox,
  type EnforcementTable,
  KernelEnforcer,
} from '../enforce/index.js';
import type { MoatMetrics } from '../metrics/index.js';
import { type Decision, type InternalDenyList, type IPAddress, parseIP } from '../policy/index.js';
import {
  type Dialer,
  type EgressProxy,
  originalDestinationUnavailable,
  type TransparentProxy,
} from '../proxy/index.js';
import {
  type DirectFlow,
  FLOW_LOG_GROUP,
  NamespaceNetwork,
  namespacesWork,
} from '../runtime/index.js';
import { bindListener, type Listening, UNSPECIFIED } from './listeners.js';

/** Ports Moat listens on at the gateway address of namespaced sandboxes. */
export const GATEWAY_PORTS = { dns: 53, proxy: 3128, transparent: 3129 } as const;

/**
 * The network namespace part when this Moat enforces in the kernel, or why it does not. `auto`
 * falls back to proxy-only enforcement and says why; `namespace` refuses to start without it.
 */
export function chooseNetwork(config: MoatConfig): { network?: NamespaceNetwork; reason?: string } {
  if (config.enforcement === 'proxy') return { reason: '--enforcement proxy' };
  const namespaces = namespacesWork();
  const problem = namespaces.ok ? undefined : namespaces.reason;
  if (problem !== undefined) {
    if (config.enforcement === 'namespace')
      throw new Error(`--enforcement namespace is not possible here: ${problem}`);
    return { reason: problem };
  }
  const pool = config.namespacePool;
  return {
    network: new NamespaceNetwork({
      // Named by the pool, which one Moat holds at a time (a lock in /run/moat): a Moat that
      // takes over a pool after a crash finds and removes what its predecessor left.
      scope: createHash('sha256').update(pool.text).digest('hex').slice(0, 6),
      pool: { network: pool.text.split('/')[0]!, prefixLength: pool.prefixLength },
    }),
  };
}

export interface NamespaceGatewayParts {
  readonly config: MoatConfig;
  readonly logger: Logger;
  readonly listening: Listening;
  readonly table: EnforcementTable;
  readonly internal: InternalDenyList;
  readonly metrics: MoatMetrics;
  readonly now: () => number;
  readonly dns: DnsInterceptor;
  readonly proxy: EgressProxy;
  readonly transparent: TransparentProxy;
  readonly dialer: Dialer;
  /** Where the direct flows the sandboxes' firewalls log are recorded. */
  readonly flows: FlowRecorder;
}

/** The TCP ports a sandbox's firewall decides by address only when it holds them directly. */
const WEB_PORTS = new Set([80, 443]);

/**
 * The one decision for a direct flow, as the sandbox's firewall makes it: on web ports a learned
 * address does not count (nothing read the connection's name; see kernel-rules.ts).
 */
function firewallDecision(
  parts: NamespaceGatewayParts,
  sandbox: EnforcedSandbox,
  ip: IPAddress,
  port: number,
  protocol: string,
): Decision {
  return parts.dialer.check(sandbox, { ip, port }, ip, protocol === 'tcp' && WEB_PORTS.has(port));
}

/**
 * Readies the host for namespaced sandboxes: leftovers of an earlier run removed, the gateway
 * address up, Moat's DNS, proxy and transparent listeners on it, and the host's side of the
 * firewall. Returns the enforcer that writes each sandbox's firewall.
 */
export async function startNamespaceGateway(
  network: NamespaceNetwork,
  parts: NamespaceGatewayParts,
): Promise<KernelEnforcer> {
  const { config, logger, listening, metrics } = parts;
  for (const name of await network.prepare()) {
    logger.warn({ namespace: name }, 'removed a network namespace an earlier run left');
  }
  network.readDirectFlows(
    (flow) => recordDirectFlow(flow, parts),
    (message) => logger.warn(message),
  );
  const gateway = parseIP(network.gateway);
  if (!gateway.ok) throw new Error(gateway.error);
  const host = network.gateway;
  // A main listener on the unspecified address already answers on the gateway.
  const onGateway = async (
    listener: string | undefined,
    main: HostPort,
    port: number,
    bind: (at: HostPort) => Promise<number>,
  ) => {
    if (UNSPECIFIED.has(main.host)) return { host, port: main.port };
    const at = { host, port };
    return {
      host,
      port: await (listener === undefined ? bind(at) : bindListener(listener, at, () => bind(at))),
    };
  };
  listening.gateway = {
    // The DNS interceptor names its own listeners (udp or tcp).
    dns: await onGateway(undefined, listening.dns, GATEWAY_PORTS.dns, (at) => parts.dns.listen(at)),
    proxy: await onGateway(
      'gateway egress proxy listener',
      listening.proxy,
      GATEWAY_PORTS.proxy,
      (at) => parts.proxy.listen(at),
    ),
    transparent: await onGateway(
      'gateway transparent listener',
      listening.transparent ?? { host, port: 0 },
      GATEWAY_PORTS.transparent,
      (at) => parts.transparent.listen(at),
    ),
  };
  const kernel = new KernelEnforcer(
    {
      gateway: gateway.value,
      ports: {
        dns: listening.gateway.dns.port,
        proxy: listening.gateway.proxy.port,
        transparent: listening.gateway.transparent.port,
      },
      pool: config.namespacePool,
      hostPorts: [...config.allowHostPorts],
      internal: parts.internal,
      linkPrefix: network.linkPrefix,
      hostTable: network.hostTable,
      flowLogGroup: FLOW_LOG_GROUP,
      connections: {
        newPerSecond: config.sandboxNewConnectionsPerSecond,
        newBurst: config.sandboxNewConnectionsBurst,
        tracked: config.sandboxTrackedConnections,
      },
    },
    {
      table: parts.table,
      apply: (sandboxID, commands) => network.firewall(sandboxID, commands),
      list: (sandboxID, command) => network.firewallListing(sandboxID, command),
      limitBandwidth: (sandboxID, { egressMbps, ingressMbps }) =>
        network.limitBandwidth(sandboxID, egressMbps, ingressMbps),
      applyHost: (commands) => network.host(commands),
      // Only where the original destination of a redirected connection can be read.
      redirectPort:
        originalDestinationUnavailable() === undefined
          ? async (sandboxID) => {
              const inside = await network.listenInside(sandboxID);
              parts.transparent.adoptInside(sandboxID, inside);
              return (inside.address() as AddressInfo).port;
            }
          : undefined,
      now: parts.now,
      endDenied: (sandboxID) => endDeniedConnections(network, parts, sandboxID),
      onApplied: (change, ok, seconds) => {
        metrics.kernelApplies.inc({ change, result: ok ? 'applied' : 'failed' });
        if (ok) metrics.kernelApplyDuration.observe({ change }, seconds);
      },
    },
  );
  await kernel.installHost();
  return kernel;
}

/**
 * Ends, right after a publish, the sandbox's open TCP connections the new policy denies (their
 * packets are already stopped; this makes the programs holding them see it at once), leaving
 * alone those Moat holds itself and those to its DNS.
 */
async function endDeniedConnections(
  network: NamespaceNetwork,
  parts: NamespaceGatewayParts,
  sandboxID: string,
): Promise<void> {
  const sandbox = parts.table.get(sandboxID);
  if (sandbox === undefined) return;
  try {
    const open = await network.sandboxConnections(sandboxID);
    // A connection established before the listing is accepted by Moat's listener
    // (transparent, or inside the namespace) by the time this turn of the event loop has
    // polled its socket.
    await new Promise((resolve) => setImmediate(resolve));
    const held = new Set<string>();
    for (const host of new Set(open.map(({ local }) => local.host)))
      for (const port of parts.transparent.portsHeldFrom(host)) held.add(`${host}:${port}`);
    const doomed = open.filter(({ local, peer }) => {
      // Moat's own (its transparent listener's, by name, and its listener's inside the
      // namespace, by address): it re-decides them itself.
      if (held.has(`${local.host}:${local.port}`)) return false;
      // Redirected to Moat's DNS, whichever resolver they name: never direct.
      if (peer.port === DNS_PORT) return false;
      // With an upstream proxy none may be direct (Moat's listeners hold the rest, and
      // decide and end those themselves): these were opened before a PUT named the proxy.
      if (sandbox.upstream !== undefined) return true;
      const ip = parseIP(peer.host);
      return (
        ip.ok && firewallDecision(parts, sandbox, ip.value, peer.port, 'tcp').verdict === 'deny'
      );
    });
    await network.endConnections(sandboxID, doomed);
    if (doomed.length > 0)
      parts.logger.info(
        { sandboxID, connections: doomed.length },
        'open connections the new policy denies ended',
      );
  } catch (error) {
    // Their packets are stopped all the same; the sockets learn at their next send.
    parts.logger.warn(
      { sandboxID, err: (error as Error).message },
      'ending denied connections failed',
    );
  }
}

/**
 * One direct flow the kernel let out or refused, as a flow record: the kernel's verdict, and the
 * list and rule of the one decision when it agrees (it always should; a learned address the
 * kernel still holds for a name is the one way they can differ). A flow to the host's own
 * address leaves the sandbox's firewall but goes no further: the host's table drops it, and
 * the record says so.
 */
function recordDirectFlow(flow: DirectFlow, parts: NamespaceGatewayParts): void {
  const sandbox = parts.table.get(flow.sandboxID);
  const ip = parseIP(flow.address);
  if (sandbox === undefined || !ip.ok) return;
  const port = flow.port === 0 ? null : flow.port;
  const decision = firewallDecision(parts, sandbox, ip.value, flow.port, flow.protocol);
  parts.flows.decided(
    {
      sandboxID: flow.sandboxID,
      kind: 'direct',
      destination: { name: null, address: flow.address, port, protocol: flow.protocol },
    },
    decision.verdict === flow.verdict || decision.list === 'host'
      ? decision
      : {
          verdict: flow.verdict,
          list: 'kernel',
          rule: null,
          reason: `the sandbox's firewall ${flow.verdict === 'allow' ? 'let it out' : 'refused it'}`,
        },
  );
}
