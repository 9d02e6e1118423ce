/**
 * What the CNI specification fixes for a plugin: the versions this one speaks, the error codes
 * (1-99 are the specification's, 100 and up the plugin's own) and the shapes of its answers.
 */

/** Result versions whose ADD answer this plugin writes (0.3.x and 0.4.0 add `version` to ips). */
export const SUPPORTED_VERSIONS = ['0.3.0', '0.3.1', '0.4.0', '1.0.0'] as const;

export const CNI_CODES = {
  incompatibleVersion: 1,
  unknownContainer: 3,
  badEnvironment: 4,
  ioFailure: 5,
  undecodable: 6,
  badConfig: 7,
  tryAgainLater: 11,
  /** Moat answered, and refused (its message is the error's). */
  moatRefused: 100,
  /** Moat refused the API key. */
  badKey: 101,
  /** CHECK found the sandbox, but not its link where the runtime says. */
  linkMissing: 102,
} as const;

/** A CNI error: printed on standard output as JSON, with a non-zero exit. */
export interface CniError {
  readonly code: number;
  readonly msg: string;
  readonly details?: string;
}

export type Outcome<T> = { ok: true; value: T } | { ok: false; error: CniError };

export const fail = (
  code: number,
  msg: string,
  details?: string,
): { ok: false; error: CniError } => ({
  ok: false,
  error: details === undefined ? { code, msg } : { code, msg, details },
});

export interface CniInterface {
  readonly name: string;
  readonly mac?: string;
  readonly sandbox?: string;
}

export interface CniIP {
  readonly address: string;
  readonly gateway?: string;
  readonly interface?: number;
  /** 0.3.x and 0.4.0 only. */
  readonly version?: '4' | '6';
}

export interface CniResult {
  readonly cniVersion: string;
  readonly interfaces?: CniInterface[];
  readonly ips?: CniIP[];
  readonly routes?: Array<{ dst: string; gw?: string }>;
  readonly dns?: { nameservers?: string[]; domain?: string; search?: string[] };
}
