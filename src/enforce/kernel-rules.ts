/**
 * The kernel enforcer's nftables text, generated from the same compiled Policy the DNS and proxy
 * parts ask. Pure: it writes commands, the runtime runs them inside the sandbox's namespace.
 *
 * Every command list is one line (commands joined by `;`): `nft -i` runs each line it reads as
 * one transaction, so a change is applied whole or not at all.
 *
 * The main chains never change after a sandbox is set up; a policy change rewrites the sets and
 * two one-rule chains only. That keeps a publish to one small transaction, and lets learned
 * addresses carry their own timeouts so that expiry needs no rewrite.
 *
 * A learned address expires for new connections only. A connection it let through is marked
 * with the policy's generation (a conntrack mark, a new one at every publish), and its
 * later packets pass on that mark while the policy stands: a database session outlives the TTL
 * of the name it was opened by, as it would behind any stateful firewall. A publish changes the
 * generation, so every open connection is decided again by the new policy: at the sandbox's
 * next packet on it, and at every packet that arrives on it (the `arriving` chain decides those
 * by the connection's original destination), from the moment the transaction is in.
 */
import { randomInt } from 'node:crypto';
import {
  type CIDR,
  type InternalDenyList,
  type IPAddress,
  type Policy,
  type PortRange,
  portScopedIPv4,
} from '../policy/index.js';

/** Where Moat's listeners for sandboxes are and which addresses its links use. */
export interface KernelLayout {
  /** Moat's address for its sandboxes (DNS, explicit proxy, transparent listener). */
  readonly gateway: IPAddress;
  readonly ports: { readonly dns: number; readonly proxy: number; readonly transparent: number };
  /** The range every sandbox link comes from; none of it is a destination. */
  readonly pool: CIDR;
  /** TCP ports of the host itself that the operator opened to sandboxes (--allow-host-ports). */
  readonly hostPorts: readonly number[];
  readonly internal: InternalDenyList;
  /** Host-side names of sandbox links start with this (nft matches `prefix*`). */
  readonly linkPrefix: string;
  /** The host's own table, in the host's namespace. */
  readonly hostTable: string;
  /**
   * The NFLOG group the first packet of each direct flow is logged to, allowed or refused (the
   * flow log's reader); undefined: none is logged.
   */
  readonly flowLogGroup?: number;
  /** What each sandbox may open (see budgetChains). */
  readonly connections: ConnectionBudget;
}

/**
 * Each sandbox's connections, budgeted in its own namespace before they reach the host: new ones
 * per second (with a burst), and the ones it may hold open at once.
 */
export interface ConnectionBudget {
  readonly newPerSecond: number;
  readonly newBurst: number;
  readonly tracked: number;
}

/** The named nft counters of each budget's refusals, by the resource they count. */
export const BUDGET_COUNTERS = {
  new_connections: 'new_connections_refused',
  tracked_connections: 'tracked_connections_refused',
} as const;
export type KernelBudget = keyof typeof BUDGET_COUNTERS;

/**
 * Log statements per second, per rule, a sandbox's direct flows may cost (beyond them flows go
 * unrecorded, never unenforced).
 */
const FLOW_LOG_RATE = 'limit rate 500/second burst 1000 packets';
/**
 * A flow, as the log rules know it: a SYN sent again (or a datagram to the same port and from
 * the same one) is the same flow, logged once. Kept long enough to outlast a connect's retries.
 */
const FLOW_KEY = 'ip daddr . meta l4proto . th sport . th dport';
const LOGGED_FLOWS =
  'set logged4 { type ipv4_addr . inet_proto . inet_service . inet_service; flags dynamic, timeout; timeout 2m; size 65536; }';

export interface LearnedElement {
  readonly address: IPAddress;
  /** Absolute expiry, milliseconds on the enforcement table's clock. */
  readonly expiresAt: number;
  /**
   * The ports its names are allowed on (undefined: every port, `learned4`; else each port in
   * `learned4p`).
   */
  readonly ports?: readonly PortRange[];
  /**
   * The ports its names are denied on, by denyOut names or rules that decide each request
   * (`every`: `learned_deny4`; else each port in `learned_deny4p`; none when absent). The
   * allowed ports are checked first: allow beats deny.
   */
  readonly denied?: readonly PortRange[] | 'every';
}

