/**
 * Destinations: what a decision is about. Parsing here is strict and done by hand, never by the
 * WHATWG URL parser, which rewrites `0x7f.1` to `127.0.0.1` behind the caller's back.
 */
import type { IPAddress } from './address.js';
import { type CanonicalName, parseHost } from './host.js';
import type { PortRange } from './ports.js';
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
 * A rule's ports as written after its destination: `443` or `8000-8100`. Undefined means every
 * port, so `1-65535` is read as no port at all: one spelling per meaning.
 */
export function parsePortRange(text: string): Result<PortRange | undefined> {
  if (text === '') return err('has ":" but no port after it');
  const dash = text.indexOf('-');
  const from = parsePort(dash < 0 ? text : text.slice(0, dash));
  if (!from.ok) return from;
  const to = dash < 0 ? from : parsePort(text.slice(dash + 1));
  if (!to.ok) return to;
  if (to.value < from.value)
    return err(`port range ${JSON.stringify(text)} is reversed: write ${to.value}-${from.value}`);
  if (from.value === 1 && to.value === 65535) return ok(undefined);
  return ok({ from: from.value, to: to.value });
}

/**
 * Splits a rule entry into what it names and its ports: `name:443`, `*.name:443`,
 * `1.2.3.0/24:8000-8100`, `[2001:db8::/32]:443`. Without brackets, more than one colon can only
 * be a bare IPv6 address or network, which takes no port (write it in brackets to give one).
 */
export function splitEntryPorts(
  entry: string,
): Result<{ readonly target: string; readonly ports: PortRange | undefined }> {
  let target = entry;
  let portText: string | undefined;
  if (entry.startsWith('[')) {
    const close = entry.indexOf(']');
    if (close < 0) return err('has "[" without "]"');
    target = entry.slice(1, close);
    if (!target.includes(':'))
      return err('has brackets around something that is not an IPv6 address or network');
    const rest = entry.slice(close + 1);
    // One spelling per meaning: brackets are only for giving an IPv6 destination a port.
    if (rest === '') return err(`has brackets but no port: write ${target}, or [${target}]:PORT`);
    if (!rest.startsWith(':')) return err('has text after "]" that is not ":port"');
    portText = rest.slice(1);
  } else {
    const colon = entry.indexOf(':');
    if (colon >= 0 && entry.indexOf(':', colon + 1) < 0) {
      target = entry.slice(0, colon);
      portText = entry.slice(colon + 1);
    }
  }
  if (portText === undefined) return ok({ target, ports: undefined });
  if (target === '') return err('names no destination before its port');
  const ports = parsePortRange(portText);
  return ports.ok ? ok({ target, ports: ports.value }) : ports;
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
