/**
 * What the store holds for sandboxes and snapshots, and the checks that a loaded record is one
 * of ours: a record that does not fit stops start-up with its key named, never dropped.
 */
import { NETWORK_MODES, type NetworkMode } from '../policy/index.js';
import { GUEST_LINKS, type GuestLink, type SandboxLimits } from '../runtime/index.js';
import type { JsonValue } from '../store/index.js';

export const SANDBOXES = 'sandboxes';
export const TEMPLATES = 'templates';

export type SandboxState = 'running' | 'paused';

/** The network settings of a sandbox, exactly as accepted (entries as the client wrote them). */
export interface NetworkSettings {
  readonly allowOut: readonly string[];
  readonly denyOut: readonly string[];
  readonly allowInternetAccess: boolean | null;
  readonly allowPublicTraffic: boolean;
  readonly maskRequestHost: string | null;
  /** The operator's SOCKS5 proxy its allowed TCP goes through (absent in older records: none). */
  readonly egressProxy?: EgressProxySettings | null;
  /** Its ports that serve TLS, which ingress reaches over TLS (absent in older records: none). */
  readonly httpsPorts?: readonly number[];
  /** `network.rules`, keys canonical, values as written (absent: none). */
  readonly rules?: Readonly<Record<string, JsonValue>>;
  /** `network.bandwidth` as the client set it; what it leaves out is the operator's default. */
  readonly bandwidth?: BandwidthSettings;
  /** `network.mode`, fixed at create (absent in older records: enforce). */
  readonly mode?: NetworkMode;
}

/** Moat's `network.bandwidth`: Mbit/s each way, 0 unlimited. */
export interface BandwidthSettings {
  readonly egressMbps?: number;
  readonly ingressMbps?: number;
}

/** E2B's `network.egressProxy`, as accepted; the password is a secret the API never returns. */
export interface EgressProxySettings {
  readonly address: string;
  readonly username?: string;
  readonly password?: string;
}

export interface SandboxRecord {
  readonly sandboxID: string;
  /** The template it was made from: `base` or a snapshot ID. */
  readonly templateID: string;
  readonly alias: string | null;
  readonly state: SandboxState;
  /** Milliseconds since the epoch. */
  readonly startedAt: number;
  /** When it expires (running) or expired into a pause (paused). */
  readonly endAt: number;
  readonly autoPause: boolean;
  /** An expiry pause keeps its processes (absent: true); false pauses it as files only. */
  readonly autoPauseMemory?: boolean;
  readonly autoResume: boolean;
  /** Paused as files only: its processes were ended, and resuming cold-boots it. */
  readonly filesOnly?: boolean;
  readonly secure: boolean;
  readonly envdAccessToken: string | null;
  readonly trafficAccessToken: string | null;
  /** The password half of its egress proxy credential. */
  readonly egressSecret: string;
  /** The address its traffic comes from. */
  readonly sourceAddress: string;
  readonly metadata: Readonly<Record<string, string>>;
  readonly envVars: Readonly<Record<string, string>>;
  readonly network: NetworkSettings;
  /** Its cgroup and disk bounds (absent in records from before limits: the defaults apply). */
  readonly limits?: SandboxLimits;
  /** The node that hosts it, when many nodes share a store (absent: this node). */
  readonly node?: string;
  /** Network-only (template `network-only`): the namespace it adopted. Absent: Moat runs it. */
  readonly link?: AdoptedLinkSettings;
  /** E2B's `iam`: the workload identity tokens its rules may name (absent: none). */
  readonly iam?: IamSettings;
}

/** A sandbox's workload identity tokens by name: who each is for, and its type. */
export interface IamSettings {
  readonly tokens: Readonly<
    Record<string, { readonly audience: string; readonly tokenType: 'JWT-SVID' }>
  >;
}

/**
 * The namespace a network-only sandbox adopted: the path and interface name as the create
 * request gave them, and the namespace's identity then (a restart re-adopts only that one).
 */
export interface AdoptedLinkSettings {
  readonly netns: string;
  readonly ifname: string;
  /** Absent: "routed". */
  readonly guestLink?: GuestLink;
  readonly identity: { readonly device: number; readonly inode: number };
}

/** A snapshot: a copy of a sandbox's writable root, usable as a template. */
export interface SnapshotRecord {
  /** `<team namespace>/<alias>:<tag>` when named, else `<templateID>:<tag>`. */
  readonly snapshotID: string;
  /** The template part of the ID (`<team namespace>/<alias>` or a generated ID). */
  readonly templateID: string;
  readonly tag: string;
  readonly alias: string | null;
  readonly names: readonly string[];
  /** The sandbox it was taken from. */
  readonly sandboxID: string;
  readonly createdAt: number;
  /** The limits of the sandbox it was taken from: what sandboxes made from it get. */
  readonly limits?: SandboxLimits;
  /** The node whose data folder holds its files, when many nodes share a store. */
  readonly node?: string;
}

