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

function lintNames(names: NameRule[], warnings: PolicyProblem[]): void {
  const wildcards = new DomainTrie<NameRule>();
  const exact = new Map<string, NameRule>();
  for (const rule of names) {
    if (rule.kind === 'wildcard') {
      if (!wildcards.insert(rule.name, 'wildcard', rule)) {
        const first = wildcards.lookup(`x.${rule.name}`)!;
        warnings.push({
          at: `allowOut[${rule.index}]`,
          entry: rule.entry,
          message: `${where(rule)} repeats ${where(first)}`,
        });
      }
      const suffix = publicSuffixWarning(rule);
      if (suffix)
        warnings.push({ at: `allowOut[${rule.index}]`, entry: rule.entry, message: suffix });
    } else {
      const first = exact.get(rule.name);
      if (first)
        warnings.push({
          at: `allowOut[${rule.index}]`,
          entry: rule.entry,
          message: `${where(rule)} repeats ${where(first)}`,
        });
      else exact.set(rule.name, rule);
    }
  }
  for (const rule of names) {
    // For a wildcard `*.x`, lookup(x) finds only wildcards strictly above x.
    const cover = wildcards.lookup(rule.name);
    if (cover && cover !== rule) {
      warnings.push({
        at: `allowOut[${rule.index}]`,
        entry: rule.entry,
        message: `${where(rule)} is already covered by ${where(cover)}`,
      });
    }
  }
}

/** Reports repeated and shadowed prefixes within one list; returns the list's prefix map. */
function lintAddresses(
  rules: readonly AddressRule[],
  warn: (rule: Rule, message: string) => void,
): AddressPrefixMap<AddressRule> {
  const map = new AddressPrefixMap<AddressRule>();
  for (const rule of rules) {
    if (!map.insert(rule.cidr, rule))
      warn(rule, `${where(rule)} repeats ${where(map.covering(rule.cidr)!)}`);
  }
  for (const rule of rules) {
    const broader =
      rule.cidr.prefixLength > 0 ? map.covering(rule.cidr, rule.cidr.prefixLength - 1) : undefined;
    if (broader) warn(rule, `${where(rule)} is already covered by ${where(broader)}`);
  }
  return map;
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
    if (rule.cidr.version === 6)
      warn(rule, `${where(rule)} is redundant: ${where(allTraffic)} (ALL_TRAFFIC) denies IPv6 too`);
  }
}

/** Lints canonical rules against the internal deny list the server will use. */
export function lintPolicy(rules: NetworkRules, internal: InternalDenyList): PolicyProblem[] {
  const warnings: PolicyProblem[] = [];
  const warn = (rule: Rule, message: string) =>
    warnings.push({ at: `${rule.list}[${rule.index}]`, entry: rule.entry, message });
  lintNames(
    rules.allowOut.filter((rule): rule is NameRule => rule.kind !== 'address'),
    warnings,
  );
  const allowAddresses = lintAddresses(
    rules.allowOut.filter((rule): rule is AddressRule => rule.kind === 'address'),
    warn,
  );
  lintAddresses(rules.denyOut, warn);
  for (const rule of [...rules.allowOut, ...rules.denyOut]) {
    if (rule.kind !== 'address') continue;
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
    const allowedBy = rule.list === 'denyOut' ? allowAddresses.covering(rule.cidr) : undefined;
    if (allowedBy)
      warn(
        rule,
        `${where(rule)} has no effect: ${where(allowedBy)} covers it, and allow beats deny`,
      );
  }
  lintDenyAll(rules, warn, warnings);
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
