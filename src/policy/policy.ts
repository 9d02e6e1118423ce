/**
 * Compiling canonical rules into an immutable Policy, and the one decision function that every
 * enforcement point asks. Decisions are built once per rule at compile time, so `decide`
 * allocates nothing except for learned addresses.
 */
import type { CIDR, IPAddress } from './address.js';
import { AddressIntervals, locate, type PrefixEntry } from './address-intervals.js';
import { AddressPrefixMap } from './address-prefix-map.js';
import type { Destination } from './destination.js';
import { DomainTrie } from './domain-trie.js';
import type { CanonicalName } from './host.js';
import { DEFAULT_INTERNAL_DENY, type InternalRange } from './internal.js';
import { ALL_TRAFFIC, type NameRule, type NetworkRules, type Rule, ruleLabel } from './rules.js';
import { mergePorts, type PortRange, type PortTable } from './ports.js';
import {
  ipv4PortRanges,
  NameRules,
  type PortQuestion,
  portLookup,
  portTables,
} from './scoped-rules.js';
import {
  decideRequest,
  MAX_SHOWN_METHOD,
  MAX_SHOWN_PATH,
  type RequestDecision,
  requestPath,
  requestRuleLabel,
} from './request-rules.js';
import type { DestinationRules } from './transform-types.js';

export type DecisionList =
  | 'allowOut'
  | 'denyOut'
  | 'internal'
  | 'learned'
  | 'default'
  | 'invalid'
  /** A destination's `network.rules`, deciding one request by its method and path. */
  | 'rules'
  /** The host itself, the gateway or another sandbox (see host-addresses.ts). */
  | 'host'
  /** A sandbox in report mode: let through what its rules deny (see `wouldDeny`). */
  | 'report';

export interface Decision {
  readonly verdict: 'allow' | 'deny';
  /** Where the deciding rule lives. */
  readonly list: DecisionList;
  /** The deciding entry as written, or null when no entry decided. */
  readonly rule: string | null;
  readonly reason: string;
  /** Report mode only: the denial the sandbox's rules made, which was not enforced. */
  readonly wouldDeny?: {
    readonly list: DecisionList;
    readonly rule: string | null;
    readonly reason: string;
  };
}

/** Addresses the DNS interceptor gave this sandbox for allowed names (still within TTL). */
export interface LearnedAddresses {
  /** The names an address was learned for and still holds (none when it was not learned). */
  names(ip: IPAddress): readonly CanonicalName[];
}

const decision = (
  verdict: Decision['verdict'],
  list: DecisionList,
  rule: string | null,
  reason: string,
): Decision => ({ verdict, list, rule, reason });

export interface InternalDenyList {
  readonly ranges: readonly InternalRange[];
  /** Each range with its decision, for compiling into a policy's address table. */
  readonly decisions: ReadonlyArray<{ readonly cidr: CIDR; readonly decision: Decision }>;
  lookup(ip: IPAddress): Decision | undefined;
  /** The internal range covering a whole CIDR, if any (for lint). */
  covering(cidr: CIDR): Decision | undefined;
}

/** Compiles the hard internal deny list once; every Policy of a server shares it. */
export function compileInternalDenyList(
  ranges: readonly InternalRange[] = DEFAULT_INTERNAL_DENY,
): InternalDenyList {
  const map = new AddressPrefixMap<Decision>();
  const decisions = ranges.map((range) => ({
    cidr: range.cidr,
    decision: decision(
      'deny',
      'internal',
      range.entry,
      `the internal deny list holds ${range.entry} (${range.description}); sandbox rules cannot open it`,
    ),
  }));
  for (const { cidr, decision: d } of decisions) map.insert(cidr, d);
  return {
    ranges,
    decisions,
    lookup: (ip) => map.lookup(ip),
    covering: (cidr) => map.covering(cidr),
  };
}

const DEFAULT_INTERNAL = compileInternalDenyList();

/** The lists of a policy's address table: portless prefixes, and prefixes with ports. */
type AddressLists = {
  internal: Decision;
  allow: Decision;
  deny: Decision;
  allowPorts: PortTable<Decision>;
  denyPorts: PortTable<Decision>;
};
const ADDRESS_LISTS: ReadonlyArray<keyof AddressLists> = [
  'internal',
  'allow',
  'deny',
  'allowPorts',
  'denyPorts',
];
// Each list's bit in the table's `present` byte (its index in ADDRESS_LISTS).
const INTERNAL = 1;
const ALLOW = 2;
const DENY = 4;
const ALLOW_PORTS = 8;
const DENY_PORTS = 16;

