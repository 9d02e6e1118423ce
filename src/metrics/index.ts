/**
 * Every Prometheus metric Moat exports, defined in one place on one registry per server.
 * Labels are bounded sets; nothing is labelled by sandbox ID or destination.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';
import type { HostPort } from '../net/index.js';

export type DnsVerdict = 'forwarded' | 'blocked' | 'refused' | 'formerr' | 'servfail' | 'dropped';

export type ProxyKind = 'connect' | 'forward' | 'transparent';
export type InjectionOutcome =
  | 'injected'
  | 'missing_secret'
  | 'store_error'
  | 'upstream_refused'
  | 'fronting'
  | 'leak'
  | 'upgrade_refused'
  | 'identity_error';
export type ProxyVerdict =
  'allowed' | 'denied' | 'unauthenticated' | 'invalid' | 'failed' | 'limited';

/**
 * A resource shared by every sandbox on the host, each with a per-sandbox budget
 * (docs/sandbox-isolation.md has the table): connections held open on one of Moat's
 * listeners, connections that sent no first byte or sat idle too long, Moat's own file
 * descriptors, new connections a second and tracked connections (the kernel's), calls to a
 * sandbox's file agent or launcher past their deadline, and the costly work of Moat's one
 * event loop (leaf certificates minted, requests proxied).
 */
export type BudgetResource =
  | 'proxy_connections'
  | 'transparent_connections'
  | 'dns_tcp_connections'
  | 'ingress_connections'
  | 'first_byte_deadline'
  | 'idle_deadline'
  | 'file_descriptors'
  | 'new_connections'
  | 'tracked_connections'
  | 'agent_deadline'
  | 'leaf_mints'
  | 'proxied_requests';

const MISNAMED_DEFAULT_GAUGES = [
  'nodejs_active_handles_total',
  'nodejs_active_requests_total',
  'nodejs_active_resources_total',
];

/**
 * One label set of a counter, for paths that count every DNS query: adding to `count` costs
 * what adding to a number does (prom-client hashes the labels on every labelled `inc`), and a
 * scrape adds what was counted since the last one to the counter.
 */
export interface HotCount {
  count: number;
}

interface HotCell<L extends string> extends HotCount {
  readonly labels: Partial<Record<L, string>>;
  published: number;
}

export class MoatMetrics {
  readonly registry = new Registry();
  private learnedCount: () => number = () => 0;
  private readonly hotCells = new Map<Counter<string>, HotCell<string>[]>();

  readonly dnsQueries: Counter<'transport' | 'verdict'> = new Counter({
    name: 'moat_dns_queries_total',
    help: 'DNS queries answered by the interceptor, by transport and verdict',
    labelNames: ['transport', 'verdict'] as const,
    registers: [this.registry],
    collect: (): void => this.publishHotCounts(this.dnsQueries),
  });

  readonly dnsCacheLookups: Counter<'result'> = new Counter({
    name: 'moat_dns_cache_lookups_total',
    help: 'Answer cache lookups, by result (hit or miss)',
    labelNames: ['result'] as const,
    registers: [this.registry],
    collect: (): void => this.publishHotCounts(this.dnsCacheLookups),
  });

