/**
 * Strict IP and CIDR parsing.
 *
 * We do not use ipaddr.js here: it reads `::1.2.3.4` (IPv4-compatible) as the IPv4-mapped
 * `::ffff:1.2.3.4`, accepts `::ffff:01.2.3.4` and zone IDs, and its IPv4 parser accepts the
 * octal/hex/short spellings. A gateway must accept exactly one spelling per address.
 */
import { err, ok, type Result } from './result.js';

/** An IP address in canonical form. IPv4-mapped IPv6 addresses are always IPv4 here. */
export interface IPAddress {
  readonly version: 4 | 6;
  /** Big-endian 32-bit words: one for IPv4, four for IPv6. */
  readonly words: readonly number[];
  /** Canonical text: dotted quad, or RFC 5952 for IPv6. */
  readonly text: string;
}

export interface CIDR {
  readonly version: 4 | 6;
  /** Network address (host bits cleared). */
  readonly words: readonly number[];
  readonly prefixLength: number;
  /** True when the written address had bits set below the prefix (lint reports it). */
  readonly hadHostBits: boolean;
  /** Canonical text `network/len`. */
  readonly text: string;
}

export const addressBits = (version: 4 | 6): number => (version === 4 ? 32 : 128);

/** Parses a strict dotted quad: four decimal octets 0-255 without leading zeros. */
export function parseIPv4Words(s: string): number | undefined {
  let value = 0;
  let octets = 0;
  let i = 0;
  const n = s.length;
  while (i <= n) {
    let octet = 0;
    let digits = 0;
    const start = i;
    while (i < n) {
      const c = s.charCodeAt(i);
      if (c < 48 || c > 57) break;
      octet = octet * 10 + (c - 48);
      digits++;
      i++;
    }
    if (digits === 0 || digits > 3 || octet > 255) return undefined;
    if (digits > 1 && s.charCodeAt(start) === 48) return undefined; // leading zero: octal in some parsers
    value = (value * 256 + octet) >>> 0;
    octets++;
    if (i === n) break;
    if (s.charCodeAt(i) !== 46 || octets === 4) return undefined;
    i++;
  }
  return octets === 4 ? value : undefined;
}

function hexValue(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  if (c >= 65 && c <= 70) return c - 55;
  return -1;
}

/** Parses one IPv6 group list (no "::" inside) into 16-bit groups, or undefined. */
function parseGroups(s: string, allowTrailingV4: boolean): number[] | undefined {
  if (s === '') return [];
  const parts = s.split(':');
  const groups: number[] = [];
  for (let p = 0; p < parts.length; p++) {
    const part = parts[p]!;
    if (allowTrailingV4 && p === parts.length - 1 && part.includes('.')) {
      const v4 = parseIPv4Words(part);
      if (v4 === undefined) return undefined;
      groups.push(v4 >>> 16, v4 & 0xffff);
      continue;
    }
    if (part.length === 0 || part.length > 4) return undefined;
    let g = 0;
    for (let i = 0; i < part.length; i++) {
      const h = hexValue(part.charCodeAt(i));
      if (h < 0) return undefined;
      g = (g << 4) | h;
    }
    groups.push(g);
  }
  return groups;
}

/** Parses IPv6 text (no brackets, no zone) into eight 16-bit groups. */
function parseIPv6Groups(s: string): number[] | undefined {
  if (s.length < 2 || s.length > 45) return undefined;
  const gap = s.indexOf('::');
  if (gap < 0) {
    const groups = parseGroups(s, true);
    return groups?.length === 8 ? groups : undefined;
  }
  if (s.indexOf('::', gap + 1) >= 0) return undefined;
  const head = parseGroups(s.slice(0, gap), false);
  const tail = parseGroups(s.slice(gap + 2), true);
  if (!head || !tail || head.length + tail.length > 7) return undefined;
  return [...head, ...new Array<number>(8 - head.length - tail.length).fill(0), ...tail];
}

export function formatIPv4(word: number): string {
  return `${word >>> 24}.${(word >>> 16) & 255}.${(word >>> 8) & 255}.${word & 255}`;
}