export interface Policy {
  readonly rules: NetworkRules;
  readonly internal: InternalDenyList;
  /** How a host name that no allowOut name rule covers is decided before it is resolved. */
  readonly unmatchedName: Decision;
  /** @internal to the policy part: allowOut names and wildcards. */
  readonly allowNames: NameRules<Decision>;
  /** @internal to the policy part: denyOut names and wildcards (a Moat extension). */
  readonly denyNames: NameRules<Decision>;
  /** @internal to the policy part: every prefix (internal list, allowOut, denyOut, with ports). */
  readonly addresses: AddressIntervals<AddressLists>;
  /** @internal to the policy part: `network.rules` by key (`*.` keys as wildcards). */
  readonly transforms: DomainTrie<DestinationRules>;
  /** Report mode: denials of the sandbox's own rules are recorded, not enforced. */
  readonly report: boolean;
}

/**
 * The decision of an allowOut or denyOut rule. A preset's entry is named as the preset and the
 * entry: `preset:pypi (pypi.org)`.
 */
function ruleDecision(verdict: 'allow' | 'deny', rule: Rule): Decision {
  const list = verdict === 'allow' ? 'allowOut' : 'denyOut';
  const label = ruleLabel(rule);
  switch (rule.kind) {
    case 'name':
      return decision(verdict, list, label, `the name matches ${list} ${label}`);
    case 'wildcard':
      return decision(
        verdict,
        list,
        label,
        `the name is below ${rule.name}, matched by ${list} ${label}`,
      );
    case 'address':
      return decision(
        verdict,
        list,
        label,
        `the address is inside ${list} ${label}${verdict === 'allow' ? '; allow beats deny' : ''}`,
      );
  }
}

const nameEntry = (rule: NameRule, value: Decision) => ({
  name: rule.name,
  kind: rule.kind === 'name' ? ('exact' as const) : ('wildcard' as const),
  ports: rule.ports,
  value,
});

const ALL_TRAFFIC_REASON =
  'denyOut 0.0.0.0/0 (ALL_TRAFFIC) denies every IPv4 and IPv6 destination that no allowOut rule covers';
const NO_ACCESS_REASON =
  'allow_internet_access is false: every destination that no allowOut rule covers is denied';
const ALLOW_DEFAULT = decision('allow', 'default', null, 'no rule matches; the default is allow');
const NO_DESTINATION = decision(
  'deny',
  'invalid',
  null,
  'the destination names neither a host nor an address',
);
const BAD_PORT = decision(
  'deny',
  'invalid',
  null,
  'the port is not a whole number from 1 to 65535',
);