  readonly dnsUpstreamDuration = new Histogram({
    name: 'moat_dns_upstream_duration_seconds',
    help: 'Time an upstream resolver took to answer',
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2],
    registers: [this.registry],
  });

  readonly dnsLearnedAddresses: Gauge = new Gauge({
    name: 'moat_dns_learned_addresses',
    help: 'Addresses learned from DNS answers and currently allowed, over all sandboxes',
    registers: [this.registry],
    collect: (): void => this.dnsLearnedAddresses.set(this.learnedCount()),
  });

  readonly proxyConnections = new Counter({
    name: 'moat_proxy_connections_total',
    help: 'Egress proxy connections and forwarded requests, by kind and verdict',
    labelNames: ['kind', 'verdict'] as const,
    registers: [this.registry],
  });

  readonly proxyDenials = new Counter({
    name: 'moat_proxy_denials_total',
    help: 'Egress proxy denials, by kind and the list of the deciding rule',
    labelNames: ['kind', 'list'] as const,
    registers: [this.registry],
  });

  readonly proxyBytes = new Counter({
    name: 'moat_proxy_bytes_total',
    help: 'Bytes carried by the egress proxy, up (sandbox to destination) and down',
    labelNames: ['direction'] as const,
    registers: [this.registry],
  });

  readonly flows: Counter<'kind' | 'verdict' | 'direction'> = new Counter({
    name: 'moat_flows_total',
    help: 'Flow records (decisions and closes of allowed connections), by kind and verdict',
    labelNames: ['kind', 'verdict'] as const,
    registers: [this.registry],
    collect: (): void => this.publishHotCounts(this.flows),
  });

  readonly flowsWouldDeny = new Counter({
    name: 'moat_flows_would_deny_total',
    help: "Decisions a report-mode sandbox's rules would have denied (let through), by kind and list",
    labelNames: ['kind', 'list'] as const,
    registers: [this.registry],
  });

  readonly flowBytes: Counter<'kind' | 'verdict' | 'direction'> = new Counter({
    name: 'moat_flow_bytes_total',
    help: 'Bytes of closed flows, by kind and direction (up: sandbox to destination)',
    labelNames: ['kind', 'direction'] as const,
    registers: [this.registry],
    collect: (): void => this.publishHotCounts(this.flowBytes),
  });

  readonly flowRecordsDropped = new Counter({
    name: 'moat_flow_records_dropped_total',
    help: 'Flow records dropped: pushed out of the flow store by its bound (store), not sent to a follower too slow to read them (follower), or not written to the flow log file (file)',
    labelNames: ['where'] as const,
    registers: [this.registry],
  });

  readonly secretInjections: Counter<'outcome'> = new Counter({
    name: 'moat_secret_injections_total',
    help: "Requests on intercepted TLS connections, by outcome: injected (the rule's headers set and sent), missing_secret (a secret the rule names is not stored: 502), store_error (the stored secrets could not be read: 502), upstream_refused (the origin failed TLS verification: 502), fronting (Host is not the TLS name: refused), leak (a request Moat read carried a stored secret to a destination not bound to it: 403), upgrade_refused (an upgrade other than WebSocket, or a 101 not matching the handshake), identity_error (a workload identity token the rule names could not be minted: 502)",
    labelNames: ['outcome'] as const,
    registers: [this.registry],
    collect: (): void => this.publishHotCounts(this.secretInjections),
  });

  /** Inc with `{resource}` where a sandbox is refused for being over one of its budgets. */
  readonly budgetRefusals: Counter<'resource'> = new Counter({
    name: 'moat_budget_refusals_total',
    help: 'Times a sandbox was refused for being over its budget of a shared resource, by resource (docs/sandbox-isolation.md lists them)',
    labelNames: ['resource'] as const,
    registers: [this.registry],
  });

  readonly proxyDialDuration = new Histogram({
    name: 'moat_proxy_dial_duration_seconds',
    help: 'Time to connect to a destination',
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [this.registry],
  });

  readonly proxyActiveTunnels: Gauge = new Gauge({
    name: 'moat_proxy_active_tunnels',
    help: 'Open tunnels and in-flight forwarded requests, over all sandboxes',
    registers: [this.registry],
    collect: (): void => this.proxyActiveTunnels.set(this.tunnelCount()),
  });

  private tunnelCount: () => number = () => 0;

  readonly proxyClientConnections: Gauge = new Gauge({
    name: 'moat_proxy_client_connections',
    help: 'Client connections open on the explicit proxy listener (tunnels, keep-alive, closing)',
    registers: [this.registry],
    collect: (): void => this.proxyClientConnections.set(this.clientConnectionCount()),
  });

  private clientConnectionCount: () => number = () => 0;

  /**
   * Opt-in (`--metrics-per-sandbox`): one series per sandbox with open connections. Off by
   * default, since its cardinality follows the number of sandboxes.
   */
  readonly proxySandboxActiveTunnels: Gauge<'sandbox_id'> | undefined;

  private tunnelsBySandbox: () => Iterable<[string, number]> = () => [];

  readonly sandboxes: Gauge<'state'> = new Gauge({
    name: 'moat_sandboxes',
    help: 'Sandboxes this Moat holds, by state (running or paused)',
    labelNames: ['state'] as const,
    registers: [this.registry],
    collect: (): void => {
      for (const [state, count] of Object.entries(this.sandboxCount())) {
        this.sandboxes.set({ state }, count);
      }
    },
  });

  private sandboxCount: () => Record<string, number> = () => ({ running: 0, paused: 0 });

  readonly sandboxTransitions = new Counter({
    name: 'moat_sandbox_transitions_total',
    help: 'Sandbox lifecycle transitions (create, fork, pause, autoPause, resume, connect, timeout, refresh, network, snapshot, kill, expire, autoResume)',
    labelNames: ['transition'] as const,
    registers: [this.registry],
  });

  readonly policyPublishes = new Counter({
    name: 'moat_policy_publishes_total',
    help: 'Network config changes by result: applied, invalid (400) or failed (not stored, old policy kept; or stored but the kernel firewall refused it)',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });

  readonly kernelApplies = new Counter({
    name: 'moat_kernel_applies_total',
    help: "Changes written to namespaced sandboxes' nftables firewalls, by change (install, policy, learned) and result (applied, failed)",
    labelNames: ['change', 'result'] as const,
    registers: [this.registry],
  });

  readonly kernelApplyDuration = new Histogram({
    name: 'moat_kernel_apply_duration_seconds',
    help: "Time to write one change into a sandbox's nftables firewall, by change",
    labelNames: ['change'] as const,
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
    registers: [this.registry],
  });

  readonly apiRequestDuration = new Histogram({
    name: 'moat_api_request_duration_seconds',
    help: 'Platform API requests: time to answer, by method, route pattern and status code',
    labelNames: ['method', 'route', 'code'] as const,
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [this.registry],
  });

  readonly storeSyncDuration = new Histogram({
    name: 'moat_store_sync_duration_seconds',
    help: 'Time for a batch of store commits to become durable (write and fdatasync)',
    buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25],
    registers: [this.registry],
  });

  readonly storeErrors = new Counter({
    name: 'moat_store_errors_total',
    help: 'Store operations that failed (the change was not acknowledged)',
    registers: [this.registry],
  });

  readonly policyPropagation = new Histogram({
    name: 'moat_policy_propagation_seconds',
    help: 'From a network change stored on another node to its enforcement on the node hosting the sandbox (clocks of both nodes)',
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5],
    registers: [this.registry],
  });

  readonly clusterNodes: Gauge = new Gauge({
    name: 'moat_cluster_nodes',
    help: 'Nodes with a live heartbeat in the shared store, this one included (1 for a Moat on its own)',
    registers: [this.registry],
    collect: (): void => this.clusterNodes.set(this.nodeCount()),
  });

  private nodeCount: () => number = () => 1;

  /** Where the node gauge reads its value at scrape time. */
  countNodesWith(count: () => number): void {
    this.nodeCount = count;
  }

  /** Where the sandboxes gauge reads its values at scrape time. */
  countSandboxesWith(count: () => Record<string, number>): void {
    this.sandboxCount = count;
  }

  /** Where the client-connection gauge reads its value at scrape time. */
  countClientConnectionsWith(count: () => number): void {
    this.clientConnectionCount = count;
  }

  /** Where the active-tunnel gauges read their values at scrape time. */
  countTunnelsWith(count: () => number, bySandbox: () => Iterable<[string, number]>): void {
    this.tunnelCount = count;
    this.tunnelsBySandbox = bySandbox;
  }

  constructor(options: { defaultMetrics?: boolean; perSandbox?: boolean; version?: string } = {}) {
    // Always 1; its labels say what runs (join on it to compare versions across nodes).
    new Gauge({
      name: 'moat_build_info',
      help: 'Which Moat and which Node.js this server runs (always 1)',
      labelNames: ['version', 'node_version'],
      registers: [this.registry],
    }).set({ version: options.version ?? 'unknown', node_version: process.version }, 1);
    if (options.perSandbox) {
      const gauge: Gauge<'sandbox_id'> = new Gauge({
        name: 'moat_proxy_sandbox_active_tunnels',
        help: 'Open tunnels and in-flight forwarded requests of one sandbox (only sandboxes with any)',
        labelNames: ['sandbox_id'],
        registers: [this.registry],
        collect: (): void => {
          gauge.reset();
          for (const [sandboxID, count] of this.tunnelsBySandbox())
            gauge.set({ sandbox_id: sandboxID }, count);
        },
      });
      this.proxySandboxActiveTunnels = gauge;
    }
    // Failure series exist from the start at 0: an alert on increase() then sees the first one.
    for (const change of ['install', 'policy', 'learned'] as const) {
      for (const result of ['applied', 'failed'] as const)
        this.kernelApplies.inc({ change, result }, 0);
      this.kernelApplyDuration.zero({ change });
    }
    for (const result of ['applied', 'invalid', 'failed'] as const)
      this.policyPublishes.inc({ result }, 0);
    for (const where of ['store', 'follower', 'file'] as const)
      this.flowRecordsDropped.inc({ where }, 0);
    if (options.defaultMetrics !== false) {
      collectDefaultMetrics({ register: this.registry, prefix: 'moat_' });
      // prom-client names these gauges `_total`, which Prometheus reserves for counters
      // (promtool check metrics refuses them); the per-type gauges without it stay.
      for (const name of MISNAMED_DEFAULT_GAUGES) this.registry.removeSingleMetric(`moat_${name}`);
    }
  }

  /** A HotCount for one label set of `counter` (one whose collect publishes hot counts). */
  hotCount<L extends string>(counter: Counter<L>, labels: Partial<Record<L, string>>): HotCount {
    const cell: HotCell<L> = { labels, count: 0, published: 0 };
    const cells = this.hotCells.get(counter) ?? [];
    cells.push(cell);
    this.hotCells.set(counter, cells);
    return cell;
  }

  private publishHotCounts<L extends string>(counter: Counter<L>): void {
    for (const cell of this.hotCells.get(counter) ?? []) {
      if (cell.count === cell.published) continue;
      counter.inc(cell.labels, cell.count - cell.published);
      cell.published = cell.count;
    }
  }

  /** Where the learned-address gauge reads its value at scrape time. */
  countLearnedWith(count: () => number): void {
    this.learnedCount = count;
  }
}

