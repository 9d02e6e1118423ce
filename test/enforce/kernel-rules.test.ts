/**
 * The kernel enforcer's nftables text (src/enforce/kernel-rules.ts), generated from Policies the
 * real policy parser and compiler make. Table tests pin what lands in which set and in which
 * order the chains decide; a property test compares allow4/deny4 with a simple reference.
 *
 * Where this runs as root with nft, every generated line is also applied in a scratch network
 * namespace this test makes (`moat-kr-<pid>`, nothing else is touched), and the sets the kernel
 * then holds are read back and compared as address intervals.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  budgetRefusals,
  hostRuleset,
  type KernelLayout,
  type LearnedElement,
  learnedElements,
  lockdownSets,
  newGeneration,
  policySets,
  removeHostRuleset,
  sandboxRuleset,
  tunnelRules,
} from '../../src/enforce/kernel-rules.js';
import { EnforcementTable, KernelEnforcer } from '../../src/enforce/index.js';
import {
  canonicalName,
  compileInternalDenyList,
  compilePolicy,
  decide,
  type IPAddress,
  parseCIDR,
  parseInternalDenyList,
  parseIP,
  parseNetworkConfig,
  type Policy,
} from '../../src/policy/index.js';

const unwrap = <T>(result: { ok: true; value: T } | { ok: false; error: string }): T => {
  if (!result.ok) throw new Error(result.error);
  return result.value;
};
const ip = (text: string): IPAddress => unwrap(parseIP(text));

const INTERNAL = compileInternalDenyList(
  unwrap(parseInternalDenyList('169.254.0.0/16, 100.64.0.0/10, fd00::/8')),
);

const LAYOUT: KernelLayout = {
  gateway: ip('10.216.0.1'),
  ports: { dns: 53, proxy: 3128, transparent: 3129 },
  pool: unwrap(parseCIDR('10.216.0.0/24')),
  hostPorts: [],
  internal: INTERNAL,
  linkPrefix: 'mtabc123-',
  hostTable: 'moat_abc123',
  flowLogGroup: 7,
  connections: { newPerSecond: 200, newBurst: 400, tracked: 4096 },
};
const LINK_HOST = ip('10.216.0.5');
/** The sandbox's end of Moat's link, as Moat's own sandboxes have it. */
const LINK = { host: LINK_HOST, address: ip('10.216.0.6'), device: 'eth0' };

/** A Policy as the sandbox service compiles one (SandboxPolicies.compile in src/sandbox/policies.ts). */
function policyOf(rules: Record<string, unknown>): Policy {
  const parsed = parseNetworkConfig(rules);
  if (!parsed.ok) throw new Error(parsed.errors.map((problem) => problem.message).join('; '));
  return compilePolicy(parsed.value, INTERNAL);
}

