import { createHash } from 'node:crypto';
import { randomBytes } from 'node:crypto';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Logger } from 'pino';
import {
  type ApiKeys,
  type ApiRouting,
  createPlatformApi,
  listenApi,
  loadApiKeys,
} from '../api/index.js';
import { Cluster } from '../cluster/index.js';
import { formatHostPort, type HostPort, isNodeID, type MoatConfig } from '../config.js';
import { listenFailure } from '../listen-failure.js';
import { AnswerCache, DnsInterceptor, HostResolver, UpstreamClient } from '../dns/index.js';
import { FlowFileSink, FlowRecorder, FlowStore } from '../flows/index.js';
import { MoatCa } from '../intercept-ca/index.js';
import {
  AddressPool,
  EnforcementTable,
  HOST_REFRESH_MS,
  HostWatch,
  KernelEnforcer,
  listenerGuardRuleset,
  listenerGuardTable,
  overlappingListenerGuards,
  removeHostRuleset,
  removeListenerGuard,
} from '../enforce/index.js';
import { listenMetrics, MoatMetrics } from '../metrics/index.js';
import {
  type CanonicalName,
  compileInternalDenyList,
  headerTransformFor,
  type HostAddresses,
  type InternalDenyList,
  parseIP,
} from '../policy/index.js';
import {
  Dialer,
  EgressProxy,
  originalDestinationUnavailable,
  TransparentProxy,
  TunnelRegistry,
} from '../proxy/index.js';
import {
  NamespaceNetwork,
  namespacesWork,
  listNftTables,
  NftSession,
  ProcessRuntime,
  type SandboxEnvironment,
  type SandboxRuntime,
} from '../runtime/index.js';
import { SANDBOX_ID, type SandboxRecord, SandboxError, SandboxService } from '../sandbox/index.js';
import { FileStore, RedisStore, type Store } from '../store/index.js';
import { loadSecretsKey, SecretVault } from '../secrets/index.js';
import { createSandboxGateway } from './gateway.js';
import { notReady } from './readiness.js';
import { VERSION } from './version.js';
import { warnEvery } from '../warn-every.js';

export interface RunningMoat {
  readonly config: MoatConfig;
  readonly table: EnforcementTable;
  readonly metrics: MoatMetrics;
  readonly internal: InternalDenyList;
  readonly tunnels: TunnelRegistry;
  /** Every enforcement decision of this node, and its store of recent ones. */
  readonly flows: FlowRecorder;
  /** The explicit egress proxy (its `io` says how it carries connections). */
  readonly proxy: EgressProxy;
  readonly dns: DnsInterceptor;
  /** Source addresses for new sandboxes, from config.sourcePool. */
  readonly sources: AddressPool;
  readonly store: Store;
  readonly runtime: SandboxRuntime;
  /** Each sandbox's network namespace; undefined when sandboxes share the host network. */
  readonly network: NamespaceNetwork | undefined;
  readonly sandboxes: SandboxService;
  readonly apiKeys: ApiKeys;
  /** Secrets by name (current values read at request time) for the egress gateway. */
  readonly secrets: SecretVault;
  /** Where the key sealing secret values came from (never the key). */
  readonly secretsKeySource: string;
  /** Moat's egress CA: leaves for the TLS it terminates; every sandbox trusts it. */
  readonly ca: MoatCa;
  /** The other nodes sharing the store; undefined for a Moat on its own. */
  readonly cluster: Cluster | undefined;
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
  /** Where namespaced sandboxes reach Moat; undefined when sandboxes share the host network. */
  gateway: { dns: HostPort; proxy: HostPort; transparent: HostPort } | undefined;
}

const UNSPECIFIED = new Set(['0.0.0.0', '::']);

/** Binds one listener; a failure names the listener and its address (`cannot start:` says which). */
const bindListener = <T>(listener: string, at: HostPort, bind: () => Promise<T>): Promise<T> =>
  bind().catch((error: unknown) => {
    throw listenFailure(listener, at, error);
  });

/** Every listener of Moat's. */
const ownListeners = (listening: Listening): HostPort[] =>
  [
    listening.dns,
    listening.proxy,
    listening.api,
    listening.sandbox,
    listening.transparent,
    listening.metrics,
    ...Object.values(listening.gateway ?? {}),
  ].flatMap((at) => (at === undefined ? [] : [at]));