/** Compiles canonical rules into an immutable Policy. */
export function compilePolicy(
  rules: NetworkRules,
  internal: InternalDenyList = DEFAULT_INTERNAL,
): Policy {
  const prefixes: Array<PrefixEntry<AddressLists>> = internal.decisions.map(
    ({ cidr, decision: d }) => ({
      cidr,
      list: 'internal',
      value: d,
    }),
  );
  const allowNameRules = [];
  const denyNameRules = [];
  const portPrefixes: Array<{
    cidr: CIDR;
    list: 'allow' | 'deny';
    ports: PortRange;
    value: Decision;
  }> = [];
  let allowAddressCount = 0;
  for (const rule of rules.allowOut) {
    if (rule.kind !== 'address') allowNameRules.push(nameEntry(rule, ruleDecision('allow', rule)));
    else {
      allowAddressCount++;
      if (rule.ports === undefined)
        prefixes.push({ cidr: rule.cidr, list: 'allow', value: ruleDecision('allow', rule) });
      else
        portPrefixes.push({
          cidr: rule.cidr,
          list: 'allow' as const,
          ports: rule.ports,
          value: ruleDecision('allow', rule),
        });
    }
  }
  const everything = (d: Decision): Array<PrefixEntry<AddressLists>> =>
    ([4, 6] as const).map((version) => ({
      cidr: {
        version,
        words: version === 4 ? [0] : [0, 0, 0, 0],
        prefixLength: 0,
        hadHostBits: false,
        text: '',
      },
      list: 'deny' as const,
      value: d,
    }));
  let denyAll: Decision | undefined;
  for (const rule of rules.denyOut) {
    if (rule.entry === ALL_TRAFFIC) {
      // ALL_TRAFFIC covers IPv6 too: a sandbox with IPv6 must not escape a deny-all policy.
      denyAll ??= decision('deny', 'denyOut', rule.entry, ALL_TRAFFIC_REASON);
      prefixes.push(...everything(denyAll));
    } else if (rule.kind !== 'address') {
      denyNameRules.push(nameEntry(rule, ruleDecision('deny', rule)));
    } else if (rule.ports === undefined) {
      prefixes.push({ cidr: rule.cidr, list: 'deny', value: ruleDecision('deny', rule) });
    } else {
      portPrefixes.push({
        cidr: rule.cidr,
        list: 'deny' as const,
        ports: rule.ports,
        value: ruleDecision('deny', rule),
      });
    }
  }
  if (rules.allowInternetAccess === false) {
    denyAll ??= decision('deny', 'denyOut', 'allow_internet_access=false', NO_ACCESS_REASON);
    prefixes.push(...everything(denyAll));
  }
  // Such a name is never resolved (DNS answers NXDOMAIN, the proxy refuses it), so an
  // allowOut range cannot admit it; say so rather than let the reader expect otherwise.
  const resolveHint =
    allowAddressCount > 0
      ? ' (allowOut address ranges admit addresses, not names: connect to the address or allow the name)'
      : '';
  const unmatchedName = denyAll
    ? decision(
        'deny',
        denyAll.list,
        denyAll.rule,
        `no allowOut name rule covers the name; ${denyAll.rule} denies it${resolveHint}`,
      )
    : rules.denyOut.length > 0
      ? decision(
          'allow',
          'default',
          null,
          'no rule names it; depends on what the name resolves to: the internal deny list and denyOut decide each resolved address',
        )
      : decision(
          'allow',
          'default',
          null,
          'no rule matches; the default is allow (each resolved address is still checked against the internal deny list)',
        );
  const transforms = new DomainTrie<DestinationRules>();
  for (const transform of rules.transforms) {
    const wildcard = transform.ruleKey.startsWith('*.');
    transforms.insert(
      wildcard ? transform.ruleKey.slice(2) : transform.ruleKey,
      wildcard ? 'wildcard' : 'exact',
      transform,
    );
  }
  return Object.freeze({
    rules,
    internal,
    unmatchedName,
    allowNames: new NameRules(allowNameRules),
    denyNames: new NameRules(denyNameRules),
    addresses: new AddressIntervals<AddressLists>(ADDRESS_LISTS, [
      ...prefixes,
      ...(['allow', 'deny'] as const).flatMap((list) =>
        portTables(portPrefixes.filter((rule) => rule.list === list)).map(({ cidr, table }) => ({
          cidr,
          list: list === 'allow' ? ('allowPorts' as const) : ('denyPorts' as const),
          value: table,
        })),
      ),
    ]),
    transforms,
    report: rules.mode === 'report',
  });
}

/**
 * The `network.rules` transform for requests to a canonical name: the exact key, else the
 * longest `*.` key below which the name lies (never the wildcard's own apex). Rule sets are not
 * merged, and a transform grants nothing: `decide` alone says whether the name may be reached.
 */
export const destinationRulesFor = (
  policy: Policy,
  name: CanonicalName,
): DestinationRules | undefined => policy.transforms.lookup(name);

/**
 * The ports allowOut's name rules open for any of `names`, merged (undefined: every port;
 * empty: none), for the kernel's learned addresses.
 */
export function allowedPorts(
  policy: Policy,
  names: readonly CanonicalName[],
): PortRange[] | undefined {
  const ranges: PortRange[] = [];
  for (const name of names) {
    // A name whose rules decide each request is reached through Moat, by name, only: its
    // addresses open no port in the firewall (its web ports still reach the transparent
    // listener, which reads the name).
    if (policy.transforms.lookup(name)?.decidesRequests === true) continue;
    const ports = policy.allowNames.portsOf(name);
    if (ports === undefined) return undefined;
    ranges.push(...ports);
  }
  return mergePorts(ranges);
}

/**
 * The ports on which a bare address learned for any of `names` is denied, merged (`every`: on
 * every port; empty: none), for the kernel's learned addresses: where denyOut names one of them,
 * and every port of a name whose rules decide each request (reached by name only). The
 * kernel checks the ports `allowedPorts` opens first, so allow still beats deny.
 */
export const deniedPorts = (
  policy: Policy,
  names: readonly CanonicalName[],
): PortRange[] | 'every' => (policy.report ? [] : portsDeniedByName(policy, names));

