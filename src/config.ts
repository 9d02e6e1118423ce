/**
 * One typed configuration, merged from defaults < config file < MOAT_* environment < flags.
 * Every source is reduced to text and parsed by the same function, so a value means the same
 * thing wherever it is written, and every error names the key and the source at fault.
 */
import { readFileSync } from 'node:fs';
import {
  DEFAULT_MAX_ENTRIES,
  type InternalRange,
  parseInternalDenyList,
  parseCIDR,
  parseIP,
  type CIDR,
  type Result,
} from './policy/index.js';
import type { UdpIoSetting } from './dns/index.js';
import { formatHostPort, type HostPort } from './host-port.js';
import type { TcpIoSetting } from './proxy/index.js';
import { type IdRangeSetting, IDS_PER_SANDBOX } from './runtime/index.js';

export { formatHostPort, type HostPort } from './host-port.js';

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
  readonly proxyCheckServerName: boolean;
  /** PEM file of CAs trusted for origins of intercepted TLS, beside Node's roots; undefined: none. */
  readonly upstreamCa: string | undefined;
  readonly redactSecretsInResponses: boolean;
  /** Where per-sandbox source addresses come from (loopback in the process runtime). */
  readonly sourcePool: CIDR;
  /** namespace: each sandbox in its own network namespace; proxy: shared network; auto: namespace where it works. */
  readonly enforcement: EnforcementSetting;
  /** Where namespaced sandboxes' links come from: a /30 each, the first holding the gateway. */
  readonly namespacePool: CIDR;
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
  /** The team namespace of named snapshots (`<namespace>/<alias>:<tag>`). */
  readonly namespace: string;
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

interface Setting<K extends keyof MoatConfig> {
  readonly key: K;
  readonly flag: string;
  readonly env: string;
  readonly default: string;
  /** What the value looks like, for --help (`N`, `IP:PORT`...). */
  readonly metavar: string;
  readonly help: string;
  /** Masked wherever the effective configuration is shown. */
  readonly secret?: true;
  parse(text: string): Result<MoatConfig[K]>;
  /**
   * The value as a config file would write it (`ip:port`, CIDR text, `off`...), so that printed
   * configuration reads back as the same configuration. Plain values are shown as they are.
   */
  show?(value: MoatConfig[K]): unknown;
}

/** A file path, or "off" (undefined). */
function optionalFile(text: string): Result<string | undefined> {
  if (text === 'off') return { ok: true, value: undefined };
  return text.trim() === ''
    ? { ok: false, error: 'expected a file path or "off", got an empty string' }
    : { ok: true, value: text };
}

const positiveInteger =
  (max: number) =>
  (text: string): Result<number> =>
    /^[1-9][0-9]*$/.test(text) && Number(text) <= max
      ? { ok: true, value: Number(text) }
      : {
          ok: false,
          error: `expected a whole number from 1 to ${max}, got ${JSON.stringify(text)}`,
        };

/** A CA file path, or `generated` (undefined: the CA Moat makes in its data folder). */
function caFile(text: string): Result<string | undefined> {
  if (text === 'generated') return { ok: true, value: undefined };
  return text.trim() === ''
    ? { ok: false, error: 'expected a file path or "generated", got an empty string' }
    : { ok: true, value: text };
}

/**
 * `ip:port`, `[ipv6]:port`, or a bare IP when a default port applies. Port 0 = any free port.
 * `localhost` means 127.0.0.1 (never a lookup: /etc/hosts may also give it ::1).
 */
function hostPort(text: string, defaultPort?: number): Result<HostPort> {
  const trimmed = text.trim();
  let host = trimmed;
  let portText: string | undefined;
  if (trimmed.startsWith('[')) {
    const close = trimmed.indexOf(']');
    host = trimmed.slice(1, close);
    const rest = trimmed.slice(close + 1);
    portText = rest.startsWith(':') ? rest.slice(1) : rest === '' ? undefined : 'invalid';
  } else if (trimmed.split(':').length === 2) {
    [host, portText] = trimmed.split(':') as [string, string];
  }
  const ip = parseIP(host.toLowerCase() === 'localhost' ? '127.0.0.1' : host);
  const port =
    portText === undefined
      ? defaultPort
      : /^[0-9]{1,5}$/.test(portText)
        ? Number(portText)
        : undefined;
  if (!ip.ok || port === undefined || port > 65535) {
    return {
      ok: false,
      error: `expected ip:port, [ipv6]:port or localhost:port, got ${JSON.stringify(text)}`,
    };
  }
  return { ok: true, value: { host: ip.value.text, port } };
}

