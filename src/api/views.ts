/**
 * What the platform API says about sandboxes and snapshots: the wire shapes (field names as the
 * reference service and its SDK use them) and their JSON schemas, which both serialise the
 * replies and document them in /openapi.json.
 */
import { formatHostPort, type HostPort } from '../net/index.js';
import type { EnforcementMode } from '../runtime/index.js';
import { NETWORK_MODES, type PresetUse } from '../policy/index.js';
import {
  type BandwidthSettings,
  bandwidthOf,
  type ForkResult,
  linkView,
  type SandboxRecord,
  type SnapshotRecord,
  type UsageSample,
} from '../sandbox/index.js';
import type { FlowTotals } from '../flows/index.js';
import { errorSchema, flowTotalsSchema } from './routes/schemas.js';

/** A rule's `match` and `action` as stored (Moat's extension), shown where the rule is. */
const SHOWN_REQUEST_ACCESS = {
  match: {
    type: 'object',
    properties: {
      methods: { type: 'array', items: { type: 'string' } },
      paths: { type: 'array', items: { type: 'string' } },
    },
  },
  action: { type: 'string' },
} as const;

/**
 * The sandbox daemon version the SDK is told. 0.6.x switches on every SDK feature (octet-stream
 * uploads, file metadata, watch entries); the per-sandbox API serves that protocol.
 */
export const ENVD_VERSION = '0.6.4';
/** The deprecated `clientID` field: one fixed value, as the reference service no longer uses it. */
const CLIENT_ID = 'moat';

/** How a sandbox's egress is identified and enforced: Moat's extension to the detail reply. */
export interface EgressInfo {
  readonly proxy: HostPort;
  readonly dns: HostPort;
  /** Where namespaced sandboxes reach Moat (its DNS and proxy): undefined in proxy mode. */
  readonly gateway?: string;
  readonly enforcement: EnforcementMode;
  /** Whether this node's sandboxes are confined (or run unconfined by the operator's override). */
  readonly confinement: 'confined' | 'unconfined';
  /** The operator's bandwidth for sandboxes whose `network.bandwidth` leaves a direction out. */
  readonly bandwidthDefaults: Required<BandwidthSettings>;
}

/** A sandbox's own bounds (its cgroup and disk), as the reference service reports its VM's. */
const sizeOf = (r: SandboxRecord) => ({
  cpuCount: r.limits?.cpuCount ?? 0,
  memoryMB: r.limits?.memoryMB ?? 0,
  diskSizeMB: r.limits?.diskSizeMB ?? 0,
});

/** The reply to create, connect and resume. */
export const createdView = (r: SandboxRecord) => ({
  templateID: r.templateID,
  sandboxID: r.sandboxID,
  clientID: CLIENT_ID,
  envdVersion: ENVD_VERSION,
  alias: r.alias,
  envdAccessToken: r.envdAccessToken,
  trafficAccessToken: r.trafficAccessToken,
  domain: null,
});

export const listedView = (r: SandboxRecord) => ({
  templateID: r.templateID,
  alias: r.alias,
  sandboxID: r.sandboxID,
  clientID: CLIENT_ID,
  startedAt: new Date(r.startedAt).toISOString(),
  endAt: new Date(r.endAt).toISOString(),
  ...sizeOf(r),
  metadata: r.metadata,
  state: r.state,
  envdVersion: ENVD_VERSION,
});

/** The egress block: how the sandbox's egress is identified and enforced. */
const egressView = (r: SandboxRecord, egress: EgressInfo) => ({
  address: r.sourceAddress,
  ...(egress.gateway === undefined ? {} : { gateway: egress.gateway }),
  proxyUrl: `http://${formatHostPort(egress.proxy)}`,
  dns: formatHostPort(egress.dns),
  enforcement: egress.enforcement,
  // Only a sandbox in a network namespace has a link of its own to hold to a rate.
  bandwidthEnforced: egress.enforcement === 'namespace',
  node: r.node ?? null,
});

/** A network-only sandbox's link (absent for a sandbox Moat runs). */
const linkPart = (r: SandboxRecord) => {
  const link = linkView(r);
  return link === undefined ? {} : { link };
};

/** The reply to create: a network-only sandbox's also says where it is linked and reaches Moat. */
export const createReplyView = (r: SandboxRecord, egress: EgressInfo) =>
  r.link === undefined
    ? createdView(r)
    : { ...createdView(r), egress: egressView(r, egress), ...linkPart(r) };

