/** What the lifecycle is asked (the platform API's requests, checked), and how it refuses. */
import type { NetworkMode } from '../policy/index.js';
import type { Order } from './pages.js';
import type {
  BandwidthSettings,
  EgressProxySettings,
  SandboxRecord,
  SandboxState,
} from './records.js';

/** A refusal with the HTTP status the platform API answers it with. */
export class SandboxError extends Error {
  override readonly name = 'SandboxError';
  constructor(
    readonly status: 400 | 404 | 409 | 500 | 501 | 503,
    message: string,
  ) {
    super(message);
  }
}

export const notFound = (sandboxID: string) =>
  new SandboxError(404, `Sandbox "${sandboxID}" doesn't exist or you don't have access to it`);

/** What `lookup` answers, or undefined when it answers 404; every other error still throws. */
export const unlessNotFound = <T>(lookup: Promise<T>): Promise<T | undefined> =>
  lookup.catch((error: unknown) => {
    if (error instanceof SandboxError && error.status === 404) return undefined;
    throw error;
  });

/** The egress rules of a PUT network body (and of the create body's `network`). */
export interface EgressRules {
  readonly allowOut?: readonly string[];
  readonly denyOut?: readonly string[];
  readonly allow_internet_access?: boolean;
  readonly egressProxy?: EgressProxySettings | null;
  /** `network.rules`: headers Moat sets on requests to a destination (as the client sent them). */
  readonly rules?: Readonly<Record<string, unknown>>;
  /** Moat's `network.bandwidth`; left out, the operator's defaults. */
  readonly bandwidth?: BandwidthSettings;
  /** Moat's `network.mode`; left out, the operator's default. */
  readonly mode?: NetworkMode;
}

/** The create body's `iam` (E2B's workload identity), as the API schema lets it through. */
export interface IamRequest {
  readonly tokens?: Readonly<
    Record<string, { readonly audience: string; readonly tokenType: string }>
  >;
}

export interface CreateRequest {
  readonly templateID: string;
  readonly timeout?: number;
  readonly autoPause?: boolean;
  /** false: the expiry pause keeps files only (requires autoPause). */
  readonly autoPauseMemory?: boolean;
  readonly autoResume?: { readonly enabled?: boolean };
  readonly secure?: boolean;
  readonly allow_internet_access?: boolean;
  readonly network?: {
    readonly allowOut?: readonly string[];
    readonly denyOut?: readonly string[];
    readonly allowPublicTraffic?: boolean;
    readonly maskRequestHost?: string;
    readonly egressProxy?: EgressProxySettings | null;
    readonly httpsPorts?: readonly number[];
    readonly rules?: Readonly<Record<string, unknown>>;
    readonly bandwidth?: BandwidthSettings;
    readonly mode?: NetworkMode;
  };
  readonly metadata?: Readonly<Record<string, string>>;
  readonly envVars?: Readonly<Record<string, string>>;
  /** Template `network-only`: the network namespace to adopt (a path). */
  readonly netns?: string;
  /** Template `network-only`: Moat's interface in that namespace (default `moat0`). */
  readonly ifname?: string;
  /** Template `network-only`: how a guest behind the namespace reaches Moat (GuestLink). */
  readonly guestLink?: string;
  /** E2B's workload identity: tokens the network rules may name. */
  readonly iam?: IamRequest;
}

export interface SandboxQuery {
  readonly states: readonly SandboxState[];
  readonly metadata: Readonly<Record<string, string>>;
  readonly template?: string;
  /** Started at or after this time (ms), as the SDK documents it. */
  readonly startedAfter?: number;
  readonly order: Order;
  readonly limit: number;
  readonly nextToken?: string;
}

export interface SnapshotQuery {
  readonly sandboxID?: string;
  readonly name?: string;
  readonly limit: number;
  readonly nextToken?: string;
}

/** Most sandboxes one fork request makes. */
export const MAX_FORKS = 10;

/** One fork's outcome: the new sandbox, or why it was not made. */
export type ForkResult = SandboxRecord | SandboxError;

/** Time to live of a sandbox whose create request names none (seconds; 15, the reference service's default). */
export const DEFAULT_TIMEOUT = 15;
/**
 * The lifecycle fields of a create request, checked as the SDK documents them: autoResume and
 * a files-only expiry pause need `autoPause` (onTimeout 'pause'), and cannot go together (a
 * files-only pause must be resumed explicitly).
 */
export function checkLifecycle(
  request: CreateRequest,
): Pick<SandboxRecord, 'autoPause' | 'autoPauseMemory' | 'autoResume'> {
  const autoPause = request.autoPause ?? false;
  const autoResume = request.autoResume?.enabled ?? false;
  const memory = request.autoPauseMemory;
  if (autoResume && !autoPause) {
    throw new SandboxError(
      400,
      'autoResume.enabled true requires autoPause true (lifecycle.onTimeout "pause"): a killed sandbox cannot resume',
    );
  }
  if (memory !== undefined && !autoPause) {
    throw new SandboxError(
      400,
      'autoPauseMemory (onTimeout.keepMemory) is only allowed with autoPause true (lifecycle.onTimeout "pause")',
    );
  }
  if (memory === false && autoResume) {
    throw new SandboxError(
      400,
      'autoResume.enabled true cannot be combined with autoPauseMemory false: a files-only pause must be resumed explicitly with connect',
    );
  }
  return { autoPause, autoResume, ...(memory === undefined ? {} : { autoPauseMemory: memory }) };
}
