/**
 * Destinations: what a decision is about. Parsing here is strict and done by hand, never by the
 * WHATWG URL parser, which rewrites `0x7f.1` to `127.0.0.1` behind the caller's back.
 */
import type { IPAddress } from './address.js';
import { type CanonicalName, parseHost } from './host.js';
import { err, ok, type Result } from './result.js';

export interface Destination {
  /** The host name the client asked for, canonical. */
  readonly host?: CanonicalName;
  /** The address being (or to be) dialled. */
  readonly ip?: IPAddress;
  readonly port?: number;
}

/**
 * Every destination has the same three properties in the same order, present even when
 * undefined: decide() then reads them through one hidden class instead of a megamorphic
 * lookup (spreads and optional properties gave almost every parsed destination its own shape).
 */
export const destination = (
  host: CanonicalName | undefined,
  ip: IPAddress | undefined,
  port: number | undefined,
): Destination => ({
  host,
  ip,
  port,
});

const DEFAULT_PORTS: Readonly<Record<string, number>> = { http: 80, https: 443, ws: 80, wss: 443 };

/** A decimal port 1-65535 without leading zeros. */
export function parsePort(text: string): Result<number> {
  if (!/^[1-9][0-9]{0,4}$/.test(text) || Number(text) > 65535) {
    return err(
      `port ${JSON.stringify(text)} is not a whole number from 1 to 65535 without leading zeros`,
    );
  }
  return ok(Number(text));
}

/**
 * Parses `host`, `host:port`, an IPv4 or bare IPv6 literal, or `[ipv6]:port`. Userinfo is
 * refused: `user@host` is a classic way to make two parsers disagree about the host.
 */
export function parseAuthority(text: string): Result<Destination> {
  if (text.includes('@'))
    return err(`${JSON.stringify(text)} has userinfo ("@"); give only host and port`);
  let hostText = text;
  let portText: string | undefined;
  if (text.startsWith('[')) {
    const close = text.indexOf(']');
    if (close < 0) return err(`${JSON.stringify(text)} has "[" without "]"`);
    hostText = text.slice(1, close);
    const rest = text.slice(close + 1);
    if (rest !== '') {
      if (!rest.startsWith(':'))
        return err(`${JSON.stringify(text)} has text after "]" that is not ":port"`);
      portText = rest.slice(1);
    }
    if (!hostText.includes(':'))
      return err(
        `${JSON.stringify(text)} has brackets around something that is not an IPv6 address`,
      );
  } else {
    const colon = text.indexOf(':');
    // More than one colon without brackets can only be a bare IPv6 address.
    if (colon >= 0 && text.indexOf(':', colon + 1) < 0) {
      hostText = text.slice(0, colon);
      portText = text.slice(colon + 1);
    }
  }
  if (hostText === '') return err(`${JSON.stringify(text)} has an empty host`);
  const host = parseHost(hostText);
  if (!host.ok) return host;
  let port: number | undefined;
  if (portText !== undefined) {
    const parsed = parsePort(portText);
    if (!parsed.ok) return parsed;
    port = parsed.value;
  }
  return ok(
    host.value.kind === 'ip'
      ? destination(undefined, host.value.ip, port)
      : destination(host.value.name, undefined, port),
  );
}

/** Parses a destination as users write it: an authority, or `scheme://authority[/path]`. */
export function parseDestination(text: string): Result<Destination> {
  const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\//.exec(text);
  if (!scheme) return parseAuthority(text);
  const rest = text.slice(scheme[0].length);
  const end = rest.search(/[/?#]/);
  const parsed = parseAuthority(end < 0 ? rest : rest.slice(0, end));
  if (!parsed.ok || parsed.value.port !== undefined) return parsed;
  const port = DEFAULT_PORTS[scheme[1]!.toLowerCase()];
  return port === undefined ? parsed : ok(destination(parsed.value.host, parsed.value.ip, port));
}

/** How a destination is shown in logs and CLI output: `host:port`, `[v6]:port`, `host (ip)`. */
export function formatDestination(destination: Destination): string {
  const { host, ip, port } = destination;
  const address =
    ip === undefined
      ? undefined
      : ip.version === 6 && port !== undefined
        ? `[${ip.text}]`
        : ip.text;
  const base =
    host !== undefined
      ? address === undefined
        ? host
        : `${host} (${ip!.text})`
      : (address ?? '?');
  return port === undefined ? base : `${base}:${port}`;
}
