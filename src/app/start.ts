/**
 * The composition root: builds every part in dependency order (listeners bound before the parts
 * that hand out their ports), gives each what it needs, and registers each start's stop on one
 * lifecycle stack. Domain logic lives in the parts; what is here is wiring.
 */
import { mkdir, readFile } from 'node:fs/promises';
import os from 'node:os';
import type { Logger } from 'pino';
import { type ApiKeys, createPlatformApi, listenApi, loadApiKeys } from '../api/index.js';
import { Cluster } from '../cluster/index.js';
import type { MoatConfig } from '../config.js';
import type { HostPort } from '../net/index.js';
import {
  AnswerCache,
  DnsInterceptor,
  HostResolver,
  MAX_TCP_CONNECTIONS_PER_SOURCE,
  UpstreamClient,
} from '../dns/index.js';
import { FlowFileSink, FlowRecorder, FlowStore } from '../flows/index.js';
import { MoatCa } from '../intercept-ca/index.js';
import {
  AddressPool,
  ConnectionBudget,
  EnforcementTable,
  HOST_REFRESH_MS,
  HostWatch,
  KernelEnforcer,
  removeHostRuleset,
} from '../enforce/index.js';
import { listenMetrics, MoatMetrics } from '../metrics/index.js';
import {
  type CanonicalName,
  compileInternalDenyList,
  destinationRulesFor,
  type HostAddresses,
  type InternalDenyList,
} from '../policy/index.js';
import {
  Dialer,
  EgressProxy,
  FairShare,
  TransparentProxy,
  TunnelRegistry,
} from '../proxy/index.js';
import { NamespaceNetwork, ProcessRuntime, type SandboxRuntime } from '../runtime/index.js';
import { SandboxService, sandboxEnvironment } from '../sandbox/index.js';
import { RedisStore, type Store } from '../store/index.js';
import { loadSecretsKey, SecretVault } from '../secrets/index.js';
import { IdentityIssuer } from '../identity/index.js';
import { joinCluster, routingFor, sandboxListenerOf } from './cluster-node.js';
import { Lifecycle } from './lifecycle.js';
import {
  bindListener,
  checkHostPorts,
  guardListeners,
  type Listening,
  ownListeners,
} from './listeners.js';
import { chooseNetwork, startNamespaceGateway } from './namespace-gateway.js';
import { watchKernelBudgets } from './kernel-budgets.js';
import { createSandboxListener } from './sandbox-listener.js';
import { nodeIdentity, openStore } from './store.js';
import { openFileLimit, openFileWarning, sandboxConnectionShare } from './open-files.js';
import { notReady } from './readiness.js';
import { watchAdoptedNamespaces } from './adopted-namespaces.js';
import { loadPresets } from '../config-presets.js';
import { VERSION } from '../process/index.js';
import { warnEvery } from '../log/index.js';