export const detailView = (
  r: SandboxRecord,
  egress: EgressInfo,
  flows: FlowTotals,
  presets: readonly PresetUse[],
) => ({
  ...listedView(r),
  envdAccessToken: r.envdAccessToken,
  allowInternetAccess: r.network.allowInternetAccess,
  domain: null,
  network: {
    allowPublicTraffic: r.network.allowPublicTraffic,
    allowOut: r.network.allowOut,
    denyOut: r.network.denyOut,
    maskRequestHost: r.network.maskRequestHost,
    // Address and username only: the password is never returned.
    egressProxy: r.network.egressProxy
      ? {
          address: r.network.egressProxy.address,
          ...(r.network.egressProxy.username === undefined
            ? {}
            : { username: r.network.egressProxy.username }),
        }
      : null,
    httpsPorts: r.network.httpsPorts ?? [],
    // Exactly as stored: placeholders stay placeholders, and literal values are the client's own.
    ...(r.network.rules === undefined ? {} : { rules: r.network.rules }),
    bandwidth: bandwidthOf(r.network, egress.bandwidthDefaults),
    mode: r.network.mode ?? 'enforce',
    // allowOut stays as written (preset:NAME); this says what each preset stood for.
    ...(presets.length === 0 ? {} : { presets }),
  },
  lifecycle: { autoResume: r.autoResume, onTimeout: r.autoPause ? 'pause' : 'kill' },
  egress: egressView(r, egress),
  ...linkPart(r),
  flows,
  confinement: egress.confinement,
});

/** One fork's outcome: `sandbox` when it started, `error` when it did not. */
export const forkView = (result: ForkResult) =>
  result instanceof Error
    ? { error: { code: result.status, message: result.message } }
    : { sandbox: createdView(result) };

export const metricView = (m: UsageSample) => ({
  timestamp: new Date(m.timestamp).toISOString(),
  timestampUnix: Math.floor(m.timestamp / 1000),
  cpuCount: m.cpuCount,
  cpuUsedPct: m.cpuUsedPct,
  memUsed: m.memUsed,
  memTotal: m.memTotal,
  memCache: m.memCache,
  diskUsed: m.diskUsed,
  diskTotal: m.diskTotal,
});

export const snapshotView = (s: SnapshotRecord) => ({ snapshotID: s.snapshotID, names: s.names });

export const templateView = (s: SnapshotRecord) => ({
  templateID: s.templateID,
  snapshotID: s.snapshotID,
  tag: s.tag,
  aliases: s.alias === null ? [] : [s.alias],
  names: s.names,
  sourceSandboxID: s.sandboxID,
  createdAt: new Date(s.createdAt).toISOString(),
  buildStatus: 'ready',
  public: false,
});

export const BASE_TEMPLATE_VIEW = {
  templateID: 'base',
  snapshotID: null,
  tag: 'default',
  aliases: ['base'],
  names: ['base'],
  sourceSandboxID: null,
  createdAt: new Date(0).toISOString(),
  buildStatus: 'ready',
  public: true,
};

// -- JSON schemas of the replies --

const string = { type: 'string' } as const;
const nullableString = { type: ['string', 'null'] } as const;
const integer = { type: 'integer' } as const;
const stringList = { type: 'array', items: string } as const;
const stringMap = { type: 'object', additionalProperties: string } as const;
const object = (properties: Record<string, object>, description?: string) => ({
  type: 'object',
  ...(description ? { description } : {}),
  properties,
  required: Object.keys(properties),
});

/** An object schema with more properties that may be left out. */
const withOptional = (schema: ReturnType<typeof object>, optional: Record<string, object>) => ({
  ...schema,
  properties: { ...schema.properties, ...optional },
});

export const createdSchema = object({
  templateID: string,
  sandboxID: string,
  clientID: string,
  envdVersion: string,
  alias: nullableString,
  envdAccessToken: { ...nullableString, description: 'Only for secure sandboxes' },
  trafficAccessToken: {
    ...nullableString,
    description: 'Only when network.allowPublicTraffic is false',
  },
  domain: { type: 'null', description: 'Deprecated; always null' },
});

const listedProperties = {
  templateID: string,
  alias: nullableString,
  sandboxID: string,
  clientID: string,
  startedAt: { type: 'string', format: 'date-time' },
  endAt: { type: 'string', format: 'date-time' },
  cpuCount: integer,
  memoryMB: integer,
  diskSizeMB: integer,
  metadata: stringMap,
  state: { type: 'string', enum: ['running', 'paused'] },
  envdVersion: string,
};

export const listedSchema = { type: 'array', items: object(listedProperties) };

const egressSchema = withOptional(
  object(
    {
      address: { ...string, description: 'Source address of the sandbox’s traffic' },
      proxyUrl: { ...string, description: 'Egress proxy (credential not included)' },
      dns: { ...string, description: 'DNS interceptor the sandbox resolves through' },
      enforcement: { type: 'string', enum: ['namespace', 'proxy'] },
      bandwidthEnforced: {
        type: 'boolean',
        description:
          'Whether network.bandwidth holds the sandbox’s link (namespace enforcement); false: it is kept but not enforced',
      },
      node: {
        ...nullableString,
        description: 'The node that hosts it when many nodes share a Redis store, else null',
      },
    },
    'Moat extension: how this sandbox’s egress is identified and enforced',
  ),
  {
    gateway: {
      ...string,
      description: 'Where Moat’s DNS and proxy wait for namespaced sandboxes',
    },
  },
);

