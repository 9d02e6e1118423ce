/**
 * Warnings about valid policies that probably do not say what their author meant. Errors are
 * the parser's job; nothing here changes a decision.
 */
import { getPublicSuffix, parse as parseDomain } from 'tldts';
import { type IPAddress, parseIP } from './address.js';
import { AddressPrefixMap } from './address-prefix-map.js';
import { DomainTrie } from './domain-trie.js';
import type { InternalDenyList } from './policy.js';
import {
  type AddressRule,
  ALL_TRAFFIC,
  type NameRule,
  type NetworkRules,
  type Rule,
  ruleLabel,
} from './rules.js';
import type { PortRange } from './ports.js';
import type { PolicyProblem } from './result.js';

const LOOPBACK = (parseIP('127.0.0.1') as { ok: true; value: IPAddress }).value;

const where = (rule: Rule) => `${rule.list}[${rule.index}] ${JSON.stringify(ruleLabel(rule))}`;

function publicSuffixWarning(rule: NameRule): string | undefined {
  const options = { allowPrivateDomains: true };
  if (getPublicSuffix(rule.name, options) !== rule.name) return undefined;
  const info = parseDomain(rule.name, options);
  if (info.isIcann)
    return `${where(rule)} is a wildcard on the public suffix ${rule.name}: anyone can register a name below it`;
  if (info.isPrivate) {
    return `${where(rule)} is a wildcard on ${rule.name}, listed as a public suffix: names below it belong to many unrelated owners`;
  }
  return undefined;
}

/** True when `outer` covers every port `inner` does (undefined: every port). */
const portsCover = (outer: PortRange | undefined, inner: PortRange | undefined): boolean =>
  outer === undefined || (inner !== undefined && outer.from <= inner.from && inner.to <= outer.to);

const samePorts = (a: PortRange | undefined, b: PortRange | undefined): boolean =>
  a === b || (a !== undefined && b !== undefined && a.from === b.from && a.to === b.to);

/** Name rules of one list by name: what covers a name on the ports a rule names. */
function nameIndex(names: readonly NameRule[]): {
  exact: Map<string, NameRule[]>;
  wildcards: DomainTrie<NameRule[]>;
} {
  const exact = new Map<string, NameRule[]>();
  const byWildcard = new Map<string, NameRule[]>();
  const wildcards = new DomainTrie<NameRule[]>();
  for (const rule of names) {
    const map = rule.kind === 'name' ? exact : byWildcard;
    const list = map.get(rule.name);
    if (list !== undefined) list.push(rule);
    else {
      map.set(rule.name, [rule]);
      if (rule.kind === 'wildcard') wildcards.insert(rule.name, 'wildcard', map.get(rule.name)!);
    }
  }
  return { exact, wildcards };
}

/**
 * The first rule of `index`, other than `rule`, that covers the name (or the wildcard's names)
 * of `rule` on all its ports: `same` says whether one with the same name, kind and ports counts.
 */
function coverOf(
  index: ReturnType<typeof nameIndex>,
  rule: NameRule,
  same: boolean,
): NameRule | undefined {
  const fits = (other: NameRule) =>
    other !== rule &&
    portsCover(other.ports, rule.ports) &&
    (same ||
      other.kind !== rule.kind ||
      other.name !== rule.name ||
      !samePorts(other.ports, rule.ports));
  const pick = (list: NameRule[]) => list.find(fits);
  if (rule.kind === 'name') {
    const exact = index.exact.get(rule.name)?.find(fits);
    if (exact !== undefined) return exact;
  }
  // For a wildcard `*.x`, a wildcard at x itself covers it, and so does any above x.
  return index.wildcards.find(rule.kind === 'name' ? rule.name : `x.${rule.name}`, pick);
}

