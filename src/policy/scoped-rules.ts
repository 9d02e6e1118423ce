/**
 * The rules of one list (allowOut or denyOut) compiled for decisions per port: names and
 * wildcards in domain maps, addresses and networks in an interval table. A rule without a port
 * is a plain entry (one lookup, as before ports existed); rules with ports on one destination
 * are merged into a `PortTable`, kept for networks in the policy's one address table (see
 * `portTables`).
 *
 * Questions without a port (a DNS query name, an address in a DNS answer) ask either whether
 * some port is covered (`some`: an allow rule on `:22` still lets the name resolve) or whether
 * every port is (`every`: only a portless deny makes a name NXDOMAIN).
 */
import { type CIDR, formatIPv4 } from './address.js';
import type { FamilyTable, ListValues } from './address-intervals.js';
import { AddressPrefixMap } from './address-prefix-map.js';
import { DomainTrie } from './domain-trie.js';
import type { CanonicalName } from './host.js';
import { mergePorts, type PortRange, PortTable } from './ports.js';

/** A port question: a port, or, without one, whether some or every port is covered. */
export type PortQuestion = number | 'some' | 'every';

interface Scoped<T> {
  readonly ports: PortRange | undefined;
  readonly value: T;
}

/** Name rules of one list: portless in `all`, the rest per name in `ported`. */
export class NameRules<T> {
  private readonly all = new DomainTrie<T>();
  private readonly ported = new DomainTrie<PortTable<T>>();
  /** How many names and wildcards hold rules. */
  readonly size: number;

  constructor(rules: ReadonlyArray<Scoped<T> & { name: string; kind: 'exact' | 'wildcard' }>) {
    const groups = new Map<string, Array<Scoped<T>>>();
    for (const rule of rules) {
      if (rule.ports === undefined) this.all.insert(rule.name, rule.kind, rule.value);
      else {
        const key = `${rule.kind} ${rule.name}`;
        const group = groups.get(key) ?? [];
        if (group.length === 0) groups.set(key, group);
        group.push(rule);
      }
    }
    for (const [key, group] of groups) {
      const space = key.indexOf(' ');
      this.ported.insert(
        key.slice(space + 1),
        key.slice(0, space) as 'exact' | 'wildcard',
        new PortTable(group.map((rule) => ({ ports: rule.ports!, value: rule.value }))),
      );
    }
    this.size = this.all.size + this.ported.size;
  }

  /**
   * The ports on which some rule covers `name`, merged; undefined when a rule covers every
   * port (an empty list: none does).
   */
  portsOf(name: CanonicalName): PortRange[] | undefined {
    if (this.all.lookup(name) !== undefined) return undefined;
    const ranges: PortRange[] = [];
    this.ported.find(name, (table) => {
      for (const range of table.ranges()) ranges.push(range.ports);
      return undefined;
    });
    return mergePorts(ranges);
  }

  /** The most specific rule covering `name` on `port` (portless rules first). */
  lookup(name: CanonicalName, port: PortQuestion): T | undefined {
    if (this.size === 0) return undefined;
    const plain = this.all.lookup(name);
    if (plain !== undefined || port === 'every' || this.ported.size === 0) return plain;
    return port === 'some'
      ? this.ported.lookup(name)?.first
      : this.ported.find(name, (table) => table.lookup(port));
  }
}

/**
 * Port-scoped address rules of one list, one port table per network: the network's own rules,
 * then those of each network around it, innermost first, merged so that an inner network's rule
 * keeps the ports it names. Kept per interval of the policy's address table, so the one search
 * that finds an address's longest prefixes also finds the port rules covering it.
 */
export function portTables<T>(
  rules: ReadonlyArray<Scoped<T> & { readonly cidr: CIDR }>,
): Array<{ cidr: CIDR; table: PortTable<T> }> {
  const groups = new Map<string, { cidr: CIDR; rules: Array<Scoped<T>> }>();
  for (const rule of rules) {
    const key = `${rule.cidr.version} ${rule.cidr.text}`;
    const group = groups.get(key) ?? { cidr: rule.cidr, rules: [] };
    if (group.rules.length === 0) groups.set(key, group);
    group.rules.push(rule);
  }
  const own = new AddressPrefixMap<{ table: PortTable<T>; length: number }>();
  for (const { cidr, rules: group } of groups.values()) {
    const ports = group.map((rule) => ({ ports: rule.ports!, value: rule.value }));
    own.insert(cidr, { table: new PortTable(ports), length: cidr.prefixLength });
  }
  return [...groups.values()].map(({ cidr }) => {
    const ranges: Array<{ ports: PortRange; value: T }> = [];
    for (let length = cidr.prefixLength; length >= 0;) {
      const around = own.covering(cidr, length);
      if (around === undefined) break;
      ranges.push(...around.table.ranges());
      length = around.length - 1;
    }
    return { cidr, table: new PortTable(ranges) };
  });
}

/** The rule of a port table covering `port`; without a port, one covering some port. */
export const portLookup = <T>(table: PortTable<T>, port: number | 'some'): T | undefined =>
  port === 'some' ? table.first : table.lookup(port);

/**
 * Disjoint IPv4 address ranges, each with the ports a list's port tables cover on all of it
 * (merged): what the kernel's `address . port` sets hold.
 */
export function ipv4PortRanges<T>(
  table: FamilyTable<ListValues>,
  tables: ReadonlyArray<PortTable<T> | undefined>,
): Array<{ first: string; last: string; ports: PortRange[] }> {
  const ranges = [];
  for (let i = 0; i < table.count; i++) {
    const ports = tables[i];
    if (ports === undefined) continue;
    const last = i + 1 < table.count ? table.starts[i + 1]! - 1 : 0xffff_ffff;
    ranges.push({
      first: formatIPv4(table.starts[i]!),
      last: formatIPv4(last),
      ports: mergePorts(ports.ranges().map((range) => range.ports)),
    });
  }
  return ranges;
}