/** `deniedPorts` as the policy's rules say, whatever its mode. */
function portsDeniedByName(policy: Policy, names: readonly CanonicalName[]): PortRange[] | 'every' {
  const ranges: PortRange[] = [];
  for (const name of names) {
    if (policy.transforms.lookup(name)?.decidesRequests === true) return 'every';
    if (policy.denyNames.size === 0) continue;
    const ports = policy.denyNames.portsOf(name);
    if (ports === undefined) return 'every';
    ranges.push(...ports);
  }
  return mergePorts(ranges);
}

/**
 * Whether addresses DNS gave for `name` are denied on some port by its name (`deniedPorts`), in
 * report mode too: the learned table keeps such a name so that a switch back to enforce still
 * knows it.
 */
export function deniesLearnedName(policy: Policy, name: CanonicalName): boolean {
  const ports = portsDeniedByName(policy, [name]);
  return ports === 'every' || ports.length > 0;
}

/**
 * The IPv4 ranges `list`'s port-scoped address rules cover, each with its ports: disjoint, so
 * the kernel's `address . port` interval sets take them as they are.
 */
export const portScopedIPv4 = (
  policy: Policy,
  list: 'allowOut' | 'denyOut',
): Array<{ first: string; last: string; ports: PortRange[] }> =>
  ipv4PortRanges(
    policy.addresses.ipv4,
    policy.addresses.ipv4.lists[list === 'allowOut' ? 'allowPorts' : 'denyPorts'],
  );

/**
 * The allowOut name rule covering a canonical name, if any (exact beats wildcard): on `port`,
 * or without one on some port.
 */
export const matchName = (
  policy: Policy,
  name: CanonicalName,
  port?: number,
): Decision | undefined => policy.allowNames.lookup(name, port ?? 'some');

const isValidPort = (port: number) => Number.isInteger(port) && port >= 1 && port <= 65535;

/**
 * Decides a destination, in the order of design.md: internal list, allowOut names, allowOut
 * addresses, learned addresses (only when no host name was given), denyOut names, denyOut
 * addresses, default allow. Every rule list is matched on the destination's port; a question
 * without a port (DNS) is allowed when some port would be, and denied by a rule only when it
 * covers every port. In report mode a denial of the sandbox's own rules is let through (see
 * `reported`).
 */
export function decide(
  policy: Policy,
  destination: Destination,
  learned?: LearnedAddresses,
): Decision {
  const decided = decideEnforced(policy, destination, learned);
  return policy.report ? reported(decided) : decided;
}

/** Lists whose denials hold in report mode too: they guard more than the sandbox's own policy. */
const ALWAYS_ENFORCED: ReadonlySet<DecisionList> = new Set(['internal', 'host', 'invalid']);

/**
 * A decision as a report-mode sandbox gets it: a denial by its own rules (allowOut, denyOut,
 * learned names, network.rules) becomes an allow that says what would have denied it; the
 * internal deny list, the host and invalid destinations stay denied.
 */
export function reported(decision: Decision): Decision {
  if (decision.verdict === 'allow' || ALWAYS_ENFORCED.has(decision.list)) return decision;
  const { list, rule, reason } = decision;
  return {
    verdict: 'allow',
    list: 'report',
    rule,
    reason: `report mode lets it through: ${reason}`,
    wouldDeny: { list, rule, reason },
  };
}

