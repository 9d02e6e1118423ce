/**
 * The typed configuration's shape: what config.ts loads and the settings table
 * (config-settings.ts) parses, key by key. A file of its own, below both, so the table names the
 * keys without importing the loader that reads the table.
 */
import type { CIDR, InternalRange, NetworkMode } from './policy/index.js';
import type { UdpIoSetting } from './dns/index.js';
import type { HostPort } from './net/index.js';
import type { TcpIoSetting } from './proxy/index.js';
import type { IdRangeSetting } from './runtime/index.js';

export type EnforcementSetting = 'auto' | 'namespace' | 'proxy';

export interface MoatConfig {
  /** Destinations no sandbox rule can open (the hard internal deny list). */
  readonly internalDeny: readonly InternalRange[];
  /** TCP ports of the host itself that sandboxes' policies may open (none by default). */
  readonly allowHostPorts: ReadonlySet<number>;
  /** Entries allowed in each of allowOut and denyOut. */
  readonly maxPolicyEntries: number;
  /** The operator's preset folder, beside the shipped policies/presets/; undefined: none. */
  readonly presetsDir: string | undefined;
  readonly logLevel: string;
  readonly dnsListen: HostPort;
  readonly dnsUpstream: readonly HostPort[];
  readonly dnsTimeoutMs: number;
  readonly dnsMinTtl: number;
  readonly dnsMaxTtl: number;
  readonly dnsCacheSize: number;
  /** Flow records this node keeps in memory (the newest). */
  readonly flowStoreSize: number;
  /** JSON Lines file every flow record is appended to; undefined when off. */
  readonly flowLog: string | undefined;
  readonly flowLogMaxBytes: number;
  readonly dnsRateLimit: number;
  readonly dnsUdpIo: UdpIoSetting;
  readonly proxyIo: TcpIoSetting;
  readonly proxyListen: HostPort;
  /** Where redirected 80/443 traffic arrives; undefined when switched off. */
  readonly transparentListen: HostPort | undefined;
  readonly proxyMaxTunnels: number;
  readonly proxyConnectTimeoutMs: number;
  readonly proxyHandshakeTimeoutMs: number;
  readonly proxyIdleTimeoutMs: number;
  readonly proxyFirstByteTimeoutMs: number;
  readonly proxyKeepAliveTimeoutMs: number;
  readonly fdReserve: number;
  readonly proxyCheckServerName: boolean;
  /** Proxied requests and new tunnels a second per sandbox while others are active. */
  readonly proxyRequestsPerSecond: number;
  /** TLS connections of a sandbox waiting for a leaf mint; more are reset. */
  readonly leafMintsWaiting: number;
  /** PEM file of CAs trusted for origins of intercepted TLS, beside Node's roots; undefined: none. */
  readonly upstreamCa: string | undefined;
  readonly redactSecretsInResponses: boolean;
  /** Workload identity's issuer URL (no trailing slash); undefined: identity is off. */
  readonly identityIssuer: string | undefined;
  /** The SPIFFE trust domain of token subjects; undefined: the issuer's host name. */
  readonly identityTrustDomain: string | undefined;
  /** Where per-sandbox source addresses come from (loopback in the process runtime). */
  readonly sourcePool: CIDR;
  /** namespace: each sandbox in its own network namespace; proxy: shared network; auto: namespace where it works. */
  readonly enforcement: EnforcementSetting;
  /** Where namespaced sandboxes' links come from: a /30 each, the first holding the gateway. */
  readonly namespacePool: CIDR;
  /** New connections (TCP, UDP flows) per second each namespaced sandbox may open, and its burst. */
  readonly sandboxNewConnectionsPerSecond: number;
  readonly sandboxNewConnectionsBurst: number;
  /** Connections each namespaced sandbox may hold open at once (its firewall's ct count). */
  readonly sandboxTrackedConnections: number;
  /** Each namespaced sandbox's default bandwidth, out and in, in Mbit/s; 0: unlimited. */
  readonly sandboxEgressMbps: number;
  readonly sandboxIngressMbps: number;
  /** The mode of a sandbox created without network.mode (kept with it). */
  readonly defaultNetworkMode: NetworkMode;
  readonly apiListen: HostPort;
  /** The sandbox API and ingress: `{port}-{sandboxID}.<domain>` or E2b-Sandbox-* headers. */
  readonly sandboxListen: HostPort;
  /** API keys from configuration; empty means the generated key in the data folder. */
  readonly apiKeys: readonly string[];
  readonly metricsRequireKey: boolean;
  /** Export a per-sandbox active-connections gauge (label cardinality = sandboxes). */
  readonly metricsPerSandbox: boolean;
  /** A second listener serving only GET /metrics (no API key); undefined when switched off. */
  readonly metricsListen: HostPort | undefined;
  /** Where sandboxes, snapshots, the store and the generated API key live. */
  readonly dataDir: string;
  /** The key file sealing secret values at rest; undefined: `<dataDir>/secrets-key`. */
  readonly secretsKeyFile: string | undefined;
  /** The operator's CA certificate for interception (PEM); undefined: the one in the data folder. */
  readonly caCert: string | undefined;
  /** Its private key (PEM); given with caCert or not at all. */
  readonly caKey: string | undefined;
  /** Start sandboxes unconfined where they cannot be confined (loudly named on purpose). */
  readonly unconfinedSandboxes: boolean;
  /** Host ids for sandboxes: `auto` or a first id and a number of 65,536-id slots. */
  readonly sandboxIds: IdRangeSetting;
  /** Limits of sandboxes made from the base template (snapshots keep their sandbox's). */
  readonly sandboxCpus: number;
  readonly sandboxMemoryMB: number;
  readonly sandboxDiskMB: number;
  readonly sandboxPids: number;
  /** Each sandbox's shares of the host's inotify and pty pools (see KernelBudgets). */
  readonly sandboxInotifyInstances: number;
  readonly sandboxInotifyWatches: number;
  readonly sandboxPtys: number;
  /** How long a sandbox's file agent or launcher may go without progress while Moat waits. */
  readonly sandboxAgentDeadlineMs: number;
  /** The team namespace of named snapshots (`<team namespace>/<alias>:<tag>`). */
  readonly teamNamespace: string;
  /** `file` (the embedded store in the data folder) or a `redis://` URL shared by many nodes. */
  readonly store: string;
  /** Prefix of every Redis key and channel of this platform. */
  readonly storePrefix: string;
  /** This node's name among the nodes sharing a Redis store; `auto` keeps one in the data folder. */
  readonly nodeID: string;
  /** A node whose heartbeat is older than this is gone, with its sandboxes. */
  readonly nodeTtlMs: number;
  /** false: an API replica that places sandboxes on other nodes and hosts none itself. */
  readonly hostsSandboxes: boolean;
  /** Where other nodes reach this node's platform API; default: its API listener. */
  readonly advertiseApi: HostPort | undefined;
}