/**
 * Ports one learned address may open in `learned4p`, each an element: a name allowed on more
 * (a wide range) is not opened there (fail closed); its web ports still reach the transparent
 * listener, which decides them by name and port.
 */
export const MAX_LEARNED_PORTS = 1024;

/**
 * Denied ports one learned address may close one by one in `learned_deny4p`; a name denied on
 * more closes the whole address (`learned_deny4`). Closing more than asked fails closed, and it
 * keeps what one answer writes small whatever range a denyOut name gives.
 */
export const MAX_DENIED_PORTS = 32;

/** TCP destination ports that go to the transparent listener when the address rules deny them. */
const REDIRECTED_PORTS = [80, 443] as const;
/** TCP and UDP to this port go to Moat's DNS interceptor, whatever address they were sent to. */
export const DNS_PORT = 53;
/** DNS over TLS: a resolver Moat cannot see into. */
const DOT_PORT = 853;

const TABLE = 'inet moat';
const SET_TYPES = {
  internal4: 'type ipv4_addr; flags interval; auto-merge',
  allow4: 'type ipv4_addr; flags interval; auto-merge',
  deny4: 'type ipv4_addr; flags interval; auto-merge',
  learned4: 'type ipv4_addr; flags timeout',
  // Port-scoped rules (`44.1.2.3:5432`, `db.test:5432`): disjoint address ranges with ports.
  allow4p: 'type ipv4_addr . inet_service; flags interval',
  deny4p: 'type ipv4_addr . inet_service; flags interval',
  learned4p: 'type ipv4_addr . inet_service; flags timeout',
  // Addresses DNS gave for names denyOut names (on some or every port), or whose rules decide
  // each request: the firewall cannot read names, so their bare addresses are closed there.
  learned_deny4: 'type ipv4_addr; flags timeout',
  learned_deny4p: 'type ipv4_addr . inet_service; flags timeout',
} as const;

type LearnedSet = 'learned4' | 'learned4p' | 'learned_deny4' | 'learned_deny4p';
const LEARNED_SETS: readonly LearnedSet[] = [
  'learned4',
  'learned4p',
  'learned_deny4',
  'learned_deny4p',
];
const POLICY_SETS = [
  'allow4',
  'deny4',
  'learned4',
  'allow4p',
  'deny4p',
  'learned4p',
  'learned_deny4',
  'learned_deny4p',
] as const;
/** A TCP or UDP packet's destination address and port, matched against a `4p` set. */
const TO_PORT = 'meta l4proto { tcp, udp } ip daddr . th dport';
const TO_PORT_ORIGINAL = 'meta l4proto { tcp, udp } ct original ip daddr . ct original proto-dst';

/** IPv6 rules need no elements: IPv6 is off on sandbox links. */
const ipv4 = (cidrs: Iterable<CIDR>) =>
  [...cidrs].filter((c) => c.version === 4).map((c) => c.text);

/**
 * The two chains that carry the policy's generation: `this_policy` passes packets of connections
 * marked with it, `learned_open` marks a new connection to a learned address and accepts it.
 */
const GENERATION_CHAINS = ['this_policy', 'learned_open'] as const;

/**
 * Where the sandbox's own rules send what they deny, rewritten with each policy: to the
 * refusals, or in report mode (`NetworkRules.mode`) on its way (logged as let out, so the flow
 * log records what would have been denied). The internal list, the pool and DNS over TLS go to
 * the refusals directly, whatever the mode.
 */
const DENIED_CHAINS = {
  denied_reset: 'goto refuse_reset',
  denied_icmp: 'goto refuse_icmp',
  denied_drop: 'drop',
} as const;

const deniedRules = (report: boolean): string[] =>
  Object.entries(DENIED_CHAINS).flatMap(([chain, refusal]) => [
    `flush chain ${TABLE} ${chain}`,
    `add rule ${TABLE} ${chain} ${report ? 'accept' : refusal}`,
  ]);