export interface RunningMoat {
  readonly config: MoatConfig;
  readonly table: EnforcementTable;
  readonly metrics: MoatMetrics;
  readonly internal: InternalDenyList;
  readonly tunnels: TunnelRegistry;
  /** Connections sandboxes hold open on Moat's listeners, each charged to its sandbox. */
  readonly connections: ConnectionBudget;
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

/** The workload identity issuer the configuration names; undefined when identity is off. */
function identityIssuer(config: MoatConfig, now: () => number): IdentityIssuer | undefined {
  const issuer = config.identityIssuer;
  if (issuer === undefined) return undefined;
  return new IdentityIssuer({
    issuer,
    trustDomain: config.identityTrustDomain ?? new URL(issuer).hostname,
    team: config.teamNamespace,
    dataDir: config.dataDir,
    now,
  });
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
  const presets = loadPresets(config.presetsDir);
  if (!presets.ok) throw new Error(presets.error);
  const table = new EnforcementTable({ now });
  const fileLimit = await openFileLimit();
  const fileWarning = openFileWarning(fileLimit, config.fdReserve, config.proxyMaxTunnels);
  if (fileWarning !== undefined) logger.warn({ limit: fileLimit }, fileWarning);
  const connections = new ConnectionBudget({
    table,
    perSandbox: config.proxyMaxTunnels,
    perListener: { dns_tcp: MAX_TCP_CONNECTIONS_PER_SOURCE },
    total: sandboxConnectionShare(fileLimit, config.fdReserve),
    now,
    refused: (refusal) => {
      metrics.budgetRefusals.inc({ resource: refusal.resource });
      if (refusal.log === 0) return;
      const { sandboxID, source, listener, resource, held, max, log } = refusal;
      logger.warn(
        { sandboxID, source, listener, resource, held, max, refusals: log },
        'connection refused: over budget',
      );
    },
  });
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
    connections,
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
  const lifecycle = new Lifecycle();
  watch?.start();
  lifecycle.started(() => watch?.stop());
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
      // Below every recorder on the stack: what they recorded up to their stop reaches the file.
      lifecycle.started(() => sink.close());
    }
    const store = await openStore(config, logger, metrics);
    lifecycle.started(() => store.close());
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
    // Workload identity, when the operator named an issuer: tokens minted per request for the
    // names a sandbox's iam defines, the subject read from its record on a cache miss.
    const identity = identityIssuer(config, wallNow);
    if (identity !== undefined)
      table.subscribe((event) => {
        if (event.type === 'removed') identity.forget(event.sandboxID);
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
      fairShare: new FairShare(
        {
          requestsPerSecond: config.proxyRequestsPerSecond,
          leafMintsWaiting: config.leafMintsWaiting,
        },
        { table, metrics, logger },
      ),
      connections,
      sourceIsProof: network !== undefined,
      handshakeTimeoutMs: config.proxyHandshakeTimeoutMs,
      firstByteTimeoutMs: config.proxyFirstByteTimeoutMs,
      keepAliveTimeoutMs: config.proxyKeepAliveTimeoutMs,
      idleTimeoutMs: config.proxyIdleTimeoutMs,
      transparentPorts: options.transparentPorts,
      tcpIo: config.proxyIo,
      // Secretless egress: where a sandbox's rule names a destination, its TLS is terminated
      // with a leaf of Moat's CA and each request gets the rule's headers.
      injection: {
        transformFor: (sandboxID: string, name: CanonicalName) => {
          const sandbox = table.get(sandboxID);
          return sandbox === undefined ? undefined : destinationRulesFor(sandbox.policy, name);
        },
        leafContext: (name: CanonicalName) => ca.secureContextFor(name),
        secretValue: (name: string) => secrets.value(name),
        secretValues: () => secrets.values(),
        ...(identity === undefined
          ? {}
          : {
              identityToken: (sandboxID: string, name: string) =>
                identity.token(sandboxID, name, async () => {
                  const record = await sandboxes.find(sandboxID);
                  const tokens = record?.iam?.tokens;
                  if (record === undefined || tokens === undefined || !Object.hasOwn(tokens, name))
                    return undefined;
                  return {
                    sandboxID,
                    templateID: record.templateID,
                    audience: tokens[name]!.audience,
                  };
                }),
            }),
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
    lifecycle.started(() => dns.stop());
    // Below the egress proxy on the stack, whichever addresses it listens on (here, and on the
    // namespace gateway): on the way down the proxy stops first, and its close (after its drain)
    // ends every registered tunnel, the transparent listener's too.
    if (transparent) lifecycle.started(() => transparent.close());
    if (transparent && config.transparentListen) {
      const at = config.transparentListen;
      listening.transparent = {
        ...at,
        port: await bindListener('transparent listener', at, () => transparent.listen(at)),
      };
    }
    listening.proxy = {
      ...config.proxyListen,
      port: await bindListener('egress proxy listener', config.proxyListen, () =>
        proxy.listen(config.proxyListen),
      ),
    };
    lifecycle.started((drainMs) => proxy.close(drainMs));
    if (network) {
      lifecycle.started(() => network.stop(removeHostRuleset(network.hostTable)));
      kernel = await startNamespaceGateway(network, {
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
        flows,
      });
      const budgets = watchKernelBudgets(network, kernel, { logger, metrics });
      lifecycle.started(() => budgets.stop());
    }
    const runtime = await ProcessRuntime.start(config.dataDir, {
      network,
      proxyOnlyReason,
      allowUnconfined: config.unconfinedSandboxes,
      ids: config.sandboxIds,
      defaultDiskMB: config.sandboxDiskMB,
      trustedCaPem: ca.certificatePem,
      kernelBudgets: {
        inotifyInstances: config.sandboxInotifyInstances,
        inotifyWatches: config.sandboxInotifyWatches,
        ptys: config.sandboxPtys,
      },
      roleDeadline: {
        ms: config.sandboxAgentDeadlineMs,
        onMissed: (sandboxID, role, user) => {
          metrics.budgetRefusals.inc({ resource: 'agent_deadline' });
          logger.warn(
            { sandboxID, role, user, deadlineMs: config.sandboxAgentDeadlineMs },
            `a sandbox's ${role} made no progress within its deadline; it was ended and its calls failed`,
          );
        },
      },
    });
    // The listener guard goes only once no sandbox process runs: with the runtime.
    const guard = runtime.enforcement === 'proxy' ? guardListeners(runtime) : undefined;
    lifecycle.started(async () => {
      await runtime.stop();
      await guard?.remove();
    });
    const sources = network
      ? new AddressPool(config.namespacePool, { block: 4 })
      : new AddressPool(config.sourcePool);
    const sandboxes = new SandboxService({
      store,
      runtime,
      table,
      sources,
      kernel,
      bandwidthDefaults: {
        egressMbps: config.sandboxEgressMbps,
        ingressMbps: config.sandboxIngressMbps,
      },
      defaultMode: config.defaultNetworkMode,
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
      presets: presets.value,
      secretExists: (name) => secrets.exists(name),
      identity: identity !== undefined,
      teamNamespace: config.teamNamespace,
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
    // Configured ports now (restored sandboxes run from the next line on), the real ones below.
    await guard?.update([config.apiListen, config.sandboxListen, config.metricsListen]);
    // Listeners are up first (their ports go into sandbox environments); until start() has
    // restored the stored sandboxes, the table is empty and every packet is refused.
    await sandboxes.start();
    lifecycle.started(() => sandboxes.stop());
    if (network) {
      const losses = watchAdoptedNamespaces(sandboxes, logger);
      lifecycle.started(() => losses.stop());
    }
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
        get gateway() {
          return listening.gateway?.dns.host;
        },
        enforcement: runtime.enforcement,
        confinement: runtime.confined ? 'confined' : 'unconfined',
        bandwidthDefaults: {
          egressMbps: config.sandboxEgressMbps,
          ingressMbps: config.sandboxIngressMbps,
        },
      },
      keys: apiKeys.keys,
      caCertificatePem: ca.certificatePem,
      internalDeny: internal.ranges,
      ...(identity === undefined ? {} : { identity }),
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
    lifecycle.started(() => api.close());
    const { router, ingress } = createSandboxListener({
      sandboxes,
      runtime,
      logger,
      connections,
      flows,
      connectTimeoutMs: config.proxyConnectTimeoutMs,
      idleTimeoutMs: config.proxyIdleTimeoutMs,
      moatPorts: () => new Set(ownListeners(listening).map((at) => at.port)),
      elsewhere:
        nodeID === undefined ? undefined : sandboxListenerOf(nodeID, () => cluster, sandboxes),
    });
    listening.sandbox = {
      ...config.sandboxListen,
      port: await bindListener('sandbox API listener', config.sandboxListen, () =>
        router.listen(config.sandboxListen),
      ),
    };
    lifecycle.started(async () => {
      // Upgraded and refused sockets are the ingress's: the listener's close waits for them.
      ingress.close();
      await router.close();
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
      lifecycle.started(() => joined.stop());
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
      lifecycle.started(() => metricsListener.close());
    }
    await guard?.update([listening.api, listening.sandbox, listening.metrics]);
    checkHostPorts(config, listening);
    return {
      config,
      table,
      metrics,
      internal,
      tunnels,
      connections,
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
      stop: (drainMs = 0) => lifecycle.stop(drainMs),
    };
  } catch (error) {
    await lifecycle.stop().catch(() => undefined);
    throw error;
  }
}