/** The nameservers of /etc/resolv.conf, the default upstream. */
function systemResolvers(): Result<HostPort[]> {
  let text: string;
  try {
    text = readFileSync('/etc/resolv.conf', 'utf8');
  } catch (error) {
    return {
      ok: false,
      error: `"system" needs /etc/resolv.conf: ${(error as Error).message}; give resolvers as ip:port`,
    };
  }
  const servers = [...text.matchAll(/^\s*nameserver\s+(\S+)/gm)].map((m) => hostPort(m[1]!, 53));
  const usable = servers.flatMap((s) => (s.ok ? [s.value] : []));
  return usable.length > 0
    ? { ok: true, value: usable }
    : { ok: false, error: '/etc/resolv.conf names no nameserver; give resolvers as ip:port' };
}

function resolverList(text: string): Result<HostPort[]> {
  if (text.trim() === 'system') return systemResolvers();
  const servers: HostPort[] = [];
  for (const entry of text.split(',')) {
    const server = hostPort(entry, 53);
    if (!server.ok) return server;
    servers.push(server.value);
  }
  return { ok: true, value: servers };
}

const booleanValue = (text: string): Result<boolean> =>
  text === 'true' || text === 'false'
    ? { ok: true, value: text === 'true' }
    : { ok: false, error: `expected true or false, got ${JSON.stringify(text)}` };

export type EnforcementSetting = 'auto' | 'namespace' | 'proxy';
/** A parser accepting exactly one of `choices`. */
const oneOf =
  <T extends string>(choices: readonly T[]) =>
  (text: string): Result<T> =>
    (choices as readonly string[]).includes(text)
      ? { ok: true, value: text as T }
      : { ok: false, error: `expected one of ${choices.join(', ')}, got ${JSON.stringify(text)}` };

/** An IPv4 range no narrower than /longestPrefix. */
const ipv4Range =
  (longestPrefix: number) =>
  (text: string): Result<CIDR> => {
    const cidr = parseCIDR(text);
    if (!cidr.ok) return cidr;
    if (cidr.value.version !== 4 || cidr.value.prefixLength > longestPrefix) {
      return {
        ok: false,
        error: `expected an IPv4 range of /${longestPrefix} or wider, got ${JSON.stringify(text)}`,
      };
    }
    return cidr;
  };

/** `auto`, or `FIRST+SLOTS`: host ids FIRST.. in SLOTS slots of 65,536 (slot 0 owns stored layers). */
const idRange = (text: string): Result<IdRangeSetting> => {
  if (text === 'auto') return { ok: true, value: 'auto' };
  const match = /^([0-9]{1,10})\+([0-9]{1,6})$/.exec(text);
  const first = Number(match?.[1]);
  const slots = Number(match?.[2]);
  if (
    match === null ||
    first < IDS_PER_SANDBOX ||
    slots < 2 ||
    first + slots * IDS_PER_SANDBOX > 2 ** 32 - 2
  ) {
    return {
      ok: false,
      error: `expected auto or FIRST+SLOTS (a first host id of at least ${IDS_PER_SANDBOX}, 2 or more slots of ${IDS_PER_SANDBOX} ids, all below 2^32-1), got ${JSON.stringify(text)}`,
    };
  }
  return { ok: true, value: { first, slots } };
};

const storeLocation = (text: string): Result<string> => {
  if (text === 'file') return { ok: true, value: text };
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return { ok: false, error: 'expected "file" or a redis:// URL' };
  }
  return url.protocol === 'redis:' || url.protocol === 'rediss:'
    ? { ok: true, value: text }
    : { ok: false, error: `expected "file" or a redis:// URL, got the scheme ${url.protocol}` };
};

/** `none`, or TCP ports separated by commas. */
function portList(text: string): Result<ReadonlySet<number>> {
  if (text.trim() === 'none') return { ok: true, value: new Set() };
  const ports = new Set<number>();
  for (const [index, raw] of text.split(',').entries()) {
    const port = positiveInteger(65535)(raw.trim());
    if (!port.ok) return { ok: false, error: `port ${index + 1}: ${port.error}, or "none"` };
    ports.add(port.value);
  }
  return { ok: true, value: ports };
}

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