function decideEnforced(
  policy: Policy,
  destination: Destination,
  learned?: LearnedAddresses,
): Decision {
  const { host, ip, port } = destination;
  if (port !== undefined && !isValidPort(port)) return BAD_PORT;
  const allowPort: PortQuestion = port ?? 'some';
  const denyPort: PortQuestion = port ?? 'every';
  if (ip === undefined) {
    if (host === undefined) return NO_DESTINATION;
    return (
      policy.allowNames.lookup(host, allowPort) ??
      policy.denyNames.lookup(host, denyPort) ??
      policy.unmatchedName
    );
  }
  // One search finds the address's longest prefix in every list, with ports or without.
  const table = policy.addresses.family(ip);
  const slot = locate(table, ip.words);
  // Which lists hold a prefix of the address, from one byte: only those are read.
  const present = table.present[slot]!;
  const lists = table.lists;
  if (present & INTERNAL) return lists.internal[slot]!;
  if (host !== undefined) {
    const byName = policy.allowNames.lookup(host, allowPort);
    if (byName !== undefined) return byName;
  }
  if (present & ALLOW) return lists.allow[slot]!;
  if (present & ALLOW_PORTS) {
    const allowedPort = portLookup(lists.allowPorts[slot]!, allowPort);
    if (allowedPort !== undefined) return allowedPort;
  }
  // A learned address never rescues a connection that itself names a host no rule allows
  // (a CDN address shared with an allowed name must not open other names).
  if (learned !== undefined && host === undefined) {
    const byNames = learnedDecision(policy, learned.names(ip), allowPort, denyPort);
    if (byNames !== undefined) return byNames;
  }
  if (host !== undefined) {
    const deniedName = policy.denyNames.lookup(host, denyPort);
    if (deniedName !== undefined) return deniedName;
  }
  if (present & DENY) return lists.deny[slot]!;
  if (present & DENY_PORTS && port !== undefined) {
    const deniedPort = lists.denyPorts[slot]!.lookup(port);
    if (deniedPort !== undefined) return deniedPort;
  }
  return ALLOW_DEFAULT;
}

/**
 * A bare address decided by the names DNS gave it to this sandbox for, checked again against
 * this policy so that a stale learned entry cannot open anything. A name allowed on the port
 * allows it (allow beats deny); else a name whose rules decide each request denies it (a bare
 * address would carry requests past them), and so does a name denyOut denies on the port.
 */
function learnedDecision(
  policy: Policy,
  names: readonly CanonicalName[],
  allowPort: PortQuestion,
  denyPort: PortQuestion,
): Decision | undefined {
  let decidedByRules: CanonicalName | undefined;
  let deniedName: CanonicalName | undefined;
  let deniedBy: Decision | undefined;
  for (const name of names) {
    if (policy.transforms.lookup(name)?.decidesRequests === true) {
      decidedByRules ??= name;
      continue;
    }
    if (policy.allowNames.lookup(name, allowPort) !== undefined)
      return decision(
        'allow',
        'learned',
        name,
        `the address was given to this sandbox by DNS for the allowed name ${name}`,
      );
    if (deniedBy === undefined) {
      deniedBy = policy.denyNames.lookup(name, denyPort);
      if (deniedBy !== undefined) deniedName = name;
    }
  }
  if (decidedByRules !== undefined)
    return decision(
      'deny',
      'rules',
      decidedByRules,
      `the address was given to this sandbox by DNS for ${decidedByRules}, whose network.rules decide each request by method and path: connect to ${decidedByRules} by name`,
    );
  if (deniedBy !== undefined)
    return decision(
      'deny',
      'denyOut',
      deniedBy.rule,
      `the address was given to this sandbox by DNS for ${deniedName}, which denyOut ${deniedBy.rule} denies${denyPort === 'every' ? '' : ' on this port'}`,
    );
  return undefined;
}

/**
 * A request's decision as every door, `moat check` and replay state it: by the rule that
 * decided it, or (no action decided) its connection's decision `connection`; in report mode a
 * rule's denial is let through (`reported`), an invalid request is not.
 */
export function describeRequestDecision(
  policy: Policy,
  rules: DestinationRules,
  host: string,
  method: string,
  target: string,
  decided: RequestDecision,
  connection: Decision,
): Decision {
  const request = `${method.slice(0, MAX_SHOWN_METHOD)} ${requestPath(target).slice(0, MAX_SHOWN_PATH)} to ${host}`;
  if (decided.verdict === 'invalid')
    return {
      verdict: 'deny',
      list: 'invalid',
      rule: rules.ruleKey,
      reason: `${request}: ${decided.problem}; the rules of ${rules.ruleKey} match paths, so a path must be one every origin reads alike`,
    };
  if (decided.rule === undefined) return connection;
  const label = requestRuleLabel(rules.ruleKey, decided.rule);
  const decision: Decision = {
    verdict: decided.verdict,
    list: 'rules',
    rule: label,
    reason: `${request} is ${decided.verdict === 'allow' ? 'allowed' : 'denied'} by rule ${label} of network.rules`,
  };
  return policy.report ? reported(decision) : decision;
}

/** `describeRequestDecision` of the request decided now. */
export const requestDecision = (
  policy: Policy,
  rules: DestinationRules,
  host: string,
  method: string,
  target: string,
  connection: Decision,
): Decision =>
  describeRequestDecision(
    policy,
    rules,
    host,
    method,
    target,
    decideRequest(rules, method, target),
    connection,
  );