/** Splits at `;` outside braces. */
function splitTop(text: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    if (text[i] === '{') depth++;
    else if (text[i] === '}') depth--;
    else if (text[i] === ';' && depth === 0) {
      parts.push(text.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(text.slice(start));
  return parts.map((part) => part.trim()).filter((part) => part !== '');
}

/** What `{ ... }` holds, from the first brace to its partner at the end. */
const inside = (text: string) => text.slice(text.indexOf('{') + 1, text.lastIndexOf('}'));

/** The elements each `add element inet moat <set> { ... }` command of a line adds, per set. */
function added(line: string): Record<string, string[]> {
  const sets: Record<string, string[]> = {};
  for (const command of splitTop(line)) {
    const match = /^add element inet moat (\w+) \{ (.*) \}$/.exec(command);
    if (match) (sets[match[1]!] ??= []).push(...match[2]!.split(', '));
  }
  return sets;
}

/** The sets and chains of a generated table line (`table; delete table; table { ... }`). */
function tableOf(line: string): {
  commands: string[];
  sets: Record<string, string>;
  chains: Record<string, string[]>;
  counters: string[];
  timeouts: Record<string, string[]>;
} {
  const commands = splitTop(line);
  const sets: Record<string, string> = {};
  const chains: Record<string, string[]> = {};
  const counters: string[] = [];
  const timeouts: Record<string, string[]> = {};
  for (const item of splitTop(inside(commands.at(-1)!))) {
    const [kind, name] = item.split(' ', 2);
    if (kind === 'set') sets[name!] = inside(item).trim();
    else if (kind === 'chain') chains[name!] = splitTop(inside(item));
    else if (kind === 'counter') counters.push(name!);
    else if (item.startsWith('ct timeout ')) timeouts[item.split(' ')[2]!] = splitTop(inside(item));
    else throw new Error(`unexpected table item ${item}`);
  }
  return { commands, sets, chains, counters, timeouts };
}

const NOW = 1_700_000_000_000;
/** The policy generation the sets are written with (a conntrack mark), and its two rules. */
const GENERATION = 0x2a;
const GENERATION_RULES = [
  'flush chain inet moat this_policy',
  'flush chain inet moat learned_open',
  'add rule inet moat this_policy ct mark 0x2a accept',
  'add rule inet moat learned_open ct mark set 0x2a accept',
];
const learned = (
  address: string,
  inMs: number,
  ports?: Array<{ from: number; to: number }>,
): LearnedElement => ({ address: ip(address), expiresAt: NOW + inMs, ports });
/** Where an enforcing policy sends its denials: the refusals (report mode: accept). */
const DENIED_RULES = [
  'flush chain inet moat denied_reset',
  'add rule inet moat denied_reset goto refuse_reset',
  'flush chain inet moat denied_icmp',
  'add rule inet moat denied_icmp goto refuse_icmp',
  'flush chain inet moat denied_drop',
  'add rule inet moat denied_drop drop',
];
/** Every policy write empties each policy set first. */
const FLUSHES = [
  'allow4',
  'deny4',
  'learned4',
  'allow4p',
  'deny4p',
  'learned4p',
  'learned_deny4',
  'learned_deny4p',
].map((set) => `flush set inet moat ${set}`);

describe('kernel rules: the sandbox table', () => {
  const line = sandboxRuleset(LAYOUT, LINK);
  const table = tableOf(line);

  it('is one line that replaces any earlier table', () => {
    expect(line).not.toContain('\n');
    expect(table.commands.slice(0, 2)).toEqual(['table inet moat', 'delete table inet moat']);
    expect(table.commands).toHaveLength(3);
  });

  it('starts with every destination denied and only the IPv4 internal ranges', () => {
    expect(table.sets).toEqual({
      internal4:
        'type ipv4_addr; flags interval; auto-merge; elements = { 169.254.0.0/16, 100.64.0.0/10 }',
      allow4: 'type ipv4_addr; flags interval; auto-merge;',
      deny4: 'type ipv4_addr; flags interval; auto-merge; elements = { 0.0.0.0/0 }',
      learned4: 'type ipv4_addr; flags timeout;',
      allow4p: 'type ipv4_addr . inet_service; flags interval;',
      deny4p: 'type ipv4_addr . inet_service; flags interval;',
      learned4p: 'type ipv4_addr . inet_service; flags timeout;',
      learned_deny4: 'type ipv4_addr; flags timeout;',
      learned_deny4p: 'type ipv4_addr . inet_service; flags timeout;',
      logged4:
        'type ipv4_addr . inet_proto . inet_service . inet_service; flags dynamic, timeout; timeout 2m; size 65536;',
    });
  });

  it('sends DNS to the gateway first, and web ports of denied addresses (learned ones too) to the transparent listener', () => {
    expect(table.chains.to_moat).toEqual([
      'meta l4proto { tcp, udp } th dport 53 dnat ip to 10.216.0.1:53',
      'ip daddr @internal4 accept',
      'jump tunnel_redirect',
      'ip daddr @allow4 accept',
      'meta l4proto { tcp, udp } ip daddr . th dport @allow4p accept',
      'tcp dport { 80, 443 } ip daddr @deny4 dnat ip to 10.216.0.1:3129',
      'tcp dport { 80, 443 } ip daddr . tcp dport @deny4p dnat ip to 10.216.0.1:3129',
      'tcp dport { 80, 443 } ip daddr @learned_deny4 dnat ip to 10.216.0.1:3129',
      'tcp dport { 80, 443 } ip daddr . tcp dport @learned_deny4p dnat ip to 10.216.0.1:3129',
    ]);
  });

  it('decides outbound traffic in order: gateway, DoT, internal, pool, allow, direct web connections to denied addresses, open connections of this policy, learned, learned denied, deny', () => {
    expect(table.chains.outbound).toEqual([
      'ip daddr 127.0.0.1 ct status dnat accept',
      'meta nfproto ipv6 reject with icmpx admin-prohibited',
      'ip daddr 10.216.0.1 udp dport 53 accept',
      'ip daddr 10.216.0.1 tcp dport { 53, 3128, 3129 } accept',
      'ip daddr 10.216.0.5 ct direction reply accept',
      'tcp dport 853 goto refuse_drop',
      'udp dport 853 goto refuse_drop',
      'ip daddr @internal4 goto refuse_drop',
      'ip daddr 10.216.0.0/24 goto refuse_drop',
      'jump tunnel_direct',
      'ip daddr @allow4 accept',
      'meta l4proto { tcp, udp } ip daddr . th dport @allow4p accept',
      'tcp dport { 80, 443 } ip daddr @deny4 goto denied_reset',
      'tcp dport { 80, 443 } ip daddr . tcp dport @deny4p goto denied_reset',
      'ct state established,related jump this_policy',
      'ip daddr @learned4 goto learned_open',
      'meta l4proto { tcp, udp } ip daddr . th dport @learned4p goto learned_open',
      'ip daddr @learned_deny4 meta l4proto tcp goto denied_reset',
      'ip daddr @learned_deny4 goto denied_icmp',
      'ip daddr . tcp dport @learned_deny4p goto denied_reset',
      'ip daddr . udp dport @learned_deny4p goto denied_icmp',
      'ip daddr @deny4 meta l4proto tcp goto denied_reset',
      'ip daddr @deny4 goto denied_icmp',
      'ip daddr . tcp dport @deny4p goto denied_reset',
      'ip daddr . udp dport @deny4p goto denied_icmp',
      'accept',
    ]);
  });

  it("jumps to the same chains from the namespace's own hooks and from its forward hooks", () => {
    expect(table.chains.to_moat_local).toEqual([
      'type nat hook output priority -100',
      'policy accept',
      'oifname "lo" accept',
      'jump to_moat',
    ]);
    expect(table.chains.to_moat_forwarded).toEqual([
      'type nat hook prerouting priority -100',
      'policy accept',
      // What arrives on Moat's link is never redirected (nor what loops back).
      'iifname { "lo", "eth0" } accept',
      'jump to_moat',
    ]);
    expect(table.chains.budget_local).toEqual([
      'type filter hook output priority mangle',
      'policy accept',
      'oifname "lo" accept',
      'jump budget',
    ]);
    expect(table.chains.budget_forwarded).toEqual([
      'type filter hook forward priority mangle',
      'policy accept',
      'oifname "eth0" jump budget',
    ]);
    expect(table.chains.outbound_local).toEqual([
      'type filter hook output priority filter',
      'policy drop',
      'oifname "lo" accept',
      'oifname != "eth0" ct state related accept',
      'oifname != "eth0" drop',
      'jump outbound',
    ]);
    expect(table.chains.forwarded).toEqual([
      'type filter hook forward priority filter',
      'policy drop',
      'iifname "eth0" ct direction reply jump arriving',
      'iifname != "eth0" oifname "eth0" jump outbound',
    ]);
    expect(table.chains.outbound_log_local).toEqual([
      'type filter hook output priority 10',
      'policy accept',
      'oifname "lo" accept',
      'jump outbound_log',
    ]);
    expect(table.chains.outbound_log_forwarded).toEqual([
      'type filter hook forward priority 10',
      'policy accept',
      'oifname "eth0" jump outbound_log',
    ]);
  });

  it("leaves through Moat's link only under the sandbox's address", () => {
    expect(table.chains.leaving).toEqual([
      'type nat hook postrouting priority srcnat',
      'policy accept',
      'oifname "eth0" ip saddr != 10.216.0.6 snat ip to 10.216.0.6',
    ]);
  });

  it('writes the device install is given, and nothing for a name that could end a rule', async () => {
    const applied: string[] = [];
    const table = new EnforcementTable({ now: () => NOW });
    const policy = policyOf({});
    table.register('idevicesandbox000001', { egressSecret: 's' }, policy);
    const enforcer = new KernelEnforcer(LAYOUT, {
      table,
      apply: async (_, commands) => void applied.push(commands),
      list: async () => '',
      limitBandwidth: async () => {},
      applyHost: async () => {},
      now: () => NOW,
    });
    const address = ip('10.216.0.6');
    await enforcer.install('idevicesandbox000001', address, policy, undefined, 'moat0');
    expect(applied).toHaveLength(1);
    expect(applied[0]).toContain('iifname != "moat0" oifname "moat0" jump outbound');
    // Without one: Moat's own sandboxes' eth0.
    await enforcer.install('idevicesandbox000001', address, policy);
    expect(applied[1]).toContain('iifname != "eth0" oifname "eth0" jump outbound');
    for (const hostile of ['x";flush ruleset', 'a b', '', 'sixteen-chars-xx', 'tap\n0'])
      await expect(
        enforcer.install('idevicesandbox000001', address, policy, undefined, hostile),
        hostile,
      ).rejects.toThrow(`link device ${JSON.stringify(hostile)} is not a device name`);
    expect(applied).toHaveLength(2);
  });

  it("names the link's device it is given (a network-only sandbox's)", () => {
    const { chains } = tableOf(sandboxRuleset(LAYOUT, { ...LINK, device: 'moat0' }));
    expect(chains.forwarded).toContain('iifname != "moat0" oifname "moat0" jump outbound');
    expect(chains.outbound_local).toContain('oifname != "moat0" drop');
    expect(chains.leaving).toContain(
      'oifname "moat0" ip saddr != 10.216.0.6 snat ip to 10.216.0.6',
    );
  });

  it('logs the first packet of each direct flow, refused or let out, rate-limited, for the flow log', () => {
    // Once per flow: a SYN sent again finds its flow in logged4.
    const flow = 'ip daddr . meta l4proto . th sport . th dport';
    const log = (verdict: string) =>
      `ct state new ${flow} != @logged4 limit rate 500/second burst 1000 packets add @logged4 { ${flow} } log group 7 prefix "moat-${verdict}"`;
    expect(table.chains.refuse_drop).toEqual([log('deny'), 'drop']);
    expect(table.chains.refuse_reset).toEqual([log('deny'), 'reject with tcp reset']);
    expect(table.chains.refuse_icmp).toEqual([log('deny'), 'reject with icmpx admin-prohibited']);
    // After the filter (what it accepted), and never what goes through Moat.
    expect(table.chains.outbound_log).toEqual([
      'ct status dnat return',
      'ip daddr 10.216.0.1 return',
      'ip daddr 10.216.0.5 return',
      log('allow'),
    ]);
  });

  it('refuses new connections over the rate or over the open count first, with a reset or ICMP, counted; lets closed ones leave its table at once', () => {
    expect(table.chains.budget).toEqual([
      'ct state != new accept',
      'meta l4proto tcp ct timeout set "closed_leave_at_once"',
      'limit rate over 200/second burst 400 packets goto refuse_new_connections',
      'ct count over 4096 goto refuse_tracked_connections',
    ]);
    // Closed connections leave its table at once: ct count does not count them.
    expect(table.timeouts).toEqual({
      closed_leave_at_once: ['protocol tcp', 'l3proto ip', 'policy = { time_wait: 0, close: 0 }'],
    });
    expect(table.counters).toEqual(['new_connections_refused', 'tracked_connections_refused']);
    for (const [chain, counter] of [
      ['refuse_new_connections', 'new_connections_refused'],
      ['refuse_tracked_connections', 'tracked_connections_refused'],
    ] as const)
      expect(table.chains[chain]).toEqual([
        `counter name "${counter}"`,
        'meta l4proto tcp reject with tcp reset',
        'reject with icmpx admin-prohibited',
      ]);
  });

  it("reads the budget counters from nft's listing, and refuses a listing without one", () => {
    const listing = `table inet moat {
	counter new_connections_refused {
		packets 4660 bytes 279600
	}
	counter tracked_connections_refused {
		packets 73 bytes 4380
	}
}`;
    expect(budgetRefusals(listing)).toEqual({ new_connections: 4660, tracked_connections: 73 });
    expect(() => budgetRefusals('Error: No such file or directory')).toThrow(
      'no counter new_connections_refused',
    );
  });

  it('starts with empty generation chains: nothing passes on a mark, and learned4 ends in drop', () => {
    expect(table.chains.this_policy).toEqual([]);
    expect(table.chains.learned_open).toEqual([]);
  });

  it('starts with empty tunnel chains: a sandbox without an upstream proxy goes direct', () => {
    expect(table.chains.tunnel_redirect).toEqual([]);
    expect(table.chains.tunnel_direct).toEqual([]);
  });

  it('lets in only answers and new TCP connections from the host end of the link, on the link', () => {
    expect(table.chains.inbound).toEqual([
      'type filter hook input priority filter',
      'policy drop',
      'iifname "lo" accept',
      'ct state established,related jump arriving',
      'iifname "eth0" ip saddr 10.216.0.5 meta l4proto tcp ct state new accept',
    ]);
  });

  it('decides answers by where their connection went, as the outbound chain would now', () => {
    expect(table.chains.arriving).toEqual([
      'ct direction original accept',
      'ct status dnat accept',
      'ip saddr 10.216.0.1 accept',
      'ct original ip daddr @internal4 drop',
      'ct original ip daddr 10.216.0.0/24 drop',
      'jump tunnel_direct',
      'ct original ip daddr @allow4 accept',
      'meta l4proto { tcp, udp } ct original ip daddr . ct original proto-dst @allow4p accept',
      'meta l4proto tcp ct original proto-dst { 80, 443 } ct original ip daddr @deny4 goto denied_drop',
      'meta l4proto tcp ct original proto-dst { 80, 443 } ct original ip daddr . ct original proto-dst @deny4p goto denied_drop',
      'jump this_policy',
      'ct original ip daddr @learned4 accept',
      'meta l4proto { tcp, udp } ct original ip daddr . ct original proto-dst @learned4p accept',
      'ct original ip daddr @learned_deny4 goto denied_drop',
      'meta l4proto { tcp, udp } ct original ip daddr . ct original proto-dst @learned_deny4p goto denied_drop',
      'ct original ip daddr @deny4 goto denied_drop',
      'meta l4proto { tcp, udp } ct original ip daddr . ct original proto-dst @deny4p goto denied_drop',
      'accept',
    ]);
  });

  it('names each gateway port once when listeners share a port', () => {
    const shared = { ...LAYOUT, ports: { dns: 3053, proxy: 3128, transparent: 3128 } };
    const { chains } = tableOf(sandboxRuleset(shared, LINK));
    expect(chains.outbound).toContain('ip daddr 10.216.0.1 tcp dport { 3053, 3128 } accept');
    expect(chains.to_moat).toContain(
      'meta l4proto { tcp, udp } th dport 53 dnat ip to 10.216.0.1:3053',
    );
  });
});

describe('kernel rules: policy sets', () => {
  const cases: Array<{
    name: string;
    rules: Record<string, unknown>;
    allow4?: string[];
    deny4?: string[];
    allow4p?: string[];
    deny4p?: string[];
  }> = [
    {
      name: 'port-scoped addresses go to allow4p and deny4p as disjoint ranges with their ports',
      rules: {
        allowOut: ['44.1.2.3:5432', '44.1.0.0/16:443', '44.1.2.0/24:8000-8100', 'db.test:5432'],
        denyOut: ['0.0.0.0/0', '8.8.8.8:53', '9.9.9.0/24:25-587'],
      },
      allow4p: [
        '44.1.0.0-44.1.1.255 . 443',
        '44.1.2.0-44.1.2.2 . 443',
        '44.1.2.0-44.1.2.2 . 8000-8100',
        '44.1.2.3 . 443',
        '44.1.2.3 . 5432',
        '44.1.2.3 . 8000-8100',
        '44.1.2.4-44.1.2.255 . 443',
        '44.1.2.4-44.1.2.255 . 8000-8100',
        '44.1.3.0-44.1.255.255 . 443',
      ],
      deny4: ['0.0.0.0/0'],
      deny4p: ['8.8.8.8 . 53', '9.9.9.0-9.9.9.255 . 25-587'],
    },
    {
      name: 'allowOut addresses go to allow4; names, wildcards and IPv6 do not',
      rules: {
        allowOut: [
          '1.2.3.4',
          '10.1.2.3/8',
          'example.com',
          '*.example.org',
          '2001:db8::/32',
          '::ffff:5.6.7.8',
          '::ffff:9.9.0.0/112',
        ],
        denyOut: ['0.0.0.0/0'],
      },
      allow4: ['1.2.3.4/32', '10.0.0.0/8', '5.6.7.8/32', '9.9.0.0/16'],
      deny4: ['0.0.0.0/0'],
    },
    {
      name: 'denyOut 0.0.0.0/0 denies all of IPv4, whatever else denyOut holds',
      rules: { allowOut: ['8.8.8.8'], denyOut: ['9.9.9.9', '0.0.0.0/0', '::/0'] },
      allow4: ['8.8.8.8/32'],
      deny4: ['0.0.0.0/0'],
    },
    {
      name: 'allow_internet_access false denies all of IPv4',
      rules: { allow_internet_access: false, allowOut: ['8.8.8.8'], denyOut: ['9.9.9.9'] },
      allow4: ['8.8.8.8/32'],
      deny4: ['0.0.0.0/0'],
    },
    {
      name: 'allow_internet_access false alone',
      rules: { allow_internet_access: false },
      deny4: ['0.0.0.0/0'],
    },
    {
      name: 'default allow: denyOut IPv4 ranges go to deny4, IPv6 ones do not',
      rules: { denyOut: ['9.9.9.9', '203.0.113.0/24', '2001:db8::/32', '::/0'] },
      deny4: ['9.9.9.9/32', '203.0.113.0/24'],
    },
    {
      name: 'allow_internet_access true with no lists: every set empty',
      rules: { allow_internet_access: true },
    },
    { name: 'no rules: every set empty', rules: {} },
  ];

  it.each(cases)('$name', ({ rules, allow4, deny4, allow4p, deny4p }) => {
    const line = policySets(policyOf(rules), [], NOW, GENERATION);
    expect(line).not.toContain('\n');
    const commands = splitTop(line);
    expect(commands.slice(0, FLUSHES.length)).toEqual(FLUSHES);
    const expected: Record<string, string[]> = {};
    if (allow4) expected.allow4 = allow4;
    if (deny4) expected.deny4 = deny4;
    if (allow4p) expected.allow4p = allow4p;
    if (deny4p) expected.deny4p = deny4p;
    expect(added(line)).toEqual(expected);
    expect(commands).toHaveLength(
      FLUSHES.length + Object.keys(expected).length + DENIED_RULES.length + GENERATION_RULES.length,
    );
    expect(commands.slice(-DENIED_RULES.length - GENERATION_RULES.length)).toEqual([
      ...DENIED_RULES,
      ...GENERATION_RULES,
    ]);
  });

  it('writes learned addresses with whole seconds left, rounded up, at least 1 s; expired and IPv6 ones are left out', () => {
    const line = policySets(
      policyOf({ allowOut: ['example.com'], denyOut: ['0.0.0.0/0'] }),
      [
        learned('203.0.113.1', 300_000),
        learned('203.0.113.2', 299_001),
        learned('203.0.113.3', 1_500),
        learned('1.1.1.4', 1),
        learned('1.1.1.5', 0),
        learned('1.1.1.6', -5_000),
        learned('2001:db8::1', 60_000),
      ],
      NOW,
      GENERATION,
    );
    expect(line).not.toContain('\n');
    expect(added(line).learned4).toEqual([
      '203.0.113.1 timeout 300s',
      '203.0.113.2 timeout 300s',
      '203.0.113.3 timeout 2s',
      '1.1.1.4 timeout 1s',
    ]);
  });

  it('lockdown empties allow4 and learned4, denies all of IPv4 and starts a new generation', () => {
    expect(splitTop(lockdownSets(GENERATION))).toEqual([
      ...FLUSHES,
      'add element inet moat deny4 { 0.0.0.0/0 }',
      ...DENIED_RULES,
      ...GENERATION_RULES,
    ]);
  });

  it('draws generations at random, never 0', () => {
    const drawn = Array.from({ length: 1000 }, newGeneration);
    expect(new Set(drawn).size).toBeGreaterThan(990);
    for (const g of drawn) expect(Number.isInteger(g) && g >= 1 && g < 2 ** 32).toBe(true);
  });
});

describe('kernel rules: learned addresses', () => {
  it('adds, deletes and adds again with the new timeout, leaving expired ones out of the last add', () => {
    const line = learnedElements(
      [learned('203.0.113.1', 60_000), learned('203.0.113.2', 0), learned('203.0.113.3', 10)],
      NOW,
    );
    expect(line).toBe(
      'add element inet moat learned4 { 203.0.113.1, 203.0.113.2, 203.0.113.3 }; ' +
        'delete element inet moat learned4 { 203.0.113.1, 203.0.113.2, 203.0.113.3 }; ' +
        'add element inet moat learned4 { 203.0.113.1 timeout 60s, 203.0.113.3 timeout 1s }',
    );
  });

  it('opens an address learned for a port-scoped name on its ports only, in learned4p', () => {
    const line = learnedElements(
      [
        learned('203.0.113.1', 60_000, [
          { from: 22, to: 22 },
          { from: 8000, to: 8002 },
        ]),
        learned('203.0.113.2', 60_000),
        // More ports than one address may open in learned4p: not opened (fail closed).
        learned('203.0.113.3', 60_000, [{ from: 1, to: 2000 }]),
        learned('203.0.113.4', 60_000, []),
      ],
      NOW,
    );
    const p = [
      '203.0.113.1 . 22',
      '203.0.113.1 . 8000',
      '203.0.113.1 . 8001',
      '203.0.113.1 . 8002',
    ];
    expect(splitTop(line)).toEqual([
      'add element inet moat learned4 { 203.0.113.2 }',
      'delete element inet moat learned4 { 203.0.113.2 }',
      'add element inet moat learned4 { 203.0.113.2 timeout 60s }',
      `add element inet moat learned4p { ${p.join(', ')} }`,
      `delete element inet moat learned4p { ${p.join(', ')} }`,
      `add element inet moat learned4p { ${p.map((e) => `${e} timeout 60s`).join(', ')} }`,
    ]);
  });

  it('closes an address learned for a denied name on its denied ports, or on every port past the element cap', () => {
    const denied = (address: string, ports: LearnedElement['denied']): LearnedElement => ({
      ...learned(address, 30_000, []),
      denied: ports,
    });
    const line = learnedElements(
      [
        denied('203.0.113.1', [{ from: 25, to: 26 }]),
        denied('203.0.113.2', 'every'),
        // More ports than one address may close one by one (32): closed on every port.
        denied('203.0.113.3', [{ from: 1, to: 33 }]),
        denied('203.0.113.4', []),
      ],
      NOW,
    );
    expect(splitTop(line)).toEqual([
      'add element inet moat learned_deny4 { 203.0.113.2, 203.0.113.3 }',
      'delete element inet moat learned_deny4 { 203.0.113.2, 203.0.113.3 }',
      'add element inet moat learned_deny4 { 203.0.113.2 timeout 30s, 203.0.113.3 timeout 30s }',
      'add element inet moat learned_deny4p { 203.0.113.1 . 25, 203.0.113.1 . 26 }',
      'delete element inet moat learned_deny4p { 203.0.113.1 . 25, 203.0.113.1 . 26 }',
      'add element inet moat learned_deny4p { 203.0.113.1 . 25 timeout 30s, 203.0.113.1 . 26 timeout 30s }',
    ]);
  });

  it('is empty when nothing is IPv4', () => {
    expect(learnedElements([], NOW)).toBe('');
    expect(learnedElements([learned('2001:db8::1', 60_000)], NOW)).toBe('');
  });
});

describe('kernel rules: the host table', () => {
  it('opens only the gateway ports to sandbox links, untracked, lets closed connections leave the table at once, separates links and masquerades the pool', () => {
    const line = hostRuleset(LAYOUT);
    expect(line).not.toContain('\n');
    const table = tableOf(line);
    expect(table.commands.slice(0, 2)).toEqual([
      'table inet moat_abc123',
      'delete table inet moat_abc123',
    ]);
    expect(table.sets).toEqual({});
    expect(table.timeouts).toEqual({
      closed_leave_at_once: ['protocol tcp', 'l3proto ip', 'policy = { time_wait: 0, close: 0 }'],
    });
    expect(table.chains).toEqual({
      from_sandboxes: [
        'type filter hook input priority filter',
        'policy accept',
        'iifname "mtabc123-*" ct state established,related accept',
        'iifname "mtabc123-*" ip daddr 10.216.0.1 udp dport 53 accept',
        'iifname "mtabc123-*" ip daddr 10.216.0.1 tcp dport { 53, 3128, 3129 } accept',
        'iifname "mtabc123-*" drop',
      ],
      untracked_to_gateway: [
        'type filter hook prerouting priority raw',
        'policy accept',
        'iifname "mtabc123-*" ip daddr 10.216.0.1 notrack',
      ],
      tracked_from_sandboxes: [
        'type filter hook prerouting priority mangle',
        'policy accept',
        'iifname "mtabc123-*" ct state new meta l4proto tcp ct timeout set "closed_leave_at_once"',
      ],
      untracked_from_gateway: [
        'type filter hook output priority raw',
        'policy accept',
        'oifname "mtabc123-*" ip saddr 10.216.0.1 notrack',
      ],
      between_sandboxes: [
        'type filter hook forward priority filter',
        'policy accept',
        'iifname "mtabc123-*" oifname "mtabc123-*" drop',
      ],
      leaving_host: [
        'type nat hook postrouting priority srcnat',
        'policy accept',
        'ip saddr 10.216.0.0/24 oifname != "mtabc123-*" masquerade',
      ],
    });
    expect(removeHostRuleset('moat_abc123')).toBe(
      'table inet moat_abc123; delete table inet moat_abc123',
    );
  });

  it("accepts the host ports the operator opened, and nothing else of the host's", () => {
    const chains = tableOf(hostRuleset({ ...LAYOUT, hostPorts: [8080, 9000] })).chains;
    expect(chains.from_sandboxes!.slice(-2)).toEqual([
      'iifname "mtabc123-*" tcp dport { 8080, 9000 } accept',
      'iifname "mtabc123-*" drop',
    ]);
  });
});

// --- property: allow4/deny4 against a reference -------------------------------------------------

const octets = (word: number) =>
  [word >>> 24, (word >>> 16) & 255, (word >>> 8) & 255, word & 255].join('.');
const maskOf = (length: number) => (length === 0 ? 0 : (~0 << (32 - length)) >>> 0);

/** An IPv4 rule as nft gets it: network address and prefix length; undefined for anything else. */
function refIPv4(entry: string): string | undefined {
  const match = /^(::ffff:)?(\d+)\.(\d+)\.(\d+)\.(\d+)(?:\/(\d+))?$/.exec(entry);
  if (!match) return undefined;
  const mapped = match[1] !== undefined;
  const length = match[6] === undefined ? 32 : Number(match[6]) - (mapped ? 96 : 0);
  const word = match.slice(2, 6).reduce((w, part) => ((w << 8) | Number(part)) >>> 0, 0);
  return `${octets((word & maskOf(length)) >>> 0)}/${length}`;
}

const v4Word = fc.oneof(
  fc.integer({ min: 1, max: 0xffffffff }),
  // A few /16s so that rules overlap and repeat.
  fc
    .tuple(fc.constantFrom(0x08080000, 0x5db80000, 0xc0a80000), fc.integer({ min: 0, max: 0xffff }))
    .map(([base, low]) => base + low),
);
/** IPv4 rules as a user writes them (plain, CIDR with or without host bits, IPv4-mapped). */
const v4Entry = fc
  .tuple(v4Word, fc.integer({ min: 0, max: 33 }), fc.boolean())
  .map(([word, length, mapped]) => {
    const text = octets(word);
    const suffix = length === 33 ? '' : `/${mapped ? length + 96 : length}`;
    return `${mapped ? '::ffff:' : ''}${text}${suffix}`;
  })
  // The unspecified network is not a rule (only 0.0.0.0/0 in denyOut, added apart).
  .filter((entry) => !refIPv4(entry)!.startsWith('0.0.0.0/'));
const v6Entry = fc.constantFrom('2001:db8::/32', '2606:4700::1111', 'fd00::/8', '::1');
const nameEntry = fc.constantFrom('example.com', '*.example.org', 'api.example.net');

const policyInput = fc
  .record({
    allowAddresses: fc.array(fc.oneof(v4Entry, v4Entry, v6Entry), { maxLength: 12 }),
    names: fc.array(nameEntry, { maxLength: 3 }),
    deny: fc.array(fc.oneof(v4Entry, v4Entry, v6Entry, fc.constant('::/0')), { maxLength: 12 }),
    allTraffic: fc.boolean(),
    access: fc.constantFrom(true, false, undefined),
  })
  .map(({ allowAddresses, names, deny, allTraffic, access }) => {
    const denyAll = allTraffic || access === false;
    const denyOut = allTraffic ? [...deny, '0.0.0.0/0'] : deny;
    // Names need a deny-all policy (ALL_TRAFFIC_MESSAGE otherwise).
    const allowOut = denyAll ? [...allowAddresses, ...names] : allowAddresses;
    const rules: Record<string, unknown> = { allowOut, denyOut };
    if (access !== undefined) rules.allow_internet_access = access;
    return { rules, allowOut, denyOut, denyAll };
  });

function referenceSets(input: { allowOut: string[]; denyOut: string[]; denyAll: boolean }) {
  const v4 = (entries: string[]) =>
    entries.map(refIPv4).filter((cidr): cidr is string => cidr !== undefined);
  return {
    allow4: v4(input.allowOut),
    deny4: input.denyAll ? ['0.0.0.0/0'] : v4(input.denyOut),
  };
}

describe('kernel rules: property', () => {
  it('allow4 and deny4 hold exactly the IPv4 address rules of the input', () => {
    fc.assert(
      fc.property(policyInput, (input) => {
        const line = policySets(policyOf(input.rules), [], NOW, GENERATION);
        expect(line).not.toContain('\n');
        const sets = added(line);
        const expected = referenceSets(input);
        expect(sets.allow4 ?? []).toEqual(expected.allow4);
        expect(sets.deny4 ?? []).toEqual(expected.deny4);
        expect(sets.learned4).toBeUndefined();
      }),
      { numRuns: 2000 },
    );
  });
});

// --- the kernel: every line applied in a scratch namespace --------------------------------------

const IP_TOOL = '/usr/sbin/ip';
const NFT = '/usr/sbin/nft';
const NSENTER = '/usr/bin/nsenter';
const kernelSkip =
  process.getuid?.() !== 0
    ? 'not running as root'
    : [IP_TOOL, NFT, NSENTER].find((tool) => !existsSync(tool)) !== undefined
      ? `${[IP_TOOL, NFT, NSENTER].find((tool) => !existsSync(tool))} is missing`
      : undefined;
if (kernelSkip !== undefined) {
  console.warn(`test/enforce/kernel-rules: kernel checks skipped: ${kernelSkip}`);
}

/** An address interval, inclusive, as 32-bit numbers. */
type Interval = readonly [number, number];

const toWord = (text: string) =>
  text.split('.').reduce((word, part) => ((word << 8) | Number(part)) >>> 0, 0);

/** Sorted, with overlapping and adjacent intervals joined: one spelling per address set. */
function merged(intervals: Interval[]): Interval[] {
  const sorted = [...intervals].sort((a, b) => a[0] - b[0]);
  const out: Array<[number, number]> = [];
  for (const [from, to] of sorted) {
    const last = out.at(-1);
    if (last && from <= last[1] + 1) last[1] = Math.max(last[1], to);
    else out.push([from, to]);
  }
  return out;
}

const cidrInterval = (cidr: string): Interval => {
  const [address, length] = cidr.split('/');
  const from = toWord(address!);
  return [from, (from + 2 ** (32 - Number(length)) - 1) >>> 0];
};

type NftElement =
  | string
  | { prefix: { addr: string; len: number } }
  | { range: [string, string] }
  | { elem: { val: string; timeout?: number; expires?: number } };

describe.skipIf(kernelSkip !== undefined)('kernel rules: accepted by the kernel', () => {
  const namespace = `moat-kr-${process.pid}`;

  const nft = (line: string) => {
    const ran = spawnSync(NSENTER, [`--net=/run/netns/${namespace}`, NFT, '-f', '-'], {
      input: `${line}\n`,
      encoding: 'utf8',
    });
    expect(ran.status, `${line}\n${ran.stderr}`).toBe(0);
  };
  /** What a listing command prints in the namespace. */
  const nftList = (command: string): string =>
    execFileSync(NSENTER, [`--net=/run/netns/${namespace}`, NFT, ...command.split(' ')], {
      encoding: 'utf8',
    });
  /** The rules of one chain of Moat's table, as nft lists them, that begin with `starts`. */
  const chainRules = (chain: string, starts: readonly string[]): string[] =>
    execFileSync(
      NSENTER,
      [`--net=/run/netns/${namespace}`, NFT, 'list', 'chain', 'inet', 'moat', chain],
      { encoding: 'utf8' },
    )
      .split('\n')
      .map((line) => line.trim())
      .filter((line) => starts.some((start) => line.startsWith(start)));
  /** The rules of the two generation chains. */
  const generationRules = (): string[] =>
    ['this_policy', 'learned_open'].flatMap((chain) => chainRules(chain, ['ct mark']));
  const elementsOf = (set: string, table = 'inet moat'): NftElement[] => {
    const listed = execFileSync(
      NSENTER,
      [`--net=/run/netns/${namespace}`, NFT, '-j', 'list', 'set', ...table.split(' '), set],
      { encoding: 'utf8' },
    );
    const items = (JSON.parse(listed) as { nftables: Array<{ set?: { elem?: NftElement[] } }> })
      .nftables;
    return items.find((item) => item.set)!.set!.elem ?? [];
  };
  /** An interval set's contents, as merged intervals. */
  const intervalsOf = (set: string): Interval[] =>
    merged(
      elementsOf(set).map((element): Interval => {
        if (typeof element === 'string') return [toWord(element), toWord(element)];
        if ('prefix' in element)
          return cidrInterval(`${element.prefix.addr}/${element.prefix.len}`);
        if ('range' in element) return [toWord(element.range[0]), toWord(element.range[1])];
        throw new Error(`unexpected element ${JSON.stringify(element)}`);
      }),
    );
  /** The learned set: address -> timeout in seconds (undefined: none). */
  const timeoutsOf = (): Record<string, number | undefined> =>
    Object.fromEntries(
      elementsOf('learned4').map((element) =>
        typeof element === 'string'
          ? [element, undefined]
          : 'elem' in element
            ? [element.elem.val, element.elem.timeout]
            : [JSON.stringify(element), undefined],
      ),
    );
  /** An enforcer writing to this test's namespace; `apply` may refuse some writes. */
  const enforcerOf = (
    table: EnforcementTable,
    apply: (commands: string) => Promise<void> = async (commands) => nft(commands),
  ) =>
    new KernelEnforcer(LAYOUT, {
      table,
      apply: (_, commands) => apply(commands),
      list: async (_, command) => nftList(command),
      limitBandwidth: async () => {},
      applyHost: async () => {},
      now: () => NOW,
    });
  const expectIntervals = (set: string, cidrs: string[]) =>
    expect(intervalsOf(set), set).toEqual(merged(cidrs.map(cidrInterval)));

  beforeAll(() => {
    execFileSync(IP_TOOL, ['netns', 'add', namespace], { stdio: 'pipe' });
  });
  afterAll(() => {
    execFileSync(IP_TOOL, ['netns', 'delete', namespace], { stdio: 'pipe' });
  });

  it('takes the sandbox table, also over an earlier one, with every destination denied', () => {
    const line = sandboxRuleset(LAYOUT, LINK);
    nft(line);
    nft(line);
    expectIntervals('internal4', ['169.254.0.0/16', '100.64.0.0/10']);
    expectIntervals('deny4', ['0.0.0.0/0']);
    expectIntervals('allow4', []);
    expect(timeoutsOf()).toEqual({});
  });

  it('takes the budget chains, and reads their counters back', async () => {
    nft(sandboxRuleset(LAYOUT, LINK));
    const enforcer = enforcerOf(new EnforcementTable({ now: () => NOW }));
    expect(await enforcer.refusals('ikernelsandbox000003')).toEqual({
      new_connections: 0,
      tracked_connections: 0,
    });
  });

  it('takes policy sets and holds what they name', () => {
    nft(sandboxRuleset(LAYOUT, LINK));
    nft(
      policySets(
        policyOf({
          allowOut: ['1.2.3.4', '10.1.2.3/8', '10.9.0.0/16', 'example.com', '2001:db8::/32'],
          denyOut: ['0.0.0.0/0'],
        }),
        [learned('203.0.113.1', 300_000), learned('203.0.113.3', 1_500), learned('1.1.1.6', -1)],
        NOW,
        GENERATION,
      ),
    );
    expectIntervals('allow4', ['1.2.3.4/32', '10.0.0.0/8']);
    expectIntervals('deny4', ['0.0.0.0/0']);
    expect(timeoutsOf()).toEqual({ '203.0.113.1': 300, '203.0.113.3': 2 });

    // The next publish replaces all three sets.
    nft(
      policySets(
        policyOf({ denyOut: ['9.9.9.9', '203.0.113.0/24', '::/0'] }),
        [learned('203.0.113.2', 60_000)],
        NOW,
        GENERATION,
      ),
    );
    expectIntervals('allow4', []);
    expectIntervals('deny4', ['9.9.9.9/32', '203.0.113.0/24']);
    expect(timeoutsOf()).toEqual({ '203.0.113.2': 60 });
    expect(generationRules()).toEqual([
      'ct mark 0x0000002a accept',
      'ct mark set 0x0000002a accept',
    ]);
    // A publish with a new generation replaces the old one in both chains.
    nft(policySets(policyOf({}), [], NOW, 0xfedcba98));
    expect(generationRules()).toEqual([
      'ct mark 0xfedcba98 accept',
      'ct mark set 0xfedcba98 accept',
    ]);
  });

  it('moves a learned address out to its new timeout, and drops one that has expired', () => {
    nft(sandboxRuleset(LAYOUT, LINK));
    nft(learnedElements([learned('203.0.113.1', 5_000), learned('203.0.113.2', 5_000)], NOW));
    expect(timeoutsOf()).toEqual({ '203.0.113.1': 5, '203.0.113.2': 5 });
    nft(learnedElements([learned('203.0.113.1', 120_000), learned('203.0.113.2', 0)], NOW));
    expect(timeoutsOf()).toEqual({ '203.0.113.1': 120 });
  });

  it('fills the tunnel chains for a sandbox with an upstream proxy, and empties them again', () => {
    const rulesOf = (chain: string) => chainRules(chain, ['tcp', 'meta', 'ip', 'fib']);
    nft(sandboxRuleset(LAYOUT, LINK));
    nft(tunnelRules(LAYOUT, true, 41_234));
    // Twice: a publish that keeps the proxy writes the same rules, not a second copy.
    nft(tunnelRules(LAYOUT, true, 41_234));
    expect(rulesOf('tunnel_redirect')).toEqual([
      'tcp dport { 80, 443 } dnat ip to 10.216.0.1:3129',
      // Only the namespace's own TCP: a forwarded packet cannot reach Moat's loopback listener.
      'fib saddr type local ip daddr != 10.216.0.0/24 meta l4proto tcp redirect to :41234',
    ]);
    expect(rulesOf('tunnel_direct')).toEqual(['meta l4proto tcp reject with tcp reset']);
    nft(tunnelRules(LAYOUT, false));
    expect(rulesOf('tunnel_redirect')).toEqual([]);
    expect(rulesOf('tunnel_direct')).toEqual([]);
  });

  it('redirects only web ports when Moat has no listener inside; other TCP is refused', () => {
    const rulesOf = (chain: string) => chainRules(chain, ['tcp', 'meta', 'ip']);
    nft(sandboxRuleset(LAYOUT, LINK));
    nft(tunnelRules(LAYOUT, true));
    expect(rulesOf('tunnel_redirect')).toEqual([
      'tcp dport { 80, 443 } dnat ip to 10.216.0.1:3129',
    ]);
    expect(rulesOf('tunnel_direct')).toEqual(['meta l4proto tcp reject with tcp reset']);
  });

  it('takes the lockdown after any policy', () => {
    nft(sandboxRuleset(LAYOUT, LINK));
    nft(
      policySets(
        policyOf({ allowOut: ['8.8.8.8'] }),
        [learned('203.0.113.1', 60_000)],
        NOW,
        GENERATION,
      ),
    );
    nft(lockdownSets(GENERATION));
    expectIntervals('allow4', []);
    expectIntervals('deny4', ['0.0.0.0/0']);
    expect(timeoutsOf()).toEqual({});
  });

  it('keeps an address learned for a denied name denied across a publish, in decide and in the firewall', async () => {
    nft(sandboxRuleset(LAYOUT, LINK));
    const table = new EnforcementTable({ now: () => NOW });
    const rules = policyOf({
      denyOut: ['smtp.test:25'],
      rules: { 'api.test': [{ match: { methods: ['GET'] }, action: 'allow' }, { action: 'deny' }] },
    });
    const sandboxID = 'ikernelsandbox000002';
    table.register(sandboxID, { egressSecret: 's' }, rules);
    const { learned } = table.get(sandboxID)!;
    learned.learn(ip('203.0.113.8'), unwrap(canonicalName('smtp.test')), 60, true);
    learned.learn(ip('203.0.113.9'), unwrap(canonicalName('api.test')), 60, true);
    const enforcer = enforcerOf(table);
    // A PUT of the same policy: published, then written.
    expect(table.publish(sandboxID, rules)).toBe(true);
    await enforcer.enforce(sandboxID, rules);
    const bare = (address: string, port: number) =>
      decide(rules, { ip: ip(address), port }, table.get(sandboxID)!.learned);
    expect(bare('203.0.113.8', 25).verdict).toBe('deny');
    expect(bare('203.0.113.8', 26).verdict).toBe('allow');
    expect(bare('203.0.113.9', 22).list).toBe('rules');
    const values = (set: string) =>
      elementsOf(set).map((element) =>
        typeof element === 'object' && 'elem' in element ? element.elem.val : element,
      );
    expect(JSON.stringify(values('learned_deny4p'))).toContain('203.0.113.8');
    expect(values('learned_deny4')).toEqual(['203.0.113.9']);
  });

  it('puts learned addresses back after a refused policy change locked the sandbox down', async () => {
    nft(sandboxRuleset(LAYOUT, LINK));
    const table = new EnforcementTable({ now: () => NOW });
    const rules = policyOf({ allowOut: ['example.com', '1.2.3.4'], denyOut: ['0.0.0.0/0'] });
    table.register('ikernelsandbox000001', { egressSecret: 's' }, rules);
    table
      .get('ikernelsandbox000001')!
      .learned.learn(ip('203.0.113.7'), unwrap(canonicalName('example.com')), 60);
    // nft refuses the policy transaction (as when the table was tampered with); later ones run.
    let refuse = true;
    const enforcer = enforcerOf(table, async (commands) => {
      if (refuse) {
        refuse = false;
        throw new Error('nft: Could not process rule');
      }
      nft(commands);
    });
    await expect(enforcer.enforce('ikernelsandbox000001', rules)).rejects.toThrow(
      /denies every direct destination/,
    );
    expectIntervals('allow4', []);
    expectIntervals('deny4', ['0.0.0.0/0']);
    // 60 s learned, and the firewall's margin of 5 s (src/enforce/learned.ts).
    expect(timeoutsOf()).toEqual({ '203.0.113.7': 65 });
  });

  it('writes a new generation with every policy, so open connections are decided again', async () => {
    nft(sandboxRuleset(LAYOUT, LINK));
    const table = new EnforcementTable({ now: () => NOW });
    const rules = policyOf({ allowOut: ['example.com'], denyOut: ['0.0.0.0/0'] });
    table.register('ikernelsandbox000002', { egressSecret: 's' }, rules);
    const enforcer = enforcerOf(table);
    const marks: string[] = [];
    for (let n = 0; n < 3; n++) {
      await enforcer.enforce('ikernelsandbox000002', rules);
      const [passes, sets] = generationRules();
      // Both chains carry the same mark: what learned_open sets is what this_policy passes.
      expect(sets).toBe(passes!.replace('ct mark ', 'ct mark set '));
      marks.push(passes!);
    }
    expect(new Set(marks).size).toBe(3);
    expect(marks).not.toContain('ct mark 0x00000000 accept');
  });

  it('takes a layout whose listeners share a port', () => {
    const shared = { ...LAYOUT, ports: { dns: 3053, proxy: 3128, transparent: 3128 } };
    nft(sandboxRuleset(shared, LINK));
    nft(hostRuleset(shared));
    nft(removeHostRuleset(shared.hostTable));
  });

  it('takes the host table, and its removal twice', () => {
    nft(hostRuleset(LAYOUT));
    nft(hostRuleset({ ...LAYOUT, hostPorts: [8080] }));
    const tables = () =>
      execFileSync(NSENTER, [`--net=/run/netns/${namespace}`, NFT, 'list', 'tables'], {
        encoding: 'utf8',
      });
    expect(tables()).toContain('table inet moat_abc123');
    nft(removeHostRuleset(LAYOUT.hostTable));
    nft(removeHostRuleset(LAYOUT.hostTable));
    expect(tables()).not.toContain('moat_abc123');
  });

  it('holds exactly the IPv4 address rules of generated policies', () => {
    nft(sandboxRuleset(LAYOUT, LINK));
    fc.assert(
      fc.property(policyInput, (input) => {
        nft(policySets(policyOf(input.rules), [], NOW, GENERATION));
        const expected = referenceSets(input);
        expectIntervals('allow4', expected.allow4);
        expectIntervals('deny4', expected.deny4);
      }),
      { numRuns: 40 },
    );
  });
});