/** RFC 5952: lower case, no leading zeros, the longest run (>= 2) of zero groups as "::". */
export function formatIPv6(words: readonly number[]): string {
  const groups: number[] = [];
  for (const w of words) groups.push(w >>> 16, w & 0xffff);
  let bestStart = -1;
  let bestLen = 1;
  for (let i = 0; i < 8;) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (from: number, to: number) =>
    groups
      .slice(from, to)
      .map((g) => g.toString(16))
      .join(':');
  if (bestStart < 0) return hex(0, 8);
  return `${hex(0, bestStart)}::${hex(bestStart + bestLen, 8)}`;
}

function groupsToWords(groups: number[]): number[] {
  return [0, 1, 2, 3].map((i) => ((groups[2 * i]! << 16) | groups[2 * i + 1]!) >>> 0);
}

const isMapped = (w: readonly number[]) => w[0] === 0 && w[1] === 0 && w[2] === 0xffff;

function makeAddress(version: 4 | 6, words: readonly number[]): IPAddress {
  return {
    version,
    words,
    text: version === 4 ? formatIPv4(words[0]!) : formatIPv6(words),
  };
}

/**
 * Parses an IP literal in the one spelling we accept: a strict dotted quad, or IPv6 text without
 * brackets or zone ID. IPv4-mapped IPv6 comes back as IPv4 (it *is* that IPv4 destination).
 */
export function parseIP(s: string): Result<IPAddress> {
  if (s.includes('%')) return err(`"${s}" has a zone ID; zone IDs are not allowed`);
  if (s.includes(':')) {
    const groups = parseIPv6Groups(s);
    if (!groups) return err(`"${s}" is not a valid IPv6 address`);
    const words = groupsToWords(groups);
    return ok(isMapped(words) ? makeAddress(4, [words[3]!]) : makeAddress(6, words));
  }
  const v4 = parseIPv4Words(s);
  if (v4 === undefined) return err(`"${s}" is not a dotted-quad IPv4 address`);
  return ok(makeAddress(4, [v4]));
}

/** Clears the bits below `prefixLength`. */
export function maskWords(words: readonly number[], prefixLength: number): number[] {
  return words.map((w, i) => {
    const keep = prefixLength - i * 32;
    if (keep >= 32) return w;
    if (keep <= 0) return 0;
    return (w & (~0 << (32 - keep))) >>> 0;
  });
}

function parsePrefixLength(s: string, max: number): number | undefined {
  if (!/^(0|[1-9][0-9]{0,2})$/.test(s)) return undefined;
  const n = Number(s);
  return n <= max ? n : undefined;
}

/** Parses `address/len` or a bare address (= /32 or /128). */
export function parseCIDR(s: string): Result<CIDR> {
  const slash = s.indexOf('/');
  const addressText = slash < 0 ? s : s.slice(0, slash);
  if (addressText.includes('%')) return err(`"${s}" has a zone ID; zone IDs are not allowed`);
  const isV6Text = addressText.includes(':');
  const groups = isV6Text ? parseIPv6Groups(addressText) : undefined;
  const v4 = isV6Text ? undefined : parseIPv4Words(addressText);
  if (isV6Text ? !groups : v4 === undefined) {
    return err(`"${s}" is not an IP address or CIDR`);
  }
  let version: 4 | 6 = isV6Text ? 6 : 4;
  let words: number[] = isV6Text ? groupsToWords(groups!) : [v4!];
  const bits = addressBits(version);
  let prefixLength = bits;
  if (slash >= 0) {
    const parsed = parsePrefixLength(s.slice(slash + 1), bits);
    if (parsed === undefined) return err(`"${s}" has an invalid prefix length (0-${bits})`);
    prefixLength = parsed;
  }
  // An IPv4-mapped IPv6 prefix is an IPv4 prefix: lookups see mapped addresses as IPv4.
  if (version === 6 && prefixLength >= 96 && isMapped(words)) {
    version = 4;
    words = [words[3]!];
    prefixLength -= 96;
  }
  const network = maskWords(words, prefixLength);
  const hadHostBits = network.some((w, i) => w !== words[i]);
  const text = `${makeAddress(version, network).text}/${prefixLength}`;
  return ok({ version, words: network, prefixLength, hadHostBits, text });
}

export const isUnspecifiedNetwork = (cidr: CIDR): boolean => cidr.words.every((w) => w === 0);