/**
 * The two chains that send a sandbox with an upstream proxy through Moat: `tunnel_redirect`
 * takes its web ports to the transparent listener (which decides them by name) and its other TCP
 * of the namespace's own processes to Moat's listener inside it (`redirectPort` on its loopback,
 * which decides them by the address they were sent to); both dial through the proxy. Other TCP
 * that the namespace forwards (a guest's) is refused: see tunnelRules. `tunnel_direct`
 * refuses any TCP that would still leave directly (all but web ports, when Moat has no listener
 * inside), and any that arrives on a direct connection opened before the proxy was named: it
 * must never go around the proxy. Empty for a sandbox without one.
 */
const TUNNEL_CHAINS = ['tunnel_redirect', 'tunnel_direct'] as const;

/** Rewrites the tunnel chains: filled for a sandbox with an upstream proxy, else empty. */
export const tunnelRules = (
  layout: KernelLayout,
  tunnelled: boolean,
  redirectPort?: number,
): string =>
  [
    ...TUNNEL_CHAINS.map((chain) => `flush chain ${TABLE} ${chain}`),
    ...(tunnelled
      ? [
          `add rule ${TABLE} tunnel_redirect tcp dport { ${REDIRECTED_PORTS.join(', ')} } dnat ip to ${layout.gateway.text}:${layout.ports.transparent}`,
          // Moat's own listeners and other sandboxes are on the pool: never redirected.
          ...(redirectPort === undefined
            ? []
            : [
                // The namespace's own processes only: what it forwards (a guest behind it) is not
                // redirected inside, so its other TCP meets tunnel_direct's reset in the forward
                // hook (Moat's listener is on the loopback, which a forwarded packet cannot reach).
                `add rule ${TABLE} tunnel_redirect fib saddr type local ip daddr != ${layout.pool.text} meta l4proto tcp redirect to :${redirectPort}`,
              ]),
          `add rule ${TABLE} tunnel_direct meta l4proto tcp reject with tcp reset`,
        ]
      : []),
  ].join('; ');

/** A random generation to count on from, never 0 (the mark of a connection nothing marked). */
export const newGeneration = (): number => randomInt(1, 2 ** 32);

const generationRules = (generation: number): string[] => {
  const mark = `0x${generation.toString(16)}`;
  return [
    ...GENERATION_CHAINS.map((chain) => `flush chain ${TABLE} ${chain}`),
    `add rule ${TABLE} this_policy ct mark ${mark} accept`,
    `add rule ${TABLE} learned_open ct mark set ${mark} accept`,
  ];
};

const elements = (items: readonly string[]) =>
  items.length ? ` elements = { ${items.join(', ')} }` : '';

/**
 * A conntrack timeout policy for a sandbox's TCP connections, in its table and the host's: a
 * closed one (TIME_WAIT, CLOSE) leaves the table at once instead of after two minutes. `ct count`
 * counts open connections only, so without it a sandbox under its rate would hold rate x 120 s
 * entries of the host's table (and of the kernel's memory and hash in its own).
 */
const CLOSED_LEAVE = 'closed_leave_at_once';
const CLOSED_LEAVE_POLICY = `ct timeout ${CLOSED_LEAVE} { protocol tcp; l3proto ip; policy = { time_wait: 0, close: 0 }; }`;

/**
 * The budget chain, first on the way out (before Moat's DNAT and filter chains, and before the
 * packet reaches the host's namespace, whose connection tracking table every sandbox shares):
 * a new connection over the rate, or over the count of connections the sandbox already holds
 * open, is refused at once (a reset, or ICMP for UDP), never left to time out. Only the first
 * packet of a connection is looked at; the rest of its packets pass at the first rule. One chain
 * for the namespace's own connections and those it forwards: one rate and one count for both.
 */
