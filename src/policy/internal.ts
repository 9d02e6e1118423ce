/**
 * The hard internal deny list: destinations no sandbox rule can open. The operator may replace
 * it (configuration), a sandbox's own allowOut never overrides it.
 *
 * Sources: the IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and successors).
 * Special ranges that are globally reachable by design (AS112, AMT, PCP anycast) are covered
 * where they sit inside a larger block a sandbox has no business reaching.
 */
import { type CIDR, formatIPv4, formatIPv6, maskWords, parseCIDR } from './address.js';
import { err, ok, type Result } from './result.js';

export interface InternalRange {
  readonly cidr: CIDR;
  /** The entry as written. */
  readonly entry: string;
  readonly description: string;
}

const DEFAULT_RANGES: ReadonlyArray<readonly [string, string]> = [
  ['0.0.0.0/8', '"this network" / unspecified (RFC 791, RFC 1122)'],
  ['10.0.0.0/8', 'private-use (RFC 1918)'],
  ['100.64.0.0/10', 'shared address space / CGNAT (RFC 6598)'],
  ['127.0.0.0/8', 'loopback (RFC 1122)'],
  ['169.254.0.0/16', 'link-local, includes cloud metadata 169.254.169.254 (RFC 3927)'],
  ['172.16.0.0/12', 'private-use (RFC 1918)'],
  ['192.0.0.0/24', 'IETF protocol assignments (RFC 6890)'],
  ['192.0.2.0/24', 'documentation TEST-NET-1 (RFC 5737)'],
  ['192.88.99.0/24', '6to4 relay anycast (RFC 7526)'],
  ['192.168.0.0/16', 'private-use (RFC 1918)'],
  ['198.18.0.0/15', 'benchmarking (RFC 2544)'],
  ['198.51.100.0/24', 'documentation TEST-NET-2 (RFC 5737)'],
  ['203.0.113.0/24', 'documentation TEST-NET-3 (RFC 5737)'],
  ['224.0.0.0/4', 'multicast (RFC 5771)'],
  ['240.0.0.0/4', 'reserved, includes limited broadcast 255.255.255.255 (RFC 1112, RFC 919)'],
  ['::/96', 'unspecified, loopback and IPv4-compatible IPv6 (RFC 4291)'],
  ['64:ff9b::/96', 'NAT64 well-known prefix (RFC 6052)'],
  ['64:ff9b:1::/48', 'local-use NAT64 (RFC 8215)'],
  ['100::/64', 'discard-only (RFC 6666)'],
  ['100:0:0:1::/64', 'dummy prefix (RFC 9780)'],
  ['2001::/23', 'IETF protocol assignments, includes Teredo 2001::/32 (RFC 2928, RFC 4380)'],
  ['2001:db8::/32', 'documentation (RFC 3849)'],
  ['2002::/16', '6to4 (RFC 3056)'],
  ['3fff::/20', 'documentation (RFC 9637)'],
  ['5f00::/16', 'SRv6 SIDs (RFC 9602)'],
  ['fc00::/7', 'unique local addresses, includes fd00:ec2::254 metadata (RFC 4193)'],
  ['fe80::/10', 'link-local (RFC 4291)'],
  ['fec0::/10', 'site-local, deprecated (RFC 3879)'],
  ['ff00::/8', 'multicast (RFC 4291)'],
];

/** One range of a list (a node's, as GET /internal-deny shows it): the entry is a CIDR. */
export const internalRange = (entry: string, description: string): Result<InternalRange> => {
  const cidr = parseCIDR(entry);
  return cidr.ok ? ok({ cidr: cidr.value, entry, description }) : cidr;
};

/** The default list, as ranges with the registry note each one carries. */
export const DEFAULT_INTERNAL_DENY: readonly InternalRange[] = DEFAULT_RANGES.map(
  ([entry, description]) => {
    const range = internalRange(entry, description);
    if (!range.ok) throw new Error(`built-in internal range ${entry}: ${range.error}`);
    return range.value;
  },
);

/** True when `inner` lies inside `outer` (or is it). */
const covers = (outer: CIDR, inner: CIDR): boolean =>
  outer.version === inner.version &&
  outer.prefixLength <= inner.prefixLength &&
  maskWords(inner.words, outer.prefixLength).every((w, i) => w === outer.words[i]);

/** `range` without `hole` (inside it): the sibling of each halving on the way down to the hole. */
function withoutHole(range: InternalRange, hole: CIDR): InternalRange[] {
  const rest: InternalRange[] = [];
  for (let length = range.cidr.prefixLength + 1; length <= hole.prefixLength; length++) {
    const sibling = maskWords(hole.words, length);
    const bit = length - 1;
    sibling[bit >> 5] = (sibling[bit >> 5]! ^ (1 << (31 - (bit & 31)))) >>> 0;
    const text = `${hole.version === 4 ? formatIPv4(sibling[0]!) : formatIPv6(sibling)}/${length}`;
    const piece = internalRange(text, `${range.description}, less ${hole.text}`);
    if (piece.ok) rest.push(piece.value);
  }
  return rest;
}

/**
 * Parses an operator's override: a comma-separated list of CIDRs or bare IPs, `none` for an
 * empty list, `default` for the built-in list, and `-CIDR` to take a range out of what comes
 * before it (`default,-198.18.0.0/15`: a test network made public without copying the list).
 */
export function parseInternalDenyList(text: string): Result<InternalRange[]> {
  const trimmed = text.trim();
  if (trimmed === 'none') return ok([]);
  let ranges: InternalRange[] = [];
  for (const [index, raw] of trimmed.split(',').entries()) {
    const entry = raw.trim();
    if (entry === 'default') {
      ranges.push(...DEFAULT_INTERNAL_DENY);
      continue;
    }
    const excluded = entry.startsWith('-');
    const range = internalRange(excluded ? entry.slice(1) : entry, "operator's internal deny list");
    if (!range.ok) {
      return err(
        `internal deny list entry ${index} ${JSON.stringify(entry)}: ${range.error}; expected CIDRs, "none", "default" and -CIDR exclusions, separated by commas`,
      );
    }
    if (!excluded) {
      ranges.push(range.value);
      continue;
    }
    const hole = range.value.cidr;
    const holder = ranges.find((r) => covers(r.cidr, hole));
    if (holder === undefined) {
      return err(
        `internal deny list entry ${index} ${JSON.stringify(entry)}: ${hole.text} is not inside any range before it; an exclusion takes a range out of the list, as in "default,-198.18.0.0/15"`,
      );
    }
    // Every range inside the hole goes too (a listed /24 inside an excluded /15).
    ranges = ranges.flatMap((r) =>
      r === holder ? withoutHole(r, hole) : covers(hole, r.cidr) ? [] : [r],
    );
  }
  return ok(ranges);
}
