/**
 * One typed configuration, merged from defaults < config file < MOAT_* environment < flags, and
 * shown as a config file would write it. Every source is reduced to text and parsed by the same
 * function (the settings table, config-settings.ts), so a value means the same thing wherever
 * it is written, and every error names the key and the source at fault.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { CIDR, InternalRange, Result } from './policy/index.js';
import type { UdpIoSetting } from './dns/index.js';
import type { HostPort } from './host-port.js';
import type { TcpIoSetting } from './proxy/index.js';
import type { IdRangeSetting } from './runtime/index.js';
import { SETTINGS } from './config-settings.js';

export { formatHostPort, type HostPort } from './host-port.js';

export type EnforcementSetting = 'auto' | 'namespace' | 'proxy';

export interface MoatConfig {
  /** Destinations no sandbox rule can open (the hard internal deny list). */
  readonly internalDeny: readonly InternalRange[];
  /** TCP ports of the host itself that sandboxes' policies may open (none by default). */
  readonly allowHostPorts: ReadonlySet<number>;
  /** Entries allowed in each of allowOut and denyOut. */
  readonly maxPolicyEntries: number;
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

export interface ConfigSources {
  /** Values given as command-line flags, by flag name (without dashes). */
  readonly flags?: Readonly<Record<string, string | undefined>>;
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** Path of a JSON config file whose keys are the MoatConfig keys. */
  readonly file?: string;
}

/** Config-file keys that were renamed, old to new: a file with the old one is told the new. */
const RENAMED_KEYS = new Map([
  // "namespace" also meant a Linux network namespace (enforcement, namespacePool).
  ['namespace', 'teamNamespace'],
]);

function readConfigFile(path: string): Result<Record<string, unknown>> {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    return { ok: false, error: `cannot read config file ${path}: ${(error as Error).message}` };
  }
  try {
    const value: unknown = JSON.parse(text);
    if (typeof value !== 'object' || value === null || Array.isArray(value)) {
      return { ok: false, error: `config file ${path} must hold a JSON object` };
    }
    const known = new Set(SETTINGS.map((s) => s.key as string));
    const unknown = Object.keys(value).find((key) => !known.has(key));
    const renamed = unknown === undefined ? undefined : RENAMED_KEYS.get(unknown);
    if (renamed !== undefined) {
      return {
        ok: false,
        error: `config file ${path}: key ${JSON.stringify(unknown)} is now ${JSON.stringify(renamed)}; rename it`,
      };
    }
    if (unknown !== undefined) {
      return {
        ok: false,
        error: `config file ${path}: unknown key ${JSON.stringify(unknown)}; known keys: ${[...known].join(', ')}`,
      };
    }
    return { ok: true, value: value as Record<string, unknown> };
  } catch (error) {
    return {
      ok: false,
      error: `config file ${path} is not valid JSON: ${(error as Error).message}`,
    };
  }
}

/** Values in a config file may be written as JSON numbers, booleans or arrays of strings. */
const fileValueText = (value: unknown): string =>
  Array.isArray(value) ? value.join(',') : String(value);

export function loadConfig(sources: ConfigSources = {}): Result<MoatConfig> {
  const file =
    sources.file === undefined ? { ok: true as const, value: {} } : readConfigFile(sources.file);
  if (!file.ok) return file;
  const config: Record<string, unknown> = {};
  for (const setting of SETTINGS) {
    const candidates: Array<[string, string | undefined]> = [
      [`--${setting.flag}`, sources.flags?.[setting.flag]],
      [setting.env, sources.env?.[setting.env]],
      [
        `${sources.file}: ${setting.key}`,
        setting.key in file.value ? fileValueText(file.value[setting.key]) : undefined,
      ],
      [`default ${setting.key}`, setting.default],
    ];
    const [source, text] = candidates.find(([, value]) => value !== undefined)!;
    const parsed = setting.parse(text!);
    if (!parsed.ok) return { ok: false, error: `${source}: ${parsed.error}` };
    config[setting.key] = parsed.value;
  }
  return { ok: true, value: config as unknown as MoatConfig };
}

/**
 * The file the first start writes the API key into when no key is configured, and the one the
 * API's clients (`moat observe`, `moat check --replay-api`) read when given no key.
 */
export const apiKeyFile = (dataDir: string): string => path.resolve(dataDir, 'api-key');

/** What a secret looks like wherever configuration is shown: one mask per value, never text. */
export const SECRET_MASK = '***';

/**
 * The effective configuration as JSON-ready values, one per setting in SETTINGS order, written
 * as a config file would write them, with every secret masked.
 */
export function showConfig(config: MoatConfig): Record<string, unknown> {
  const shown: Record<string, unknown> = {};
  for (const setting of SETTINGS) {
    const value = config[setting.key];
    if (setting.secret) {
      shown[setting.key] = Array.isArray(value) ? value.map(() => SECRET_MASK) : SECRET_MASK;
      continue;
    }
    // SETTINGS pairs each show with its own key's value type; the union loses that pairing.
    const show = setting.show as ((v: typeof value) => unknown) | undefined;
    shown[setting.key] = show ? show(value) : value;
  }
  return shown;
}
