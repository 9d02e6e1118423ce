/**
 * A deliberately naive reference for the policy semantics of design.md ("Policy semantics"),
 * written independently of src/policy: addresses are parsed and matched with ipaddr.js, names
 * with plain string logic, and a decision is a linear scan over every rule. Nothing here imports
 * the engine. Used by the property test and, for its tables, by the other suites.
 */
import ipaddr from 'ipaddr.js';

type Address = ReturnType<typeof ipaddr.parse>;

/** A prefix as the reference sees it: IPv4-mapped IPv6 prefixes (/96 and longer) are IPv4. */
export interface RefRange {
  readonly addr: Address;
  readonly len: number;
}

/**
 * Parses `a/len` or a bare address (= /32, /128). Only give it canonical spellings: ipaddr.js
 * accepts the octal/hex/short IPv4 forms and misreads `::a.b.c.d` as IPv4-mapped.
 */
export function refRange(text: string): RefRange {
  let addr: Address;
  let len: number;
  if (text.includes('/')) {
    [addr, len] = ipaddr.parseCIDR(text);
  } else {
    addr = ipaddr.parse(text);
    len = addr.kind() === 'ipv4' ? 32 : 128;
  }
  if (addr.kind() === 'ipv6' && len >= 96 && (addr as ipaddr.IPv6).isIPv4MappedAddress()) {
    return { addr: (addr as ipaddr.IPv6).toIPv4Address(), len: len - 96 };
  }
  return { addr, len };
}

/** Parses an address (brackets allowed); IPv4-mapped IPv6 is IPv4 (design.md). */
export function refAddress(text: string): Address {
  const bare = text.startsWith('[') ? text.slice(1, -1) : text;
  const addr = ipaddr.parse(bare);
  if (addr.kind() === 'ipv6' && (addr as ipaddr.IPv6).isIPv4MappedAddress()) {
    return (addr as ipaddr.IPv6).toIPv4Address();
  }
  return addr;
}

/** A stable key for an address: normalised text, IPv4-mapped folded to IPv4. */
export const refKey = (text: string): string => refAddress(text).toNormalizedString();

export function refContains(range: RefRange, addr: Address): boolean {
  return range.addr.kind() === addr.kind() && addr.match(range.addr, range.len);
}

/** The value of an address as a BigInt. */
export function toBigInt(addr: Address): bigint {
  return addr.toByteArray().reduce((acc, byte) => (acc << 8n) | BigInt(byte), 0n);
}

/** True when every bit inside the prefix is zero (the unspecified network). */
export function refIsZeroNetwork(range: RefRange): boolean {
  const width = range.addr.kind() === 'ipv4' ? 32n : 128n;
  return toBigInt(range.addr) >> (width - BigInt(range.len)) === 0n;
}

/** Canonical name by plain string logic: one trailing dot dropped, lower case. */
export const refCanon = (name: string): string =>
  (name.endsWith('.') ? name.slice(0, -1) : name).toLowerCase();

/**
 * The deciding name rule for a canonical name: an exact rule (first one written) beats every
 * wildcard; among wildcards the deepest wins. `*.d` matches names ending in `.d`, never `d`.
 */
export function refMatchName(rules: readonly string[], name: string): string | undefined {
  const exact = rules.find((rule) => !rule.startsWith('*.') && refCanon(rule) === name);
  if (exact !== undefined) return exact;
  let best: string | undefined;
  let bestLength = -1;
  for (const rule of rules) {
    if (!rule.startsWith('*.')) continue;
    const domain = refCanon(rule.slice(2));
    if (name.endsWith(`.${domain}`) && domain.length > bestLength) {
      best = rule;
      bestLength = domain.length;
    }
  }
  return best;
}

/** An address-list entry: a prefix, or one that covers every IPv4 and IPv6 address at /0. */
export interface RefAddressEntry {
  readonly rule: string;
  readonly range: RefRange | 'everything';
}

/** Longest matching prefix over a list; the first entry wins among equal lengths. */
export function refLongestMatch(
  entries: readonly RefAddressEntry[],
  addr: Address,
): string | undefined {
  let best: string | undefined;
  let bestLength = -1;
  for (const entry of entries) {
    const length =
      entry.range === 'everything' ? 0 : refContains(entry.range, addr) ? entry.range.len : -1;
    if (length > bestLength) {
      best = entry.rule;
      bestLength = length;
    }
  }
  return best;
}

export const refEntries = (texts: readonly string[]): RefAddressEntry[] =>
  texts.map((text) => ({ rule: text.trim(), range: refRange(text.trim()) }));

/**
 * The default hard internal deny list, written out from the IANA IPv4/IPv6 Special-Purpose
 * Address Registries and design.md (loopback, private, link-local/metadata, CGNAT, unspecified,
 * multicast, NAT64/6to4/Teredo, documentation, benchmarking, reserved).
 */