function budgetChains(budget: ConnectionBudget): string[] {
  const refusal = (resource: KernelBudget) =>
    `chain refuse_${resource} { counter name "${BUDGET_COUNTERS[resource]}"; meta l4proto tcp reject with tcp reset; reject with icmpx admin-prohibited; }`;
  const rules = [
    'ct state != new accept',
    // Conntrack (-200, output or prerouting) has made the new entry; not yet confirmed (that is
    // at the last hook), it takes a policy.
    `meta l4proto tcp ct timeout set "${CLOSED_LEAVE}"`,
    `limit rate over ${budget.newPerSecond}/second burst ${budget.newBurst} packets goto refuse_new_connections`,
    // ct count counts the connections this rule saw that are still open (TIME_WAIT and CLOSE
    // are not open), in this namespace's table.
    `ct count over ${budget.tracked} goto refuse_tracked_connections`,
  ];
  return [
    CLOSED_LEAVE_POLICY,
    ...Object.values(BUDGET_COUNTERS).map((name) => `counter ${name} { }`),
    refusal('new_connections'),
    refusal('tracked_connections'),
    `chain budget { ${rules.join('; ')}; }`,
  ];
}

/** Lists the budget counters (`list counters` of the sandbox's table); read by budgetRefusals. */
export const BUDGET_COUNTERS_QUERY = `list counters table ${TABLE}`;

/**
 * The refusals so far by budget, from nft's answer to BUDGET_COUNTERS_QUERY; a counter the
 * answer lacks is an error naming it (never read as 0).
 */
export function budgetRefusals(listing: string): Record<KernelBudget, number> {
  const read = (resource: KernelBudget): number => {
    const name = BUDGET_COUNTERS[resource];
    const match = new RegExp(`counter ${name} \\{\\s*packets (\\d+)`).exec(listing);
    if (match === null) throw new Error(`nft's counter listing has no counter ${name}`);
    return Number(match[1]);
  };
  return {
    new_connections: read('new_connections'),
    tracked_connections: read('tracked_connections'),
  };
}

/** The sandbox's end of Moat's link: where its traffic leaves for Moat, and its address there. */
export interface SandboxLink {
  /** The host's end of the link (the default route's next hop). */
  readonly host: IPAddress;
  /** The sandbox's source address on the link. */
  readonly address: IPAddress;
  /** The link's device inside the namespace ('eth0' in Moat's own sandboxes). */
  readonly device: string;
}

/**
 * The sandbox's whole table, replacing any earlier one, with every destination denied until the
 * first policy is written into its sets (`policySets`).
 *
 * What the namespace's own processes send and what it forwards (from a VM's tap or a
 * container's bridge behind it) are decided by the same regular chains, each jumped to from two
 * base chains: one on the output (or input) hook, one on the forward (or prerouting) hook. Only
 * Moat's link leads anywhere: nothing leaves by, nor is forwarded in from, another device.
 */