/** Moat's link into a network-only sandbox's namespace. */
const linkSchema = object(
  {
    netns: { ...string, description: 'The namespace path as the create request gave it' },
    ifname: { ...string, description: 'Moat’s end of the link in that namespace' },
    address: {
      ...string,
      description:
        'The address ifname’s holder uses, with its prefix: the sandbox’s, or with guestLink "redirect" the guest’s',
    },
    router: {
      ...string,
      description:
        'The default route’s next hop: the host’s end of the link, or with guestLink "redirect" Moat’s inner end',
    },
    guestLink: { type: 'string', enum: ['routed', 'redirect'] },
  },
  'Moat extension, network-only sandboxes: Moat’s link into the namespace it adopted',
);

export const detailSchema = withOptional(
  object({
    ...listedProperties,
    envdAccessToken: nullableString,
    allowInternetAccess: { type: ['boolean', 'null'] },
    domain: { type: 'null' },
    network: withOptional(
      object({
        allowPublicTraffic: { type: 'boolean' },
        allowOut: stringList,
        denyOut: stringList,
        maskRequestHost: nullableString,
        egressProxy: {
          type: ['object', 'null'],
          properties: { address: string, username: string },
          required: ['address'],
          additionalProperties: false,
          description: 'The SOCKS5 proxy allowed TCP is tunnelled through (never its password)',
        },
        httpsPorts: { type: 'array', items: { type: 'integer' } },
        bandwidth: object(
          { egressMbps: { type: 'integer' }, ingressMbps: { type: 'integer' } },
          'Moat extension: Mbit/s each way (0: unlimited), the operator’s default where network.bandwidth left it out; see egress.bandwidthEnforced',
        ),
        mode: {
          type: 'string',
          enum: [...NETWORK_MODES],
          description:
            'Moat extension: enforce, or report (what the sandbox’s rules deny is let through and recorded with wouldDeny); fixed at create (the operator’s default where network.mode left it out), kept by a PUT that names none',
        },
      }),
      {
        rules: {
          type: 'object',
          additionalProperties: {
            type: 'array',
            items: {
              type: 'object',
              properties: {
                transform: {
                  type: 'object',
                  properties: {
                    headers: { type: 'object', additionalProperties: { type: 'string' } },
                    ...SHOWN_REQUEST_ACCESS,
                  },
                },
                ...SHOWN_REQUEST_ACCESS,
              },
            },
          },
          description: 'network.rules as stored (keys canonical); absent when there are none',
        },
        presets: {
          type: 'array',
          items: object({
            name: string,
            version: { type: 'integer' },
            entries: stringList,
          }),
          description:
            'Moat extension: each preset:NAME of allowOut, once, with the version and entries it expands to; absent when allowOut names none',
        },
      },
    ),
    lifecycle: object({
      autoResume: { type: 'boolean' },
      onTimeout: { type: 'string', enum: ['kill', 'pause'] },
    }),
    egress: egressSchema,
    flows: flowTotalsSchema,
    confinement: {
      type: 'string',
      enum: ['confined', 'unconfined'],
      description:
        'Moat extension: confined (own namespaces and host ids, seccomp, limits) or unconfined (--unconfined-sandboxes: processes run as Moat’s own user)',
    },
  }),
  { link: linkSchema },
);

/** The reply to create: a network-only sandbox's adds `egress` and `link`. */
export const createReplySchema = withOptional(createdSchema, {
  egress: egressSchema,
  link: linkSchema,
});

export const snapshotSchema = object({ snapshotID: string, names: stringList });

export const forkResultsSchema = {
  type: 'array',
  description: 'One entry per requested fork: exactly one of sandbox or error',
  items: {
    type: 'object',
    properties: { sandbox: createdSchema, error: errorSchema },
    additionalProperties: false,
  },
};

export const metricSchema = object(
  {
    timestamp: { type: 'string', format: 'date-time' },
    timestampUnix: { ...integer, description: 'Seconds since the epoch' },
    cpuCount: integer,
    cpuUsedPct: { type: 'number', description: 'Share of its CPUs used over the last 5 s' },
    memUsed: { ...integer, description: 'Bytes, page cache not counted' },
    memTotal: { ...integer, description: 'Its memory bound in bytes' },
    memCache: { ...integer, description: 'Page cache in bytes' },
    diskUsed: { ...integer, description: 'Bytes used on its disk' },
    diskTotal: { ...integer, description: 'Its disk’s size in bytes' },
  },
  'One sample of a sandbox’s use, taken every 5 s',
);

export const templatesSchema = {
  type: 'array',
  items: object({
    templateID: string,
    snapshotID: nullableString,
    tag: string,
    aliases: stringList,
    names: stringList,
    sourceSandboxID: nullableString,
    createdAt: { type: 'string', format: 'date-time' },
    buildStatus: string,
    public: { type: 'boolean' },
  }),
};
