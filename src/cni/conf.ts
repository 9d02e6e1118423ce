/**
 * The plugin's input: the CNI_* environment and the network configuration on standard input
 * (one plugin's entry of moat.conflist, with the list's name and cniVersion, and the previous
 * plugin's result when chained).
 */
import { CNI_CODES, type CniResult, fail, type Outcome, SUPPORTED_VERSIONS } from './spec.js';

export const DEFAULT_API = 'http://127.0.0.1:3000';
/** Where Moat generates its key when started as deploy/systemd/moat.service starts it. */
export const DEFAULT_KEY_FILE = '/var/lib/moat/api-key';

export interface PluginConf {
  readonly cniVersion: string;
  readonly name: string;
  /** Moat's platform API, without a trailing slash. */
  readonly api: string;
  readonly keyFile: string;
  /** The PUT network body for the sandbox; undefined: deny everything. */
  readonly policy: Record<string, unknown> | undefined;
  /**
   * "redirect" for a chain whose next plugin joins CNI_IFNAME to a guest's tap below the IP
   * stack (firecracker-containerd's tc-redirect-tap); undefined: Moat's default, "routed".
   */
  readonly guestLink: 'routed' | 'redirect' | undefined;
  readonly prevResult: CniResult | undefined;
}

export type Command = 'ADD' | 'DEL' | 'CHECK' | 'VERSION';

export interface Invocation {
  readonly command: Command;
  readonly containerID: string;
  readonly netns: string;
  readonly ifname: string;
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/** The CNI_* variables `command` needs (DEL may come without a namespace, as the spec allows). */
export function invocationFrom(
  env: Readonly<Record<string, string | undefined>>,
): Outcome<Invocation> {
  const command = env.CNI_COMMAND ?? '';
  if (!['ADD', 'DEL', 'CHECK', 'VERSION'].includes(command))
    return fail(
      CNI_CODES.badEnvironment,
      `CNI_COMMAND ${JSON.stringify(command)} is not ADD, DEL, CHECK or VERSION`,
    );
  const needed =
    command === 'VERSION'
      ? []
      : command === 'DEL'
        ? ['CNI_CONTAINERID', 'CNI_IFNAME']
        : ['CNI_CONTAINERID', 'CNI_NETNS', 'CNI_IFNAME'];
  const missing = needed.filter((name) => (env[name] ?? '') === '');
  if (missing.length > 0)
    return fail(
      CNI_CODES.badEnvironment,
      `${command} needs ${missing.join(', ')} in the environment`,
    );
  return {
    ok: true,
    value: {
      command: command as Command,
      containerID: env.CNI_CONTAINERID ?? '',
      netns: env.CNI_NETNS ?? '',
      ifname: env.CNI_IFNAME ?? '',
    },
  };
}

/** The cniVersion a VERSION request asks about (its stdin may be empty). */
export function requestedVersion(text: string): string {
  try {
    const json = JSON.parse(text) as unknown;
    if (isObject(json) && typeof json.cniVersion === 'string') return json.cniVersion;
  } catch {
    // An empty or unreadable VERSION request is answered in the newest version.
  }
  return '1.0.0';
}

/** Parses and checks the network configuration; every error names the field at fault. */
export function parseConf(text: string): Outcome<PluginConf> {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    return fail(
      CNI_CODES.undecodable,
      `the network configuration on standard input is not JSON: ${(error as Error).message}`,
    );
  }
  if (!isObject(json))
    return fail(
      CNI_CODES.undecodable,
      'the network configuration on standard input is not a JSON object',
    );
  const bad = (msg: string) => fail(CNI_CODES.badConfig, `network configuration: ${msg}`);
  const {
    cniVersion,
    name,
    type,
    api = DEFAULT_API,
    keyFile = DEFAULT_KEY_FILE,
    policy,
    guestLink,
  } = json;
  if (typeof cniVersion !== 'string') return bad('cniVersion must be a string');
  if (!(SUPPORTED_VERSIONS as readonly string[]).includes(cniVersion))
    return fail(
      CNI_CODES.incompatibleVersion,
      `cniVersion ${cniVersion} is not one this plugin speaks (${SUPPORTED_VERSIONS.join(', ')})`,
    );
  if (typeof name !== 'string' || name === '') return bad('name must be a non-empty string');
  if (type !== 'moat') return bad(`type is ${JSON.stringify(type)}, this plugin is "moat"`);
  if (typeof api !== 'string' || !/^https?:\/\/[^/]/.test(api))
    return bad(`api ${JSON.stringify(api)} is not an http(s) URL of Moat's platform API`);
  if (typeof keyFile !== 'string' || !keyFile.startsWith('/'))
    return bad(`keyFile ${JSON.stringify(keyFile)} is not an absolute path`);
  if (policy !== undefined && !isObject(policy))
    return bad('policy must be an object shaped like the PUT /sandboxes/{id}/network body');
  if (guestLink !== undefined && guestLink !== 'routed' && guestLink !== 'redirect')
    return bad(`guestLink ${JSON.stringify(guestLink)} is not "routed" or "redirect"`);
  const prev = json.prevResult;
  if (prev !== undefined && !isObject(prev)) return bad('prevResult must be an object');
  for (const field of ['interfaces', 'ips', 'routes'] as const) {
    const list = (prev as Record<string, unknown> | undefined)?.[field];
    if (list !== undefined && !Array.isArray(list))
      return bad(`prevResult.${field} must be a list`);
  }
  return {
    ok: true,
    value: {
      cniVersion,
      name,
      api: api.replace(/\/+$/, ''),
      keyFile,
      policy,
      guestLink,
      prevResult: prev as CniResult | undefined,
    },
  };
}