type Shape = Record<string, (value: unknown) => boolean>;

const isString = (v: unknown) => typeof v === 'string';
const isNullableString = (v: unknown) => v === null || typeof v === 'string';
const isBoolean = (v: unknown) => typeof v === 'boolean';
const isOptionalBoolean = (v: unknown) => v === undefined || isBoolean(v);
const isTime = (v: unknown) => Number.isSafeInteger(v);
const isStringList = (v: unknown) => Array.isArray(v) && v.every(isString);
const isStringMap = (v: unknown) =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && Object.values(v).every(isString);
const fits = (value: unknown, shape: Shape) =>
  typeof value === 'object' &&
  value !== null &&
  Object.entries(shape).every(([key, check]) => check((value as Record<string, unknown>)[key]));

const isPort = (v: unknown) => Number.isInteger(v) && (v as number) >= 1 && (v as number) <= 65535;
const isCount = (v: unknown) => Number.isSafeInteger(v) && (v as number) > 0;
const isRate = (v: unknown) => Number.isSafeInteger(v) && (v as number) >= 0;
const LIMITS: Shape = { cpuCount: isCount, memoryMB: isCount, diskSizeMB: isCount, pids: isCount };
const isLimits = (v: unknown) => v === undefined || fits(v, LIMITS);

const isIam = (v: unknown) =>
  v === undefined ||
  fits(v, {
    tokens: (tokens) =>
      typeof tokens === 'object' &&
      tokens !== null &&
      !Array.isArray(tokens) &&
      Object.values(tokens).every((token) =>
        fits(token, { audience: isString, tokenType: (t) => t === 'JWT-SVID' }),
      ),
  });

const NETWORK: Shape = {
  allowOut: isStringList,
  denyOut: isStringList,
  allowInternetAccess: (v) => v === null || isBoolean(v),
  allowPublicTraffic: isBoolean,
  maskRequestHost: isNullableString,
  egressProxy: (v) =>
    v === undefined ||
    v === null ||
    fits(v, {
      address: isString,
      username: (u) => u === undefined || isString(u),
      password: (p) => p === undefined || isString(p),
    }),
  httpsPorts: (v) => v === undefined || (Array.isArray(v) && v.every(isPort)),
  mode: (v) => v === undefined || NETWORK_MODES.includes(v as NetworkMode),
  bandwidth: (v) =>
    v === undefined ||
    fits(v, {
      egressMbps: (r) => r === undefined || isRate(r),
      ingressMbps: (r) => r === undefined || isRate(r),
    }),
  // Checked in full when compiled: a stored rule set that no longer parses is enforced deny-all.
  rules: (v) => v === undefined || (typeof v === 'object' && v !== null && !Array.isArray(v)),
};

const SANDBOX: Shape = {
  sandboxID: isString,
  templateID: isString,
  alias: isNullableString,
  state: (v) => v === 'running' || v === 'paused',
  startedAt: isTime,
  endAt: isTime,
  autoPause: isBoolean,
  autoPauseMemory: isOptionalBoolean,
  autoResume: isBoolean,
  filesOnly: isOptionalBoolean,
  secure: isBoolean,
  envdAccessToken: isNullableString,
  trafficAccessToken: isNullableString,
  egressSecret: isString,
  sourceAddress: isString,
  metadata: isStringMap,
  envVars: isStringMap,
  network: (v) => fits(v, NETWORK),
  limits: isLimits,
  node: (v) => v === undefined || isString(v),
  link: (v) =>
    v === undefined ||
    fits(v, {
      netns: isString,
      ifname: isString,
      guestLink: (g) => g === undefined || GUEST_LINKS.includes(g as GuestLink),
      identity: (i) => fits(i, { device: isTime, inode: isTime }),
    }),
  iam: isIam,
};

const SNAPSHOT: Shape = {
  snapshotID: isString,
  templateID: isString,
  tag: isString,
  alias: isNullableString,
  names: isStringList,
  sandboxID: isString,
  createdAt: isTime,
  limits: isLimits,
  node: (v) => v === undefined || isString(v),
};

function check<T>(value: JsonValue, key: string, shape: Shape, what: string): T {
  if (!fits(value, shape)) {
    throw new Error(
      `the store holds a ${what} record ${JSON.stringify(key)} that this version of Moat does not understand; restore the data folder that belongs to this version`,
    );
  }
  return value as unknown as T;
}

export const readSandbox = (value: JsonValue, key: string): SandboxRecord =>
  check(value, key, SANDBOX, 'sandbox');

export const readSnapshot = (value: JsonValue, key: string): SnapshotRecord =>
  check(value, key, SNAPSHOT, 'snapshot');

export const asJson = (record: SandboxRecord | SnapshotRecord): JsonValue =>
  record as unknown as JsonValue;