/**
 * A host port the operator opened must not be one of Moat's own listeners: nothing a sandbox
 * does reaches Moat through Moat (ports asked as 0 are known only once bound).
 */
function checkHostPorts(config: MoatConfig, listening: Listening): void {
  const taken = ownListeners(listening).find((at) => config.allowHostPorts.has(at.port));
  if (taken !== undefined)
    throw new Error(
      `--allow-host-ports names ${taken.port}, where Moat itself listens (${formatHostPort(taken)}); Moat's own listeners are never opened to sandboxes`,
    );
}

/**
 * Sharing the host's network, sandbox processes could call Moat's platform API, any sandbox's
 * API and the metrics listener directly: a host nftables table refuses them by their host ids
 * (enforce/listener-guard.ts). Undefined when sandboxes are unconfined (they have no ids of
 * their own: `--unconfined-sandboxes` says so at start-up).
 */
function guardListeners(runtime: SandboxRuntime):
  | {
      update(listeners: ReadonlyArray<HostPort | undefined>): Promise<void>;
      remove(): Promise<void>;
    }
  | undefined {
  const ids = runtime.sandboxHostIds;
  if (ids === undefined) return undefined;
  const table = listenerGuardTable(ids);
  const session = new NftSession(undefined, 'the host namespace');
  // Read once: tables a killed Moat left over (part of) this range go with the first change.
  let stale: Promise<string[]> | undefined;
  return {
    async update(listeners) {
      const ports = listeners.flatMap((l) => (l && l.port !== 0 ? [l.port] : []));
      if (ports.length === 0) return;
      stale ??= listNftTables('inet').then((listing) => overlappingListenerGuards(listing, ids));
      await session.run(listenerGuardRuleset({ ids, ports, stale: await stale }));
    },
    async remove() {
      await session.run(removeListenerGuard(table)).catch(() => undefined);
      session.close();
    },
  };
}

/** Ports Moat listens on at the gateway address of namespaced sandboxes. */
const GATEWAY_PORTS = { dns: 53, proxy: 3128, transparent: 3129 } as const;

/**
 * The network namespace part when this Moat enforces in the kernel, or why it does not. `auto`
 * falls back to proxy-only enforcement and says why; `namespace` refuses to start without it.
 */