export function sandboxRuleset(layout: KernelLayout, link: SandboxLink): string {
  const gw = layout.gateway.text;
  const { dns, proxy, transparent } = layout.ports;
  const redirected = `{ ${REDIRECTED_PORTS.join(', ')} }`;
  const internal = ipv4(layout.internal.ranges.map((r) => r.cidr));
  const device = JSON.stringify(link.device);
  const sets = Object.entries(SET_TYPES).map(
    ([name, type]) =>
      `set ${name} { ${type};${name === 'internal4' ? elements(internal) : name === 'deny4' ? elements(['0.0.0.0/0']) : ''} }`,
  );
  const redirect = [
    // Every DNS query, to whichever resolver it was sent, goes to the interceptor.
    `meta l4proto { tcp, udp } th dport ${DNS_PORT} dnat ip to ${gw}:${dns}`,
    'ip daddr @internal4 accept',
    'jump tunnel_redirect',
    'ip daddr @allow4 accept',
    `${TO_PORT} @allow4p accept`,
    // Web ports to a destination the address rules deny are decided by name (SNI or Host):
    // that is how allowed names work, learned addresses included (under a deny-all policy they
    // are in deny4). A learned address no rule denies is allowed by its address, name or not.
    `tcp dport ${redirected} ip daddr @deny4 dnat ip to ${gw}:${transparent}`,
    `tcp dport ${redirected} ip daddr . tcp dport @deny4p dnat ip to ${gw}:${transparent}`,
    `tcp dport ${redirected} ip daddr @learned_deny4 dnat ip to ${gw}:${transparent}`,
    `tcp dport ${redirected} ip daddr . tcp dport @learned_deny4p dnat ip to ${gw}:${transparent}`,
  ];
  const egress = [
    // TCP redirected to Moat's listener inside (tunnel_redirect): this hook still sees the
    // device the packet was first routed to, not lo. Only Moat's own rules translate here.
    'ip daddr 127.0.0.1 ct status dnat accept',
    // IPv6 is switched off on the sandbox's link; this holds even if it came back.
    'meta nfproto ipv6 reject with icmpx admin-prohibited',
    `ip daddr ${gw} udp dport ${dns} accept`,
    `ip daddr ${gw} tcp dport { ${[...new Set([dns, proxy, transparent])].join(', ')} } accept`,
    // Answers to connections Moat's ingress opened to the sandbox's own ports.
    `ip daddr ${link.host.text} ct direction reply accept`,
    `tcp dport ${DOT_PORT} goto refuse_drop`,
    `udp dport ${DOT_PORT} goto refuse_drop`,
    'ip daddr @internal4 goto refuse_drop',
    `ip daddr ${layout.pool.text} goto refuse_drop`,
    'jump tunnel_direct',
    'ip daddr @allow4 accept',
    `${TO_PORT} @allow4p accept`,
    // A direct web connection to an address the rules deny can only be one opened before this
    // policy (new ones go to the transparent listener, which reads their name): its name was
    // never read, so it is cut, whatever name its address was learned for.
    `tcp dport ${redirected} ip daddr @deny4 goto denied_reset`,
    `tcp dport ${redirected} ip daddr . tcp dport @deny4p goto denied_reset`,
    // Open connections through a learned address outlive its expiry, not a publish (see top).
    'ct state established,related jump this_policy',
    'ip daddr @learned4 goto learned_open',
    `${TO_PORT} @learned4p goto learned_open`,
    'ip daddr @learned_deny4 meta l4proto tcp goto denied_reset',
    'ip daddr @learned_deny4 goto denied_icmp',
    'ip daddr . tcp dport @learned_deny4p goto denied_reset',
    'ip daddr . udp dport @learned_deny4p goto denied_icmp',
    'ip daddr @deny4 meta l4proto tcp goto denied_reset',
    'ip daddr @deny4 goto denied_icmp',
    'ip daddr . tcp dport @deny4p goto denied_reset',
    'ip daddr . udp dport @deny4p goto denied_icmp',
    'accept',
  ];
  // The first packet of each direct flow is logged for the flow log: refused ones on their way
  // to a refusal, allowed ones by a chain after this one (an accept here goes on to it).
  const logged = (verdict: string) =>
    layout.flowLogGroup === undefined
      ? []
      : [
          `ct state new ${FLOW_KEY} != @logged4 ${FLOW_LOG_RATE} add @logged4 { ${FLOW_KEY} } log group ${layout.flowLogGroup} prefix "moat-${verdict}"`,
        ];
  const refusals = {
    refuse_drop: [...logged('deny'), 'drop'],
    refuse_reset: [...logged('deny'), 'reject with tcp reset'],
    refuse_icmp: [...logged('deny'), 'reject with icmpx admin-prohibited'],
  };
  const egressLog = [
    // Through Moat (DNS, the transparent listener, a tunnel): Moat records those itself.
    'ct status dnat return',
    `ip daddr ${gw} return`,
    `ip daddr ${link.host.text} return`,
    ...logged('allow'),
  ];
  // What arrives on a connection the sandbox opened (or forwarded) is decided as its next
  // packet to that destination would be (the connection's original destination, as the
  // outbound chain saw it): so a publish stops a peer the new policy denies from sending more
  // (a UDP peer keeps sending whatever the sandbox does), in the same transaction as the new sets.
  const arriving = [
    // Connections Moat's ingress opened from the host's end of the link.
    'ct direction original accept',
    // Through Moat (DNS or the transparent listener, which decide and close them themselves),
    // or to Moat's own listeners on the gateway.
    'ct status dnat accept',
    `ip saddr ${gw} accept`,
    'ct original ip daddr @internal4 drop',
    `ct original ip daddr ${layout.pool.text} drop`,
    // With an upstream proxy, nothing comes in on a connection that went around it (one opened
    // before a publish named the proxy, which ends them: this stops their peers from then on).
    'jump tunnel_direct',
    'ct original ip daddr @allow4 accept',
    `${TO_PORT_ORIGINAL} @allow4p accept`,
    `meta l4proto tcp ct original proto-dst ${redirected} ct original ip daddr @deny4 goto denied_drop`,
    `meta l4proto tcp ct original proto-dst ${redirected} ct original ip daddr . ct original proto-dst @deny4p goto denied_drop`,
    'jump this_policy',
    'ct original ip daddr @learned4 accept',
    `${TO_PORT_ORIGINAL} @learned4p accept`,
    'ct original ip daddr @learned_deny4 goto denied_drop',
    `${TO_PORT_ORIGINAL} @learned_deny4p goto denied_drop`,
    'ct original ip daddr @deny4 goto denied_drop',
    `${TO_PORT_ORIGINAL} @deny4p goto denied_drop`,
    'accept',
  ];
  const hooked = (
    type: 'nat' | 'filter',
    hook: string,
    priority: string,
    policy: 'accept' | 'drop',
    rules: string[],
  ) => [`type ${type} hook ${hook} priority ${priority}; policy ${policy}`, ...rules];
  const own = {
    to_moat_local: hooked('nat', 'output', '-100', 'accept', [
      'oifname "lo" accept',
      'jump to_moat',
    ]),
    budget_local: hooked('filter', 'output', 'mangle', 'accept', [
      'oifname "lo" accept',
      'jump budget',
    ]),
    outbound_local: hooked('filter', 'output', 'filter', 'drop', [
      'oifname "lo" accept',
      // Another device (a guest's tap or bridge) takes only what the kernel sends on behalf of
      // a connection it forwards (a refusal's reset or ICMP, a "fragmentation needed").
      `oifname != ${device} ct state related accept`,
      `oifname != ${device} drop`,
      'jump outbound',
    ]),
    outbound_log_local: hooked('filter', 'output', '10', 'accept', [
      'oifname "lo" accept',
      'jump outbound_log',
    ]),
    inbound: hooked('filter', 'input', 'filter', 'drop', [
      'iifname "lo" accept',
      'ct state established,related jump arriving',
      // Moat's ingress, from the link's host end: on the link only (a guest could forge it).
      `iifname ${device} ip saddr ${link.host.text} meta l4proto tcp ct state new accept`,
    ]),
  };
  // What the namespace forwards: out through Moat's link only, decided as its own traffic; in
  // through Moat's link only what answers it, decided by `arriving`.
  const forwarded = {
    to_moat_forwarded: hooked('nat', 'prerouting', '-100', 'accept', [
      `iifname { "lo", ${device} } accept`,
      'jump to_moat',
    ]),
    budget_forwarded: hooked('filter', 'forward', 'mangle', 'accept', [
      `oifname ${device} jump budget`,
    ]),
    forwarded: hooked('filter', 'forward', 'filter', 'drop', [
      `iifname ${device} ct direction reply jump arriving`,
      `iifname != ${device} oifname ${device} jump outbound`,
    ]),
    outbound_log_forwarded: hooked('filter', 'forward', '10', 'accept', [
      `oifname ${device} jump outbound_log`,
    ]),
    // A guest's own source address leaves as the sandbox's: the host's table and Moat's
    // listeners know the sandbox by it, and the host has no route to a guest's subnet.
    leaving: hooked('nat', 'postrouting', 'srcnat', 'accept', [
      `oifname ${device} ip saddr != ${link.address.text} snat ip to ${link.address.text}`,
    ]),
  };
  const chain = (name: string, rules: string[]) => `chain ${name} { ${rules.join('; ')}; }`;
  const chains = {
    to_moat: redirect,
    ...refusals,
    outbound: egress,
    outbound_log: egressLog,
    arriving,
    ...own,
    ...forwarded,
  };
  return [
    `table ${TABLE}`,
    `delete table ${TABLE}`,
    // The generation chains start empty: until the first policy, `goto learned_open` ends in
    // the outbound chain's drop.
    `table ${TABLE} { ${[...sets, LOGGED_FLOWS, ...budgetChains(layout.connections), ...[...GENERATION_CHAINS, ...TUNNEL_CHAINS].map((name) => `chain ${name} { }`), ...Object.entries(DENIED_CHAINS).map(([name, refusal]) => chain(name, [refusal])), ...Object.entries(chains).map(([name, rules]) => chain(name, rules))].join('; ')}; }`,
  ].join('; ');
}