function lintNames(names: readonly NameRule[], warnings: PolicyProblem[]): void {
  const index = nameIndex(names);
  const warn = (rule: NameRule, message: string) =>
    warnings.push({ at: `${rule.list}[${rule.index}]`, entry: rule.entry, message });
  const reported = new Set<NameRule>();
  names.forEach((rule, i) => {
    // A repeat: the same name, kind and ports as an earlier rule.
    const first = names
      .slice(0, i)
      .find((o) => o.kind === rule.kind && o.name === rule.name && samePorts(o.ports, rule.ports));
    if (first !== undefined) {
      warn(rule, `${where(rule)} repeats ${where(first)}`);
      reported.add(rule);
    }
    if (rule.kind === 'wildcard') {
      const suffix = publicSuffixWarning(rule);
      if (suffix) warn(rule, suffix);
    }
  });
  for (const rule of names) {
    if (reported.has(rule)) continue;
    const cover = coverOf(index, rule, false);
    if (cover === undefined) continue;
    warn(
      rule,
      cover.ports === undefined &&
        rule.ports !== undefined &&
        cover.name === rule.name &&
        cover.kind === rule.kind
        ? `${where(rule)} is already covered by ${where(cover)}, which takes every port`
        : `${where(rule)} is already covered by ${where(cover)}`,
    );
  }
}

/** Reports repeated and shadowed prefixes within one list; returns the list's prefix map. */
function lintAddresses(
  rules: readonly AddressRule[],
  warn: (rule: Rule, message: string) => void,
): AddressPrefixMap<AddressRule[]> {
  const map = new AddressPrefixMap<AddressRule[]>();
  for (const rule of rules) {
    const list = map.covering(rule.cidr);
    if (list !== undefined && list[0]!.cidr.prefixLength === rule.cidr.prefixLength) {
      const first = list.find((o) => samePorts(o.ports, rule.ports));
      if (first !== undefined) warn(rule, `${where(rule)} repeats ${where(first)}`);
      else list.push(rule);
    } else map.insert(rule.cidr, [rule]);
  }
  for (const rule of rules) {
    const broader = coveringAddress(map, rule);
    if (broader && broader !== rule)
      warn(
        rule,
        broader.cidr.prefixLength === rule.cidr.prefixLength
          ? `${where(rule)} is already covered by ${where(broader)}, which takes every port`
          : `${where(rule)} is already covered by ${where(broader)}`,
      );
  }
  return map;
}

/**
 * A rule of `map` covering all of `rule`'s addresses and ports: a broader network's, or one on
 * the same network with wider ports (never `rule` itself, nor a repeat of it).
 */
function coveringAddress(
  map: AddressPrefixMap<AddressRule[]>,
  rule: AddressRule,
  same = false,
): AddressRule | undefined {
  for (let length = rule.cidr.prefixLength; length >= 0;) {
    const list = map.covering(rule.cidr, length);
    if (list === undefined) return undefined;
    const wider = list.find(
      (o) =>
        o !== rule &&
        portsCover(o.ports, rule.ports) &&
        (same || o.cidr.prefixLength < rule.cidr.prefixLength || !samePorts(o.ports, rule.ports)),
    );
    if (wider !== undefined) return wider;
    length = list[0]!.cidr.prefixLength - 1;
  }
  return undefined;
}

/** Entries that a deny-everything setting makes redundant or contradicts. */
function lintDenyAll(
  rules: NetworkRules,
  warn: (rule: Rule, message: string) => void,
  warnings: PolicyProblem[],
): void {
  const allTraffic = rules.denyOut.find((rule) => rule.entry === ALL_TRAFFIC);
  if (rules.allowInternetAccess === true && allTraffic) {
    warnings.push({
      at: 'allow_internet_access',
      message: `allow_internet_access is true, but ${where(allTraffic)} (ALL_TRAFFIC) denies everything that allowOut does not allow`,
    });
  }
  if (rules.allowInternetAccess === false) {
    for (const rule of rules.denyOut) {
      warn(
        rule,
        `${where(rule)} is redundant: allow_internet_access is false, which already denies everything that allowOut does not allow`,
      );
    }
    return;
  }
  if (!allTraffic) return;
  // IPv4 entries are reported as covered by 0.0.0.0/0; IPv6 ones need saying: ALL_TRAFFIC covers them too.
  for (const rule of rules.denyOut) {
    if (rule.kind === 'address' && rule.cidr.version === 6)
      warn(rule, `${where(rule)} is redundant: ${where(allTraffic)} (ALL_TRAFFIC) denies IPv6 too`);
  }
}

/**
 * Method and path rules that leave out what their author probably meant: a deny of `/admin/*`
 * that lets `/admin` itself through, and a `*.` key that decides requests while its apex,
 * which no `*.` key covers, is allowed with no rules of its own.
 */