function chooseNetwork(config: MoatConfig): { network?: NamespaceNetwork; reason?: string } {
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

/**
 * What every process of a sandbox finds in its environment: its create `envVars`, then the
 * egress proxy with its credential (both spellings: curl reads only the lower-case http_proxy).
 */
function sandboxEnvironment(
  record: SandboxRecord,
  proxy: HostPort,
  trust: SandboxEnvironment,
): Record<string, string> {
  // Inside a namespace 127.0.0.1 is the sandbox's own; the proxy is on the gateway.
  const url = `http://${record.sandboxID}:${record.egressSecret}@${formatHostPort(proxy)}`;
  return {
    NO_PROXY: 'localhost,127.0.0.1,::1',
    no_proxy: 'localhost,127.0.0.1,::1',
    // Before envVars: a sandbox may name a bundle of its own.
    ...trust,
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

/** Milliseconds on a clock that only moves forward (it starts at the wall time of start-up). */
const TIME_ORIGIN = performance.timeOrigin; // a getter with checks, read on every DNS query
const steadyNow = (): number => TIME_ORIGIN + performance.now();

/** Starts every part Moat runs, wired together as `moat serve` runs them. */
export interface StartOptions {
  readonly now?: () => number;
  readonly defaultMetrics?: boolean;
  /** Origin ports behind the transparent listener (tests use unprivileged ones). */
  readonly transparentPorts?: { readonly tls: number; readonly http: number };
  /**
   * What is the host, instead of this host's interfaces as they come and go: tests whose
   * origins sit on this host's loopback, and are about something else, pass a host without
   * interfaces (compileHostAddresses([])).
   */
  readonly hostAddresses?: HostAddresses;
}

export async function startMoat(
  config: MoatConfig,
  logger: Logger,
  options: StartOptions = {},
): Promise<RunningMoat> {
  // Sandbox deadlines are instants (stored, and compared across restarts): wall time. What DNS
  // and enforcement measure are spans (TTLs, rate buckets, learned lifetimes), on a clock that
  // a wall-clock step (NTP) cannot move: a step back once refused every query for its length.
  const wallNow = options.now ?? Date.now;
  const now = options.now ?? steadyNow;
  const metrics = new MoatMetrics({
    defaultMetrics: options.defaultMetrics,
    perSandbox: config.metricsPerSandbox,
    version: VERSION,
  });
  const internal = compileInternalDenyList(config.internalDeny);
  const table = new EnforcementTable({ now });
  const flows = new FlowRecorder({
    store: new FlowStore(config.flowStoreSize, (where) =>
      metrics.flowRecordsDropped.inc({ where }),
    ),
    metrics,
    logger,
    node: config.nodeID === 'auto' ? os.hostname() : config.nodeID,
    now: wallNow,
  });
  const opened = await MoatCa.open({
    dataDir: config.dataDir,
    certFile: config.caCert,
    keyFile: config.caKey,
    owner: config.nodeID === 'auto' ? os.hostname() : config.nodeID,
  });
  if (!opened.ok) throw new Error(opened.error);
  const ca = opened.value;
  const { network, reason: proxyOnlyReason } = chooseNetwork(config);
  const watch =
    options.hostAddresses === undefined
      ? new HostWatch({
          sandboxLinks: network ? config.namespacePool : undefined,
          openPorts: config.allowHostPorts,
          onPolling: (why) =>
            logger.warn(
              { why, everyMs: HOST_REFRESH_MS },
              "the host's addresses are re-read on a timer",
            ),
        })
      : undefined;
  const host = options.hostAddresses ?? watch!;
  // Set once the gateway's ports are known; the DNS interceptor opens learned addresses with it.
  let kernel: KernelEnforcer | undefined;
  const upstream = new UpstreamClient(config.dnsUpstream, {
    timeoutMs: config.dnsTimeoutMs,
    onLatency: (seconds) => metrics.dnsUpstreamDuration.observe(seconds),
  });
  const cacheHits = metrics.hotCount(metrics.dnsCacheLookups, { result: 'hit' });
  const cacheMisses = metrics.hotCount(metrics.dnsCacheLookups, { result: 'miss' });
  const cache = new AnswerCache(upstream, {
    capacity: config.dnsCacheSize,
    maxTtl: config.dnsMaxTtl,
    maxNegativeTtl: Math.min(config.dnsMaxTtl, 3600),
    now,
    onLookup: (hit) => (hit ? cacheHits : cacheMisses).count++,
  });
  const dns = new DnsInterceptor({
    listen: config.dnsListen,
    table,
    cache,
    metrics,
    logger,
    flows,
    minLearnTtl: config.dnsMinTtl,
    maxLearnTtl: config.dnsMaxTtl,
    rateLimit: config.dnsRateLimit,
    udpIo: config.dnsUdpIo,
    host,
    now,
    onLearn: network
      ? (sandboxID, learned) => kernel?.learn(sandboxID, learned) ?? Promise.resolve()
      : undefined,
  });
  const listening: Listening = {
    dns: config.dnsListen,
    proxy: config.proxyListen,
    transparent: config.transparentListen,
    api: config.apiListen,
    sandbox: config.sandboxListen,
    metrics: config.metricsListen,
    gateway: undefined,
  };
  const dialer = new Dialer({
    resolver: new HostResolver(cache),
    connectTimeoutMs: config.proxyConnectTimeoutMs,
    host,
    onDial: (seconds) => metrics.proxyDialDuration.observe(seconds),
  });
  const tunnels = new TunnelRegistry(table, (sandbox, target) =>
    dialer.check(sandbox, target, target.ip),
  );
  metrics.countTunnelsWith(
    () => tunnels.size,
    () => tunnels.countsBySandbox(),
  );
  // Whatever started is stopped again if a later step fails (a port in use, a damaged store),
  // so a failed start leaves no listener open and no store lock held.
  const undo: Array<() => Promise<unknown>> = [];
  watch?.start();
  undo.push(async () => watch?.stop());
  try {
    await mkdir(config.dataDir, { recursive: true, mode: 0o700 });
    if (config.flowLog !== undefined) {
      const sink = await FlowFileSink.open(
        config.flowLog,
        config.flowLogMaxBytes,
        () => metrics.flowRecordsDropped.inc({ where: 'file' }),
        warnEvery(logger, 'flow log write failed', 10_000, wallNow),
      );
      flows.sink = sink;
      undo.push(() => sink.close());
    }
    const store = await openStore(config, logger, metrics);
    undo.push(() => store.close());
    const nodeID = store instanceof RedisStore ? await nodeIdentity(config) : undefined;
    if (nodeID !== undefined) flows.node = nodeID;
    // Set once the API listens (other nodes need its address); until then only this node is known.
    let cluster: Cluster | undefined;
    const apiKeys = await loadApiKeys(config.apiKeys, config.dataDir);
    const secretsKey = await loadSecretsKey(config.secretsKeyFile, config.dataDir);
    const secrets = new SecretVault({
      store,
      key: secretsKey,
      now: wallNow,
      onChange: () =>
        void cluster
          ?.announceSecretsChange()
          .catch((error: Error) =>
            logger.warn({ err: error.message }, 'announcing a secrets change failed'),
          ),
    });
    const proxyOptions = {
      table,
      dialer,
      tunnels,
      metrics,
      logger,
      flows,
      checkServerName: config.proxyCheckServerName,
      maxTunnelsPerSandbox: config.proxyMaxTunnels,
      sourceIsProof: network !== undefined,
      handshakeTimeoutMs: config.proxyHandshakeTimeoutMs,
      idleTimeoutMs: config.proxyIdleTimeoutMs,
      transparentPorts: options.transparentPorts,
      tcpIo: config.proxyIo,
      // Secretless egress: where a sandbox's rule names a destination, its TLS is terminated
      // with a leaf of Moat's CA and each request gets the rule's headers.
      injection: {
        transformFor: (sandboxID: string, name: CanonicalName) => {
          const sandbox = table.get(sandboxID);
          return sandbox === undefined ? undefined : headerTransformFor(sandbox.policy, name);
        },
        leafContext: (name: CanonicalName) => ca.secureContextFor(name),
        secretValue: (name: string) => secrets.value(name),
        secretValues: () => secrets.values(),
      },
      upstreamCa:
        config.upstreamCa === undefined ? undefined : await readFile(config.upstreamCa, 'utf8'),
      redactSecretsInResponses: config.redactSecretsInResponses,
    };
    const proxy = new EgressProxy(proxyOptions);
    metrics.countClientConnectionsWith(() => proxy.openConnections);
    // Namespaced sandboxes' web traffic always has a transparent listener on the gateway.
    const transparent =
      config.transparentListen || network ? new TransparentProxy(proxyOptions) : undefined;
    listening.dns = { ...config.dnsListen, port: await dns.start() };
    undo.push(() => dns.stop());
    listening.proxy = {
      ...config.proxyListen,
      port: await bindListener('egress proxy listener', config.proxyListen, () =>
        proxy.listen(config.proxyListen),
      ),
    };
    undo.push(() => proxy.close(0));
    if (transparent && config.transparentListen) {
      const at = config.transparentListen;
      listening.transparent = {
        ...at,
        port: await bindListener('transparent listener', at, () => transparent.listen(at)),
      };
      undo.push(() => transparent.close());
    }
    if (network) {
      undo.push(() => network.stop(removeHostRuleset(network.hostTable)));
      kernel = await startGateway(network, {
        config,
        logger,
        listening,
        table,
        internal,
        metrics,
        now,
        dns,
        proxy,
        transparent: transparent!,
        dialer,
      });
    }
    const runtime = await ProcessRuntime.start(config.dataDir, {
      network,
      proxyOnlyReason,
      allowUnconfined: config.unconfinedSandboxes,
      ids: config.sandboxIds,
      defaultDiskMB: config.sandboxDiskMB,
      trustedCaPem: ca.certificatePem,
    });
    undo.push(() => runtime.stop());
    const sources = network
      ? new AddressPool(config.namespacePool, { block: 4 })
      : new AddressPool(config.sourcePool);
    const sandboxes = new SandboxService({
      store,
      runtime,
      table,
      sources,
      kernel,
      cluster:
        nodeID === undefined
          ? undefined
          : {
              self: nodeID,
              alive: (node) => node === nodeID || (cluster?.alive(node) ?? false),
              announce: (change) => cluster!.announce(change),
            },
      internal,
      metrics,
      logger,
      maxPolicyEntries: config.maxPolicyEntries,
      secretExists: (name) => secrets.exists(name),
      namespace: config.namespace,
      now: wallNow,
      environment: (record) =>
        sandboxEnvironment(
          record,
          listening.gateway?.proxy ?? listening.proxy,
          runtime.trustEnvironment,
        ),
      defaultLimits: {
        cpuCount: config.sandboxCpus,
        memoryMB: config.sandboxMemoryMB,
        diskSizeMB: config.sandboxDiskMB,
        pids: config.sandboxPids,
      },
    });
    const guard = runtime.enforcement === 'proxy' ? guardListeners(runtime) : undefined;
    if (guard) {
      // Configured ports now (restored sandboxes run from the next line on), the real ones below.
      await guard.update([config.apiListen, config.sandboxListen, config.metricsListen]);
      undo.push(() => guard.remove());
    }
    // Listeners are up first (their ports go into sandbox environments); until start() has
    // restored the stored sandboxes, the table is empty and every packet is refused.
    await sandboxes.start();
    undo.push(() => sandboxes.stop());
    const api = createPlatformApi({
      service: sandboxes,
      flows: flows.store,
      peers: () => cluster?.nodes().flatMap((node) => (node.id === nodeID ? [] : [node.api])) ?? [],
      secrets,
      egress: {
        // What the sandbox itself uses: inside a namespace, the gateway.
        get proxy() {
          return listening.gateway?.proxy ?? listening.proxy;
        },
        get dns() {
          return listening.gateway?.dns ?? listening.dns;
        },
        enforcement: runtime.enforcement,
        confinement: runtime.confined ? 'confined' : 'unconfined',
      },
      keys: apiKeys.keys,
      caCertificatePem: ca.certificatePem,
      metrics,
      logger,
      metricsRequireKey: config.metricsRequireKey,
      version: VERSION,
      notReady: () =>
        notReady(store, () => {
          const { dns, proxy, transparent, sandbox, metrics, gateway } = listening;
          const named: Array<[string, HostPort | undefined]> = [
            ['DNS listener tcp', dns],
            ['egress proxy listener', proxy],
            ['transparent listener', transparent],
            ['sandbox API listener', sandbox],
            ['metrics listener', metrics],
            ['gateway DNS listener tcp', gateway?.dns],
            ['gateway egress proxy listener', gateway?.proxy],
            ['gateway transparent listener', gateway?.transparent],
          ];
          return named.flatMap(([name, at]) => (at === undefined ? [] : [[name, at] as const]));
        }),
      routing: nodeID === undefined ? undefined : routingFor(nodeID, () => cluster!, sandboxes),
    });
    listening.api = await bindListener('platform API listener', config.apiListen, () =>
      listenApi(api, config.apiListen),
    );
    undo.push(() => api.close());
    const { gateway, ingress } = createSandboxGateway({
      sandboxes,
      runtime,
      logger,
      flows,
      connectTimeoutMs: config.proxyConnectTimeoutMs,
      idleTimeoutMs: config.proxyIdleTimeoutMs,
      moatPorts: () => new Set(ownListeners(listening).map((at) => at.port)),
      elsewhere: async (sandboxID) => {
        if (cluster === undefined || !SANDBOX_ID.test(sandboxID)) return undefined;
        const node = await sandboxes.nodeOf(sandboxID).catch(() => undefined);
        if (node === undefined || node === nodeID) return undefined;
        return (await cluster.locate(node).catch(() => undefined))?.sandbox;
      },
    });
    listening.sandbox = {
      ...config.sandboxListen,
      port: await bindListener('sandbox API listener', config.sandboxListen, () =>
        gateway.listen(config.sandboxListen),
      ),
    };
    undo.push(async () => {
      await gateway.close();
      ingress.close();
    });
    if (store instanceof RedisStore && nodeID !== undefined) {
      cluster = await joinCluster(store, nodeID, {
        config,
        logger,
        metrics,
        listening,
        sandboxes,
        secrets,
      });
      const joined = cluster;
      undo.push(() => joined.stop());
      // Records of nodes that died before this one started (only now is the view complete).
      await sandboxes.forgetGoneNodes();
    }
    const metricsAt = config.metricsListen;
    const metricsListener = metricsAt
      ? await bindListener('metrics listener', metricsAt, () =>
          listenMetrics(metrics.registry, metricsAt),
        )
      : undefined;
    if (metricsListener && config.metricsListen) {
      listening.metrics = { ...config.metricsListen, port: metricsListener.port };
      undo.push(() => metricsListener.close());
    }
    await guard?.update([listening.api, listening.sandbox, listening.metrics]);
    checkHostPorts(config, listening);
    return {
      config,
      table,
      metrics,
      internal,
      tunnels,
      flows,
      proxy,
      dns,
      sources,
      store,
      runtime,
      network,
      sandboxes,
      apiKeys,
      secrets,
      secretsKeySource: secretsKey.source,
      ca,
      cluster,
      listening,
      async stop(drainMs = 0) {
        await metricsListener?.close();
        await cluster?.stop();
        await api.close();
        // Upgraded and refused sockets are the ingress's: the gateway's close waits for them.
        ingress.close();
        await gateway.close();
        await sandboxes.stop();
        await runtime.stop();
        await guard?.remove();
        if (network) await network.stop(removeHostRuleset(network.hostTable));
        await proxy.close(drainMs);
        await transparent?.close();
        await dns.stop();
        // What was recorded up to here reaches the flow log.
        await flows.sink?.close();
        await store.close();
        watch?.stop();
      },
    };
  } catch (error) {
    for (const step of undo.reverse()) await step().catch(() => undefined);
    throw error;
  }
}

interface GatewayParts {
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
}

/** Web ports go to the transparent listener, which ends what a new policy denies by name itself. */
const TRANSPARENT_PORTS = new Set([80, 443]);

/**
 * Readies the host for namespaced sandboxes: leftovers of an earlier run removed, the gateway
 * address up, Moat's DNS, proxy and transparent listeners on it, and the host's side of the
 * firewall. Returns the enforcer that writes each sandbox's firewall.
 */
async function startGateway(
  network: NamespaceNetwork,
  parts: GatewayParts,
): Promise<KernelEnforcer> {
  const { config, logger, listening, metrics } = parts;
  for (const name of await network.prepare()) {
    logger.warn({ namespace: name }, 'removed a network namespace an earlier run left');
  }
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
    },
    {
      table: parts.table,
      apply: (sandboxID, commands) => network.firewall(sandboxID, commands),
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
      endDenied: async (sandboxID) => {
        const sandbox = parts.table.get(sandboxID);
        // With an upstream proxy every TCP connection goes through Moat, which ends them itself.
        if (sandbox === undefined || sandbox.upstream !== undefined) return;
        try {
          const ended = await network.endConnections(sandboxID, (address, port) => {
            const ip = parseIP(address);
            if (!ip.ok || TRANSPARENT_PORTS.has(port)) return false;
            return parts.dialer.check(sandbox, { ip: ip.value, port }, ip.value).verdict === 'deny';
          });
          if (ended > 0)
            logger.info(
              { sandboxID, connections: ended },
              'open connections the new policy denies ended',
            );
        } catch (error) {
          // Their packets are stopped all the same; the sockets learn at their next send.
          logger.warn(
            { sandboxID, err: (error as Error).message },
            'ending denied connections failed',
          );
        }
      },
      onApplied: (change, ok, seconds) => {
        metrics.kernelApplies.inc({ change, result: ok ? 'applied' : 'failed' });
        if (ok) metrics.kernelApplyDuration.observe({ change }, seconds);
      },
    },
  );
  await kernel.installHost();
  return kernel;
}

async function openStore(config: MoatConfig, logger: Logger, metrics: MoatMetrics): Promise<Store> {
  if (config.store === 'file') {
    return FileStore.open(path.join(config.dataDir, 'store'), {
      onWarning: (message) => logger.warn({ store: config.dataDir }, message),
      onSync: (seconds) => metrics.storeSyncDuration.observe(seconds),
    });
  }
  return RedisStore.open(config.store, {
    prefix: config.storePrefix,
    onError: (error) => {
      metrics.storeErrors.inc();
      logger.error({ err: error.message }, 'store connection lost; enforcing the last policies');
    },
  });
}

/** --node-id, or the name this data folder has kept since its first start. */
async function nodeIdentity(config: MoatConfig): Promise<string> {
  if (config.nodeID !== 'auto') return config.nodeID;
  const file = path.join(config.dataDir, 'node-id');
  const kept = (await readFile(file, 'utf8').catch(() => '')).trim();
  if (isNodeID(kept)) return kept;
  const made = `${os
    .hostname()
    .toLowerCase()
    .replace(/[^a-z0-9-]/g, '-')
    .slice(0, 40)}-${randomBytes(4).toString('hex')}`.replace(/^-+/, 'n');
  await writeFile(file, `${made}\n`, { mode: 0o600 });
  return made;
}

/** Requests for sandboxes hosted elsewhere go to their node; new sandboxes to the emptiest. */
function routingFor(self: string, cluster: () => Cluster, sandboxes: SandboxService): ApiRouting {
  return {
    self,
    async ownerOf(sandboxID) {
      const node = await sandboxes.nodeOf(sandboxID);
      if (node === self) return undefined;
      const info = await cluster()
        .locate(node)
        .catch((error: Error) => {
          throw new SandboxError(503, `cannot find the node ${node}: ${error.message}`);
        });
      // Its heartbeat lapsed a moment ago: the sandbox is gone with it.
      if (info === undefined)
        throw new SandboxError(
          404,
          `Sandbox "${sandboxID}" doesn't exist or you don't have access to it`,
        );
      return info.api;
    },
    async placement(templateID) {
      // A snapshot's files are on the node that took it; anything else goes to the emptiest.
      const holder = await sandboxes.templateNode(templateID);
      if (holder !== undefined) {
        if (holder === self) return undefined;
        const info = await cluster().locate(holder);
        if (info === undefined)
          throw new SandboxError(
            503,
            `template "${templateID}" is on node ${holder}, which is not running`,
          );
        return info.api;
      }
      const target = cluster().place();
      if (target === undefined) throw new SandboxError(503, 'no live node hosts sandboxes');
      return target.id === self ? undefined : target.api;
    },
  };
}

interface ClusterParts {
  readonly config: MoatConfig;
  readonly logger: Logger;
  readonly metrics: MoatMetrics;
  readonly listening: Listening;
  readonly sandboxes: SandboxService;
  readonly secrets: SecretVault;
}

/** Announces this node and acts on what the others announce. */
async function joinCluster(store: RedisStore, self: string, parts: ClusterParts): Promise<Cluster> {
  const { config, logger, metrics, listening, sandboxes, secrets } = parts;
  const reload = new RetryingTask(
    async () => {
      await sandboxes.reloadAll();
      logger.info('store connection back; enforcing what it holds again');
    },
    (error) => logger.warn({ err: error.message }, 'reloading from the store failed; trying again'),
  );
  const cluster = new Cluster({
    client: store.client,
    prefix: config.storePrefix,
    self: {
      id: self,
      api: formatHostPort(config.advertiseApi ?? listening.api),
      // Relayed sandbox API and ingress requests come here.
      sandbox: listening.sandbox,
      proxy: formatHostPort(listening.proxy),
      hostsSandboxes: config.hostsSandboxes,
    },
    ttlMs: config.nodeTtlMs,
    sandboxCount: () => sandboxes.hostedCount,
    onPolicyChange: (change) => {
      void sandboxes.reload(change.sandboxID).then(
        (applied) => {
          if (applied)
            metrics.policyPropagation.observe(Math.max(0, Date.now() - change.sentAt) / 1000);
        },
        (error: Error) =>
          logger.error(
            { sandboxID: change.sandboxID, err: error.message },
            'network change not applied',
          ),
      );
    },
    onSecretsChange: () => secrets.invalidate(),
    onReconnect: () => {
      // Secrets changed while the channel was down went unannounced.
      secrets.invalidate();
      reload.request();
    },
    onNodesGone: (ids) => {
      logger.warn({ nodes: ids }, 'nodes stopped sending heartbeats; their sandboxes are gone');
      void sandboxes
        .forgetGoneNodes()
        .catch((error: Error) =>
          logger.error({ err: error.message }, 'removing the sandboxes of gone nodes failed'),
        );
    },
    onError: (error) => logger.warn({ err: error.message }, 'cluster channel'),
  });
  await cluster.start();
  metrics.countNodesWith(() => cluster.nodes().length);
  return cluster;
}

/**
 * Runs `work` on request, one run at a time; a request during a run makes one more run after it,
 * and a failed run is tried again every 500 ms until one succeeds (reported once per streak).
 */
class RetryingTask {
  private running = false;
  private again = false;

  constructor(
    private readonly work: () => Promise<void>,
    private readonly onFailure: (error: Error) => void,
  ) {}

  request(): void {
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = true;
    void this.run();
  }

  private async run(): Promise<void> {
    let failures = 0;
    for (;;) {
      this.again = false;
      try {
        await this.work();
        failures = 0;
        if (!this.again) break;
      } catch (error) {
        // Said once per streak: the store may take a while to come back.
        if (failures++ === 0) this.onFailure(error as Error);
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
    this.running = false;
  }
}