/** The separate metrics listener once it is up. */
export interface MetricsListener {
  /** The bound port (resolved when 0 was asked for). */
  readonly port: number;
  close(): Promise<void>;
}

/**
 * A listener serving only `GET /metrics` from `registry`, without the API key: Prometheus
 * scrapes it without any route to the platform API. Anything else gets 404 or 405.
 */
export function listenMetrics(registry: Registry, at: HostPort): Promise<MetricsListener> {
  const server = http.createServer(
    { headersTimeout: 10_000, requestTimeout: 10_000 },
    (req, res) => {
      const answer = (status: number, text: string, headers: http.OutgoingHttpHeaders = {}) => {
        res.writeHead(status, { 'Content-Type': 'text/plain; charset=utf-8', ...headers });
        res.end(req.method === 'HEAD' ? undefined : text);
      };
      if ((req.url ?? '').split('?')[0] !== '/metrics') return answer(404, 'only /metrics here\n');
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        return answer(405, 'GET /metrics only\n', { Allow: 'GET, HEAD' });
      }
      registry.metrics().then(
        (text) => answer(200, text, { 'Content-Type': registry.contentType }),
        (error: unknown) => answer(500, `metrics collection failed: ${(error as Error).message}\n`),
      );
    },
  );
  // Scrapers keep connections alive between scrapes; stop must not wait for them.
  const close = () =>
    new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(at.port, at.host, () => {
      server.off('error', reject);
      resolve({ port: (server.address() as AddressInfo).port, close });
    });
  });
}