/**
 * Rewrites the policy's sets (and the learned addresses still allowed), where its denials go
 * (its mode) and its generation in one transaction; `generation` must differ from the one in force (KernelEnforcer counts them).
 */
export function policySets(
  policy: Policy,
  learned: readonly LearnedElement[],
  now: number,
  generation: number,
): string {
  const allow = ipv4(
    policy.rules.allowOut.flatMap((rule) =>
      rule.kind === 'address' && rule.ports === undefined ? [rule.cidr] : [],
    ),
  );
  const deny = policy.rules.denyAll
    ? ['0.0.0.0/0']
    : ipv4(
        policy.rules.denyOut.flatMap((rule) =>
          rule.kind === 'address' && rule.ports === undefined ? [rule.cidr] : [],
        ),
      );
  return [
    ...POLICY_SETS.map((set) => `flush set ${TABLE} ${set}`),
    ...addElements('allow4', allow),
    ...addElements('deny4', deny),
    ...addElements('allow4p', portElements(policy, 'allowOut')),
    ...addElements('deny4p', portElements(policy, 'denyOut')),
    ...LEARNED_SETS.flatMap((set) => addElements(set, timed(learned, now, set))),
    ...deniedRules(policy.report),
    ...generationRules(generation),
  ].join('; ');
}

