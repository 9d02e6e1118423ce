/**
 * How each kind of setting value is written as text, and its parser (text to a typed value or
 * an error saying what was expected): addresses, resolver lists, ranges, names, ports. The
 * settings table (config-settings.ts) picks one per setting.
 */
import { readFileSync } from 'node:fs';
import { type CIDR, parseCIDR, parseIP, type Result } from './policy/index.js';
import { formatHostPort, type HostPort } from './net/index.js';
import { type IdRangeSetting, IDS_PER_SANDBOX } from './runtime/index.js';

/** A file or folder path, or "off" (undefined). */
export const optionalPath =
  (what: 'file' | 'folder') =>
  (text: string): Result<string | undefined> => {
    if (text === 'off') return { ok: true, value: undefined };
    return text.trim() === ''
      ? { ok: false, error: `expected a ${what} path or "off", got an empty string` }
      : { ok: true, value: text };
  };

export const optionalFile = optionalPath('file');

export const positiveInteger =
  (max: number) =>
  (text: string): Result<number> =>
    /^[1-9][0-9]*$/.test(text) && Number(text) <= max
      ? { ok: true, value: Number(text) }
      : {
          ok: false,
          error: `expected a whole number from 1 to ${max}, got ${JSON.stringify(text)}`,
        };

/** 0 to `max` (0 usually meaning "no limit"). */
export const wholeNumber =
  (max: number) =>
  (text: string): Result<number> =>
    /^(0|[1-9][0-9]*)$/.test(text) && Number(text) <= max
      ? { ok: true, value: Number(text) }
      : {
          ok: false,
          error: `expected a whole number from 0 to ${max}, got ${JSON.stringify(text)}`,
        };

/** A CA file path, or `generated` (undefined: the CA Moat makes in its data folder). */
export function caFile(text: string): Result<string | undefined> {
  if (text === 'generated') return { ok: true, value: undefined };
  return text.trim() === ''
    ? { ok: false, error: 'expected a file path or "generated", got an empty string' }
    : { ok: true, value: text };
}

/**
 * `ip:port`, `[ipv6]:port`, or a bare IP when a default port applies. Port 0 = any free port.
 * `localhost` means 127.0.0.1 (never a lookup: /etc/hosts may also give it ::1).
 */
export function hostPort(text: string, defaultPort?: number): Result<HostPort> {
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
export function systemResolvers(): Result<HostPort[]> {
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

export function resolverList(text: string): Result<HostPort[]> {
  if (text.trim() === 'system') return systemResolvers();
  const servers: HostPort[] = [];
  for (const entry of text.split(',')) {
    const server = hostPort(entry, 53);
    if (!server.ok) return server;
    servers.push(server.value);
  }
  return { ok: true, value: servers };
}

export const booleanValue = (text: string): Result<boolean> =>
  text === 'true' || text === 'false'
    ? { ok: true, value: text === 'true' }
    : { ok: false, error: `expected true or false, got ${JSON.stringify(text)}` };

/** A parser accepting exactly one of `choices`. */
export const oneOf =
  <T extends string>(choices: readonly T[]) =>
  (text: string): Result<T> =>
    (choices as readonly string[]).includes(text)
      ? { ok: true, value: text as T }
      : { ok: false, error: `expected one of ${choices.join(', ')}, got ${JSON.stringify(text)}` };

/** An IPv4 range no narrower than /longestPrefix. */
export const ipv4Range =
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
export const idRange = (text: string): Result<IdRangeSetting> => {
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

export const storeLocation = (text: string): Result<string> => {
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
export function portList(text: string): Result<ReadonlySet<number>> {
  if (text.trim() === 'none') return { ok: true, value: new Set() };
  const ports = new Set<number>();
  for (const [index, raw] of text.split(',').entries()) {
    const port = positiveInteger(65535)(raw.trim());
    if (!port.ok) return { ok: false, error: `port ${index + 1}: ${port.error}, or "none"` };
    ports.add(port.value);
  }
  return { ok: true, value: ports };
}

export const showOptional = (value: HostPort | undefined): string =>
  value === undefined ? 'off' : formatHostPort(value);
export const optionalHostPort = (text: string): Result<HostPort | undefined> =>
  text === 'off' ? { ok: true, value: undefined } : hostPort(text);

/** A node's name or a team namespace: lower-case letters, digits and "-", 1 to 63. */
export const LOWER_NAME = /^[a-z0-9][a-z0-9-]{0,62}$/;

/** Whether `text` can name a node (a kept `--node-id auto` name is checked again at start). */
export const isNodeID = (text: string): boolean => LOWER_NAME.test(text);

export function lowerName(text: string): Result<string> {
  return LOWER_NAME.test(text)
    ? { ok: true, value: text }
    : {
        ok: false,
        error: `expected lower-case letters, digits and "-", got ${JSON.stringify(text)}`,
      };
}

/**
 * The identity issuer: an `https://` URL (or `http://`, for a test or a front that adds TLS)
 * without credentials, query or fragment, kept without a trailing slash (the discovery paths
 * are appended to it); or "off".
 */
export function issuerUrl(text: string): Result<string | undefined> {
  if (text === 'off') return { ok: true, value: undefined };
  const expected = `expected an https:// URL without query, fragment or credentials (as https://moat.example.com), or "off", got ${JSON.stringify(text)}`;
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return { ok: false, error: expected };
  }
  if (
    (url.protocol !== 'https:' && url.protocol !== 'http:') ||
    url.username !== '' ||
    url.password !== '' ||
    url.search !== '' ||
    url.hash !== '' ||
    text.includes('?') ||
    text.includes('#')
  )
    return { ok: false, error: expected };
  return { ok: true, value: url.href.replace(/\/+$/, '') };
}

/** A SPIFFE trust domain (lower-case letters, digits, ".", "-", "_"), or "issuer": its host. */
export function trustDomain(text: string): Result<string | undefined> {
  if (text === 'issuer') return { ok: true, value: undefined };
  return /^[a-z0-9._-]{1,255}$/.test(text)
    ? { ok: true, value: text }
    : {
        ok: false,
        error: `expected a trust domain of lower-case letters, digits, ".", "-" and "_" (as example.org), or "issuer", got ${JSON.stringify(text)}`,
      };
}