const showOptional = (value: HostPort | undefined): string =>
  value === undefined ? 'off' : formatHostPort(value);
const optionalHostPort = (text: string): Result<HostPort | undefined> =>
  text === 'off' ? { ok: true, value: undefined } : hostPort(text);

type AnySetting = { [K in keyof MoatConfig]: Setting<K> }[keyof MoatConfig];

/** A node's name or a team namespace: lower-case letters, digits and "-", 1 to 63. */
const LOWER_NAME = /^[a-z0-9][a-z0-9-]{0,62}$/;

/** Whether `text` can name a node (a kept `--node-id auto` name is checked again at start). */
export const isNodeID = (text: string): boolean => LOWER_NAME.test(text);

function lowerName(text: string): Result<string> {
  return LOWER_NAME.test(text)
    ? { ok: true, value: text }
    : {
        ok: false,
        error: `expected lower-case letters, digits and "-", got ${JSON.stringify(text)}`,
      };
}

export const SETTINGS: readonly AnySetting[] = [
  {
    key: 'internalDeny',
    metavar: 'CIDRS',
    flag: 'internal-deny',
    env: 'MOAT_INTERNAL_DENY',
    default: 'default',
    help: 'the hard internal deny list: comma-separated CIDRs, "none", or "default" (loopback, private, link-local/metadata, CGNAT, multicast, reserved, NAT64/6to4/Teredo, ULA...), and -CIDR to take a range out of the ones before it ("default,-198.18.0.0/15")',
    show: (ranges) => (ranges.length === 0 ? 'none' : ranges.map((r) => r.entry)),
    parse: parseInternalDenyList,
  },
  {
    key: 'allowHostPorts',
    metavar: 'PORTS',
    flag: 'allow-host-ports',
    env: 'MOAT_ALLOW_HOST_PORTS',
    default: 'none',
    help: 'TCP ports of the host itself (any of its addresses) that sandboxes may reach, where their policies allow the address; comma-separated, or "none". Moat\'s own listeners, the gateway and sandbox links are never reachable',
    show: (ports) => (ports.size === 0 ? 'none' : [...ports]),
    parse: portList,
  },
  {
    key: 'maxPolicyEntries',
    metavar: 'N',
    flag: 'max-policy-entries',
    env: 'MOAT_MAX_POLICY_ENTRIES',
    default: String(DEFAULT_MAX_ENTRIES),
    help: 'entries allowed in each of allowOut and denyOut',
    parse: positiveInteger(1_000_000),
  },
  {
    key: 'logLevel',
    metavar: 'LEVEL',
    flag: 'log-level',
    env: 'MOAT_LOG_LEVEL',
    default: 'info',
    help: `log level: ${LOG_LEVELS.join(', ')}`,
    parse: oneOf(LOG_LEVELS),
  },
  {
    key: 'dnsListen',
    metavar: 'IP:PORT',
    flag: 'dns-listen',
    env: 'MOAT_DNS_LISTEN',
    // Not 5353: that is mDNS, held by avahi or systemd-resolved on most desktops.
    default: '127.0.0.1:3053',
    help: 'where the DNS interceptor listens (UDP and TCP), ip:port',
    show: formatHostPort,
    parse: (text) => hostPort(text),
  },
  {
    key: 'dnsUpstream',
    metavar: 'IP[:PORT],...',
    flag: 'dns-upstream',
    env: 'MOAT_DNS_UPSTREAM',
    default: 'system',
    help: 'upstream resolvers, comma-separated ip[:port], or "system" for /etc/resolv.conf',
    show: (servers) => servers.map(formatHostPort),
    parse: resolverList,
  },
  {
    key: 'dnsTimeoutMs',
    metavar: 'MS',
    flag: 'dns-timeout-ms',
    env: 'MOAT_DNS_TIMEOUT_MS',
    default: '2000',
    help: 'time to answer a forwarded query before SERVFAIL, over every resolver and retry',
    parse: positiveInteger(60_000),
  },
  {
    key: 'dnsMinTtl',
    metavar: 'SECONDS',
    flag: 'dns-min-ttl',
    env: 'MOAT_DNS_MIN_TTL',
    default: '30',
    help: 'shortest time, seconds, an address from a DNS answer stays allowed',
    parse: positiveInteger(86_400),
  },
  {
    key: 'dnsMaxTtl',
    metavar: 'SECONDS',
    flag: 'dns-max-ttl',
    env: 'MOAT_DNS_MAX_TTL',
    default: '86400',
    help: 'longest time, seconds, an address stays allowed or an answer is cached',
    parse: positiveInteger(604_800),
  },
  {
    key: 'dnsCacheSize',
    metavar: 'N',
    flag: 'dns-cache-size',
    env: 'MOAT_DNS_CACHE_SIZE',
    default: '10000',
    help: 'answers kept in the shared DNS cache (least recently used go first)',
    parse: positiveInteger(10_000_000),
  },
  {
    key: 'flowStoreSize',
    metavar: 'N',
    flag: 'flow-store-size',
    env: 'MOAT_FLOW_STORE_SIZE',
    default: '100000',
    help: 'flow records kept in memory for GET /flows (the newest; about 260 bytes each)',
    parse: positiveInteger(10_000_000),
  },
  {
    key: 'flowLog',
    metavar: 'FILE|off',
    flag: 'flow-log',
    env: 'MOAT_FLOW_LOG',
    default: 'off',
    help: 'append every flow record to FILE as JSON Lines (no fsync; lines are dropped and counted when the disk is slow); or "off"',
    show: (value) => value ?? 'off',
    parse: optionalFile,
  },
  {
    key: 'flowLogMaxBytes',
    metavar: 'BYTES',
    flag: 'flow-log-max-bytes',
    env: 'MOAT_FLOW_LOG_MAX_BYTES',
    default: '104857600',
    help: 'size at which the flow log becomes FILE.1 (replacing the previous one) and a new FILE begins',
    parse: positiveInteger(2 ** 40),
  },
  {
    key: 'dnsRateLimit',
    metavar: 'QPS',
    flag: 'dns-rate-limit',
    env: 'MOAT_DNS_RATE_LIMIT',
    default: '500',
    help: 'DNS queries per second per sandbox (bursts of the same size); more are REFUSED',
    parse: positiveInteger(1_000_000_000),
  },
  {
    key: 'dnsUdpIo',
    metavar: 'auto|dgram',
    flag: 'dns-udp-io',
    env: 'MOAT_DNS_UDP_IO',
    default: 'auto',
    help: 'DNS over UDP: auto batches system calls with the native addon where it is built (Linux), else uses node:dgram; dgram: always node:dgram',
    parse: oneOf<UdpIoSetting>(['auto', 'dgram']),
  },
  {
    key: 'proxyIo',
    metavar: 'auto|node',
    flag: 'proxy-io',
    env: 'MOAT_PROXY_IO',
    default: 'auto',
    help: 'explicit proxy: auto accepts and relays CONNECT tunnels with the native addon where it is built (Linux), else with Node sockets; node: always Node sockets',
    parse: oneOf<TcpIoSetting>(['auto', 'node']),
  },
  {
    key: 'proxyListen',
    metavar: 'IP:PORT',
    flag: 'proxy-listen',
    env: 'MOAT_PROXY_LISTEN',
    default: '127.0.0.1:3128',
    help: 'where the explicit egress proxy (CONNECT and absolute-form HTTP) listens',
    show: formatHostPort,
    parse: (text) => hostPort(text),
  },
  {
    key: 'transparentListen',
    metavar: 'IP:PORT|off',
    flag: 'transparent-listen',
    env: 'MOAT_TRANSPARENT_LISTEN',
    default: '127.0.0.1:3129',
    help: 'where TCP 80/443 redirected by the kernel enforcer arrives (decided by SNI or Host), or "off"',
    show: showOptional,
    parse: optionalHostPort,
  },
  {
    key: 'proxyMaxTunnels',
    metavar: 'N',
    flag: 'proxy-max-tunnels',
    env: 'MOAT_PROXY_MAX_TUNNELS',
    default: '256',
    help: 'open connections (tunnels and forwarded requests) allowed per sandbox; more get 429',
    parse: positiveInteger(1_000_000),
  },
  {
    key: 'proxyConnectTimeoutMs',
    metavar: 'MS',
    flag: 'proxy-connect-timeout-ms',
    env: 'MOAT_PROXY_CONNECT_TIMEOUT_MS',
    default: '5000',
    help: 'time to connect to one destination address before trying the next or answering 504',
    parse: positiveInteger(600_000),
  },
  {
    key: 'proxyHandshakeTimeoutMs',
    metavar: 'MS',
    flag: 'proxy-handshake-timeout-ms',
    env: 'MOAT_PROXY_HANDSHAKE_TIMEOUT_MS',
    default: '10000',
    help: 'time a client has to send its request head, or the first bytes of a checked tunnel',
    parse: positiveInteger(600_000),
  },
  {
    key: 'proxyIdleTimeoutMs',
    metavar: 'MS',
    flag: 'proxy-idle-timeout-ms',
    env: 'MOAT_PROXY_IDLE_TIMEOUT_MS',
    default: '300000',
    help: 'a tunnel with no traffic either way for this long is closed',
    parse: positiveInteger(86_400_000),
  },
  {
    key: 'proxyCheckServerName',
    metavar: 'true|false',
    flag: 'proxy-check-server-name',
    env: 'MOAT_PROXY_CHECK_SERVER_NAME',
    default: 'true',
    help: 'close CONNECT tunnels whose TLS SNI (or, on port 80, Host header) names another host than CONNECT did (domain fronting)',
    parse: booleanValue,
  },
  {
    key: 'upstreamCa',
    metavar: 'FILE|off',
    flag: 'upstream-ca',
    env: 'MOAT_UPSTREAM_CA',
    default: 'off',
    help: 'PEM bundle of CAs trusted, beside Node\'s built-in roots, for origins Moat connects to when it intercepts TLS to add a rule\'s headers; or "off"',
    show: (value) => value ?? 'off',
    parse: optionalFile,
  },
  {
    key: 'redactSecretsInResponses',
    metavar: 'true|false',
    flag: 'redact-secrets-in-responses',
    env: 'MOAT_REDACT_SECRETS_IN_RESPONSES',
    default: 'false',
    help: 'in responses to requests Moat added secrets to, replace each secret value with its ${e2b.secrets.NAME} placeholder (headers and bodies; origins are asked for uncompressed bodies), so an origin that echoes a request cannot hand the credential to the sandbox. Off by default, as in E2B',
    parse: booleanValue,
  },
  {
    key: 'sourcePool',
    metavar: 'CIDR',
    flag: 'source-pool',
    env: 'MOAT_SOURCE_POOL',
    default: '127.77.0.0/16',
    help: 'IPv4 range that per-sandbox source addresses are drawn from when sandboxes share the host network (how DNS and the proxy tell sandboxes apart)',
    show: (cidr) => cidr.text,
    parse: ipv4Range(30),
  },
  {
    key: 'enforcement',
    metavar: 'auto|namespace|proxy',
    flag: 'enforcement',
    env: 'MOAT_ENFORCEMENT',
    default: 'auto',
    help: 'namespace: each sandbox in its own network namespace with a generated nftables firewall (root, iproute2, nftables, confined sandboxes); proxy: sandboxes share the host network and only programs that use the proxy variables are held; auto: namespace where it works, else proxy',
    parse: oneOf<EnforcementSetting>(['auto', 'namespace', 'proxy']),
  },
  {
    key: 'namespacePool',
    metavar: 'CIDR',
    flag: 'namespace-pool',
    env: 'MOAT_NAMESPACE_POOL',
    default: '10.213.0.0/16',
    help: "IPv4 range of namespaced sandboxes' links, a /30 each; its first address is Moat's gateway for them (DNS, proxy). Give every Moat on a host its own",
    show: (cidr) => cidr.text,
    parse: ipv4Range(28),
  },
  {
    key: 'apiListen',
    metavar: 'IP:PORT',
    flag: 'api-listen',
    env: 'MOAT_API_LISTEN',
    default: '127.0.0.1:3000',
    help: 'where the platform API (sandboxes, network rules, snapshots, /metrics) listens',
    show: formatHostPort,
    parse: (text) => hostPort(text),
  },
  {
    key: 'sandboxListen',
    metavar: 'IP:PORT',
    flag: 'sandbox-listen',
    env: 'MOAT_SANDBOX_LISTEN',
    default: '127.0.0.1:3001',
    help: 'where the per-sandbox API (port 49983 of {port}-{sandboxID}.<domain>) and ingress to sandbox ports listen; point E2B_SANDBOX_URL here',
    show: formatHostPort,
    parse: (text) => hostPort(text),
  },
  {
    key: 'apiKeys',
    metavar: 'KEY,...',
    flag: 'api-keys',
    env: 'MOAT_API_KEYS',
    default: '',
    secret: true,
    help: 'platform API keys (X-API-Key), comma-separated, 16+ characters each; when none is given, the first start generates one into <data-dir>/api-key',
    parse: (text) => {
      const keys = text === '' ? [] : text.split(',').map((k) => k.trim());
      const weak = keys.findIndex((k) => k.length < 16);
      return weak < 0
        ? { ok: true, value: keys }
        : { ok: false, error: `API key number ${weak + 1} is shorter than 16 characters` };
    },
  },
  {
    key: 'metricsRequireKey',
    metavar: 'true|false',
    flag: 'metrics-require-key',
    env: 'MOAT_METRICS_REQUIRE_KEY',
    default: 'false',
    help: 'GET /metrics on the API listener needs the API key too',
    parse: booleanValue,
  },
  {
    key: 'metricsPerSandbox',
    metavar: 'true|false',
    flag: 'metrics-per-sandbox',
    env: 'MOAT_METRICS_PER_SANDBOX',
    default: 'false',
    help: 'also export moat_proxy_sandbox_active_tunnels{sandbox_id}, one series per sandbox with open connections (off by default: its cardinality follows the number of sandboxes)',
    parse: booleanValue,
  },
  {
    key: 'metricsListen',
    metavar: 'IP:PORT|off',
    flag: 'metrics-listen',
    env: 'MOAT_METRICS_LISTEN',
    default: 'off',
    help: 'a separate listener serving only GET /metrics, without the API key, so Prometheus can scrape without reaching the platform API; or "off"',
    show: showOptional,
    parse: optionalHostPort,
  },
  {
    key: 'dataDir',
    metavar: 'DIR',
    flag: 'data-dir',
    env: 'MOAT_DATA_DIR',
    default: './data',
    help: 'folder for durable state (store), sandbox roots, snapshots and the generated API key',
    parse: (text) =>
      text.trim() === ''
        ? { ok: false, error: 'expected a folder path, got an empty string' }
        : { ok: true, value: text },
  },
  {
    key: 'secretsKeyFile',
    metavar: 'FILE',
    flag: 'secrets-key-file',
    env: 'MOAT_SECRETS_KEY_FILE',
    default: '',
    help: 'file holding the AES-256-GCM key that seals secret values in the store, as 64 hex digits (openssl rand -hex 32); empty: <data-dir>/secrets-key, generated on first start with mode 0600. Every node sharing a Redis store needs the same key',
    show: (value) => value ?? '',
    parse: (text) => ({ ok: true, value: text.trim() === '' ? undefined : text }),
  },
  {
    key: 'caCert',
    show: (value: string | undefined) => value ?? 'generated',
    metavar: 'FILE|generated',
    flag: 'ca-cert',
    env: 'MOAT_CA_CERT',
    default: 'generated',
    help: 'CA certificate (PEM) whose leaves Moat shows sandboxes where it terminates their TLS; every sandbox trusts it. "generated": Moat\'s own, made once in <data-dir>/ca. Give --ca-key with it',
    parse: caFile,
  },
  {
    key: 'caKey',
    show: (value: string | undefined) => value ?? 'generated',
    metavar: 'FILE|generated',
    flag: 'ca-key',
    env: 'MOAT_CA_KEY',
    default: 'generated',
    help: 'private key (PEM) of --ca-cert; read at start only. Whoever holds it can impersonate any site to every sandbox that trusts the CA',
    parse: caFile,
  },
  {
    key: 'unconfinedSandboxes',
    metavar: 'true|false',
    flag: 'unconfined-sandboxes',
    env: 'MOAT_UNCONFINED_SANDBOXES',
    default: 'false',
    help: "where sandboxes cannot be confined (not root, no user namespaces or idmapped mounts, no cgroups), run their processes UNCONFINED as Moat's own user instead of refusing them: they can read and change whatever Moat can",
    parse: booleanValue,
  },
  {
    key: 'sandboxIds',
    metavar: 'auto|FIRST+SLOTS',
    flag: 'sandbox-ids',
    env: 'MOAT_SANDBOX_IDS',
    default: 'auto',
    help: `host uids and gids for sandboxes: FIRST+SLOTS takes SLOTS slots of ${IDS_PER_SANDBOX} ids from FIRST (slot 0 owns stored layers, each sandbox one slot); auto takes a free range of 1024 slots from 2^30, remembered in the data folder`,
    show: (value) => (value === 'auto' ? 'auto' : `${value.first}+${value.slots}`),
    parse: idRange,
  },
  {
    key: 'sandboxCpus',
    metavar: 'N',
    flag: 'sandbox-cpus',
    env: 'MOAT_SANDBOX_CPUS',
    default: '2',
    help: 'CPU time of a sandbox made from the base template, in CPUs (cgroup cpu quota; its cpuCount)',
    parse: positiveInteger(256),
  },
  {
    key: 'sandboxMemoryMB',
    metavar: 'MB',
    flag: 'sandbox-memory-mb',
    env: 'MOAT_SANDBOX_MEMORY_MB',
    default: '1024',
    help: 'memory of a sandbox made from the base template, MiB: over it the kernel kills inside that sandbox only (its memoryMB)',
    parse: positiveInteger(4_194_304),
  },
  {
    key: 'sandboxDiskMB',
    metavar: 'MB',
    flag: 'sandbox-disk-mb',
    env: 'MOAT_SANDBOX_DISK_MB',
    default: '10240',
    help: "size of the disk holding a sandbox's writable layer, MiB (a sparse image: space is taken as written; its diskSizeMB)",
    parse: positiveInteger(16_777_216),
  },
  {
    key: 'sandboxPids',
    metavar: 'N',
    flag: 'sandbox-pids',
    env: 'MOAT_SANDBOX_PIDS',
    default: '2048',
    help: 'processes and threads a sandbox may have at once',
    parse: positiveInteger(4_194_304),
  },
  {
    key: 'namespace',
    metavar: 'NAME',
    flag: 'namespace',
    env: 'MOAT_NAMESPACE',
    default: 'moat',
    help: 'team namespace of named snapshots, as in <namespace>/<name>:<tag>',
    parse: lowerName,
  },
  {
    key: 'store',
    metavar: 'file|redis://HOST:PORT[/DB]',
    flag: 'store',
    env: 'MOAT_STORE',
    default: 'file',
    help: 'where sandbox records live: "file" (embedded, in the data folder) or Redis shared by every node of one platform',
    // Shown with any password masked; the rest is what an operator needs to see.
    show: (value) => value.replace(/^(rediss?:\/\/[^:@/]*:)[^@/]*@/, '$1***@'),
    parse: storeLocation,
  },
  {
    key: 'storePrefix',
    metavar: 'PREFIX',
    flag: 'store-prefix',
    env: 'MOAT_STORE_PREFIX',
    default: 'moat:',
    help: 'prefix of every Redis key and channel of this platform (several platforms can share one Redis)',
    parse: (text) =>
      /^[A-Za-z0-9:._-]{1,64}$/.test(text)
        ? { ok: true, value: text }
        : { ok: false, error: `expected 1-64 of A-Z a-z 0-9 : . _ -, got ${JSON.stringify(text)}` },
  },
  {
    key: 'nodeID',
    metavar: 'ID|auto',
    flag: 'node-id',
    env: 'MOAT_NODE_ID',
    default: 'auto',
    help: 'this node\'s name in a Redis-backed platform; "auto" makes one once and keeps it in the data folder',
    parse: lowerName,
  },
  {
    key: 'nodeTtlMs',
    metavar: 'MS',
    flag: 'node-ttl-ms',
    env: 'MOAT_NODE_TTL_MS',
    default: '10000',
    help: 'a node whose heartbeat is older than this is gone: other nodes answer 404 for its sandboxes and remove their records',
    parse: positiveInteger(3_600_000),
  },
  {
    key: 'hostsSandboxes',
    metavar: 'true|false',
    flag: 'hosts-sandboxes',
    env: 'MOAT_HOSTS_SANDBOXES',
    default: 'true',
    help: 'false makes this node an API replica: it answers every platform request and places new sandboxes on nodes that host them',
    parse: booleanValue,
  },
  {
    key: 'advertiseApi',
    metavar: 'IP:PORT',
    flag: 'advertise-api',
    env: 'MOAT_ADVERTISE_API',
    default: 'listener',
    help: 'where other nodes reach this node\'s platform API; "listener" means the API listener\'s own address',
    show: (value) => (value === undefined ? 'listener' : formatHostPort(value)),
    parse: (text) => (text === 'listener' ? { ok: true, value: undefined } : hostPort(text)),
  },
];

export interface ConfigSources {
  /** Values given as command-line flags, by flag name (without dashes). */
  readonly flags?: Readonly<Record<string, string | undefined>>;
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** Path of a JSON config file whose keys are the MoatConfig keys. */
  readonly file?: string;
}

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