/** `first-last . from-to` for each port-scoped range of a list (disjoint: see portScopedIPv4). */
function portElements(policy: Policy, list: 'allowOut' | 'denyOut'): string[] {
  return portScopedIPv4(policy, list).flatMap(({ first, last, ports }) => {
    const addresses = first === last ? first : `${first}-${last}`;
    return ports.map((range) => `${addresses} . ${portText(range)}`);
  });
}

const portText = ({ from, to }: PortRange) => (from === to ? `${from}` : `${from}-${to}`);

/**
 * Every destination denied, open connections included (a publish that could not be written
 * falls back to this).
 */
export function lockdownSets(generation: number): string {
  return [
    ...POLICY_SETS.map((set) => `flush set ${TABLE} ${set}`),
    ...addElements('deny4', ['0.0.0.0/0']),
    ...deniedRules(false),
    ...generationRules(generation),
  ].join('; ');
}

/**
 * Adds learned addresses, or moves their expiry out. nft keeps an element's first timeout on a
 * plain `add`, so each is added (a no-op when present), deleted and added with its new timeout.
 */
export function learnedElements(learned: readonly LearnedElement[], now: number): string {
  return LEARNED_SETS.flatMap((set) => {
    const items = untimed(learned, set);
    if (items.length === 0) return [];
    return [
      ...addElements(set, items),
      `delete element ${TABLE} ${set} { ${items.join(', ')} }`,
      ...addElements(set, timed(learned, now, set)),
    ];
  }).join('; ');
}

/**
 * The host's side: only Moat's listeners on the gateway are reachable from sandbox links,
 * sandboxes cannot reach each other, and what leaves the host is masqueraded.
 */