export const REF_DEFAULT_INTERNAL: readonly string[] = [
  '0.0.0.0/8',
  '10.0.0.0/8',
  '100.64.0.0/10',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.0.2.0/24',
  '192.88.99.0/24',
  '192.168.0.0/16',
  '198.18.0.0/15',
  '198.51.100.0/24',
  '203.0.113.0/24',
  '224.0.0.0/4',
  '240.0.0.0/4',
  '::/96',
  '64:ff9b::/96',
  '64:ff9b:1::/48',
  '100::/64',
  '100:0:0:1::/64',
  '2001::/23',
  '2001:db8::/32',
  '2002::/16',
  '3fff::/20',
  '5f00::/16',
  'fc00::/7',
  'fe80::/10',
  'fec0::/10',
  'ff00::/8',
];

export interface RefRule {
  readonly kind: 'cidr' | 'name' | 'wildcard';
  readonly text: string;
}

export interface RefConfig {
  readonly allowOut: readonly RefRule[];
  readonly denyOut: readonly string[];
  readonly allowInternetAccess: boolean | undefined;
}

export interface RefDestination {
  /** As written (any case, optional trailing dot). */
  readonly host?: string;
  /** Canonical text, IPv6 optionally in brackets. */
  readonly ip?: string;
  readonly port?: number;
}

export interface RefDecision {
  readonly verdict: 'allow' | 'deny';
  readonly list: 'allowOut' | 'denyOut' | 'internal' | 'learned' | 'default' | 'invalid';
  readonly rule: string | null;
}

export const refDeniesAll = (config: RefConfig): boolean =>
  config.denyOut.includes('0.0.0.0/0') || config.allowInternetAccess === false;

/** design.md: a domain in allowOut without ALL_TRAFFIC (or allow_internet_access=false) is a 400. */
export const refIsValid = (config: RefConfig): boolean =>
  refDeniesAll(config) || config.allowOut.every((rule) => rule.kind === 'cidr');

/**
 * design.md's decision order, by linear scans. `learned` maps refKey(address) to the names the
 * address was learned for, in the order the table gives them.
 */
export function refDecide(
  config: RefConfig,
  internal: readonly string[],
  destination: RefDestination,
  learned?: ReadonlyMap<string, readonly string[]>,
): RefDecision {
  const { port } = destination;
  if (port !== undefined && !(Number.isInteger(port) && port >= 1 && port <= 65535)) {
    return { verdict: 'deny', list: 'invalid', rule: null };
  }
  const ip = destination.ip === undefined ? undefined : refAddress(destination.ip);
  const host = destination.host === undefined ? undefined : refCanon(destination.host);
  const nameRules = config.allowOut.filter((rule) => rule.kind !== 'cidr').map((rule) => rule.text);
  // 1. The hard internal deny list.
  if (ip !== undefined) {
    const rule = refLongestMatch(refEntries(internal), ip);
    if (rule !== undefined) return { verdict: 'deny', list: 'internal', rule };
  }
  // 2. allowOut names.
  if (host !== undefined) {
    const rule = refMatchName(nameRules, host);
    if (rule !== undefined) return { verdict: 'allow', list: 'allowOut', rule };
  }
  if (ip === undefined) {
    if (host === undefined) return { verdict: 'deny', list: 'invalid', rule: null };
    if (!refDeniesAll(config)) return { verdict: 'allow', list: 'default', rule: null };
    const rule = config.denyOut.includes('0.0.0.0/0') ? '0.0.0.0/0' : 'allow_internet_access=false';
    return { verdict: 'deny', list: 'denyOut', rule };
  }
  // 3. allowOut addresses.
  const allowed = refLongestMatch(
    config.allowOut
      .filter((rule) => rule.kind === 'cidr')
      .map((rule) => ({ rule: rule.text, range: refRange(rule.text) })),
    ip,
  );
  if (allowed !== undefined) return { verdict: 'allow', list: 'allowOut', rule: allowed };
  // 4. Learned addresses, only when the connection names no host, and only for names this
  // policy still allows.
  if (learned !== undefined && host === undefined) {
    const name = learned
      .get(ip.toNormalizedString())
      ?.find((learnedName) => refMatchName(nameRules, learnedName) !== undefined);
    if (name !== undefined) return { verdict: 'allow', list: 'learned', rule: name };
  }
  // 5. denyOut; 0.0.0.0/0 is ALL_TRAFFIC (IPv6 too), allow_internet_access=false likewise.
  const denyEntries: RefAddressEntry[] = config.denyOut.map((text) => ({
    rule: text,
    range: text === '0.0.0.0/0' ? 'everything' : refRange(text),
  }));
  if (config.allowInternetAccess === false) {
    denyEntries.push({ rule: 'allow_internet_access=false', range: 'everything' });
  }
  const denied = refLongestMatch(denyEntries, ip);
  if (denied !== undefined) return { verdict: 'deny', list: 'denyOut', rule: denied };
  // 6. Default allow.
  return { verdict: 'allow', list: 'default', rule: null };
}