function lintRequestRules(rules: NetworkRules, warnings: PolicyProblem[]): void {
  const keys = new Set(rules.transforms.map((t) => t.ruleKey));
  const allowedNames = new Set(
    rules.allowOut.flatMap((rule) => (rule.kind === 'name' ? [rule.name as string] : [])),
  );
  for (const destination of rules.transforms) {
    const at = `rules[${JSON.stringify(destination.ruleKey)}]`;
    for (const rule of destination.rules) {
      if (rule.action !== 'deny') continue;
      const paths = rule.match?.paths ?? [];
      for (const pattern of paths) {
        if (!pattern.endsWith('/*') || pattern === '/*') continue;
        const bare = pattern.slice(0, -2);
        if (paths.includes(bare)) continue;
        warnings.push({
          at,
          entry: destination.ruleKey,
          message: `${at} #${rule.number} denies ${pattern} but not ${bare} itself; add "${bare}" to its paths if that was meant`,
        });
      }
    }
    const apex = destination.ruleKey.startsWith('*.') ? destination.ruleKey.slice(2) : undefined;
    if (
      apex !== undefined &&
      destination.decidesRequests &&
      !keys.has(apex) &&
      allowedNames.has(apex)
    )
      warnings.push({
        at,
        entry: destination.ruleKey,
        message: `${at} decides requests below ${apex} but not to ${apex} itself, which allowOut allows with no rules; add a "${apex}" key if that was meant`,
      });
  }
}

/** Lints canonical rules against the internal deny list the server will use. */
export function lintPolicy(rules: NetworkRules, internal: InternalDenyList): PolicyProblem[] {
  const warnings: PolicyProblem[] = [];
  const warn = (rule: Rule, message: string) =>
    warnings.push({ at: `${rule.list}[${rule.index}]`, entry: rule.entry, message });
  const names = (list: readonly Rule[]) =>
    list.filter((rule): rule is NameRule => rule.kind !== 'address');
  const addresses = (list: readonly Rule[]) =>
    list.filter((rule): rule is AddressRule => rule.kind === 'address');
  lintNames(names(rules.allowOut), warnings);
  lintNames(names(rules.denyOut), warnings);
  const allowAddresses = lintAddresses(addresses(rules.allowOut), warn);
  lintAddresses(addresses(rules.denyOut), warn);
  const allowNames = nameIndex(names(rules.allowOut));
  for (const rule of [...rules.allowOut, ...rules.denyOut]) {
    if (rule.kind !== 'address') {
      const allowedBy = rule.list === 'denyOut' ? coverOf(allowNames, rule, true) : undefined;
      if (allowedBy)
        warn(
          rule,
          `${where(rule)} has no effect: ${where(allowedBy)} covers it, and allow beats deny`,
        );
      continue;
    }
    if (rule.cidr.hadHostBits)
      warn(rule, `${where(rule)} has bits set below its prefix length; it means ${rule.cidr.text}`);
    const inside = rule.cidr.prefixLength > 0 ? internal.covering(rule.cidr) : undefined;
    if (inside) {
      warn(
        rule,
        rule.list === 'allowOut'
          ? `${where(rule)} has no effect: the internal deny list holds ${inside.rule}, which no sandbox rule can open`
          : `${where(rule)} is redundant: the internal deny list already denies ${inside.rule}`,
      );
    }
    const allowedBy =
      rule.list === 'denyOut' ? coveringAddress(allowAddresses, rule, true) : undefined;
    if (allowedBy)
      warn(
        rule,
        `${where(rule)} has no effect: ${where(allowedBy)} covers it, and allow beats deny`,
      );
  }
  lintDenyAll(rules, warn, warnings);
  lintRequestRules(rules, warnings);
  const loopback = internal.lookup(LOOPBACK);
  for (const rule of rules.allowOut) {
    if (
      loopback &&
      rule.kind !== 'address' &&
      (rule.name === 'localhost' || rule.name.endsWith('.localhost'))
    ) {
      warn(
        rule,
        `${where(rule)} has no effect: localhost names resolve to loopback (RFC 6761), which the internal deny list holds (${loopback.rule})`,
      );
    }
  }
  if (!rules.denyAll && rules.denyOut.length === 0 && rules.allowOut.length > 0) {
    warnings.push({
      at: 'allowOut',
      message: 'allowOut has no effect: nothing is denied, so everything is already allowed',
    });
  }
  return warnings;
}