export function hostRuleset(layout: KernelLayout): string {
  const links = `"${layout.linkPrefix}*"`;
  const gw = layout.gateway.text;
  const { dns, proxy, transparent } = layout.ports;
  const table = `inet ${layout.hostTable}`;
  const chain = (name: string, rules: string[]) => `chain ${name} { ${rules.join('; ')}; }`;
  return [
    `table ${table}`,
    `delete table ${table}`,
    `table ${table} { ${[
      chain('from_sandboxes', [
        'type filter hook input priority filter; policy accept',
        `iifname ${links} ct state established,related accept`,
        `iifname ${links} ip daddr ${gw} udp dport ${dns} accept`,
        `iifname ${links} ip daddr ${gw} tcp dport { ${[...new Set([dns, proxy, transparent])].join(', ')} } accept`,
        // Host ports the operator opened: the sandbox's own firewall decides them by its policy
        // (and drops the gateway and every link, which are not the host's services).
        ...(layout.hostPorts.length > 0
          ? [`iifname ${links} tcp dport { ${layout.hostPorts.join(', ')} } accept`]
          : []),
        // Everything else addressed to the host, on any of its addresses: it is never a destination.
        `iifname ${links} drop`,
      ]),
      // Sandboxes' traffic with Moat's listeners on the gateway is not tracked here: it needs
      // no NAT and is accepted by port, and tracked it would let one sandbox's connect-and-close
      // loop fill the host's table (closed connections stay in it for two minutes) for all.
      chain('untracked_to_gateway', [
        'type filter hook prerouting priority raw; policy accept',
        `iifname ${links} ip daddr ${gw} notrack`,
      ]),
      // What a sandbox still has tracked here (its host ports, its direct flows): open, held to
      // its cap by its own firewall's ct count; closed, gone at once.
      CLOSED_LEAVE_POLICY,
      chain('tracked_from_sandboxes', [
        // After conntrack (-200): the new entry must exist, not yet confirmed, to take a policy.
        'type filter hook prerouting priority mangle; policy accept',
        `iifname ${links} ct state new meta l4proto tcp ct timeout set "${CLOSED_LEAVE}"`,
      ]),
      chain('untracked_from_gateway', [
        'type filter hook output priority raw; policy accept',
        `oifname ${links} ip saddr ${gw} notrack`,
      ]),
      chain('between_sandboxes', [
        'type filter hook forward priority filter; policy accept',
        `iifname ${links} oifname ${links} drop`,
      ]),
      chain('leaving_host', [
        'type nat hook postrouting priority srcnat; policy accept',
        `ip saddr ${layout.pool.text} oifname != ${links} masquerade`,
      ]),
    ].join('; ')}; }`,
  ].join('; ');
}

/** Removes the host's table (Moat is stopping); no error when it is already gone. */
export function removeHostRuleset(hostTable: string): string {
  return `table inet ${hostTable}; delete table inet ${hostTable}`;
}

function addElements(set: string, items: readonly string[]): string[] {
  return items.length ? [`add element ${TABLE} ${set} { ${items.join(', ')} }`] : [];
}

/**
 * A learned element's entries in one learned set: its address in `learned4` (`learned_deny4`)
 * when it is allowed (denied) on every port, else `address . port` in `learned4p`
 * (`learned_deny4p`) for each port. Past MAX_LEARNED_PORTS an allowed address opens nothing;
 * past MAX_DENIED_PORTS a denied one is closed on every port.
 */
function learnedItems(element: LearnedElement, set: LearnedSet): string[] {
  if (element.address.version !== 4) return [];
  const allowing = set === 'learned4' || set === 'learned4p';
  const ports = allowing ? (element.ports ?? 'every') : (element.denied ?? []);
  const count =
    ports === 'every' ? Infinity : ports.reduce((sum, range) => sum + range.to - range.from + 1, 0);
  const whole = ports === 'every' || (!allowing && count > MAX_DENIED_PORTS);
  if (set === 'learned4' || set === 'learned_deny4') return whole ? [element.address.text] : [];
  if (whole || count > MAX_LEARNED_PORTS) return [];
  return ports.flatMap((range) =>
    Array.from(
      { length: range.to - range.from + 1 },
      (_, i) => `${element.address.text} . ${range.from + i}`,
    ),
  );
}

const untimed = (learned: readonly LearnedElement[], set: LearnedSet) =>
  learned.flatMap((e) => learnedItems(e, set));

function timed(learned: readonly LearnedElement[], now: number, set: LearnedSet): string[] {
  return learned
    .filter((e) => e.expiresAt > now)
    .flatMap((e) => {
      const timeout = ` timeout ${Math.max(1, Math.ceil((e.expiresAt - now) / 1000))}s`;
      return learnedItems(e, set).map((item) => item + timeout);
    });
}
