/**
 * Property test: `decide` on the compiled tries agrees with the naive reference matcher of
 * reference.ts (ipaddr.js prefixes, string-suffix names, linear scans in design.md's order) on
 * generated policies, internal lists, destinations and learned-address tables.
 */
import fc from 'fast-check';
import ipaddr from 'ipaddr.js';
import { describe, expect, test } from 'vitest';
import {
  compileInternalDenyList,
  compilePolicy,
  type Destination,
  decide,
  type InternalDenyList,
  parseAuthority,
  parseInternalDenyList,
  parseNetworkConfig,
} from '../../src/policy/index.js';
import { learnedOf, outcome } from './helpers.js';
import {
  REF_DEFAULT_INTERNAL,
  type RefConfig,
  type RefDestination,
  type RefRule,
  refCanon,
  refDecide,
  refIsValid,
  refIsZeroNetwork,
  refKey,
  refRange,
  toBigInt,
} from './reference.js';

const NUM_RUNS = 12_000;

const ALL_TRAFFIC_TEXT =
  "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.";

// Small pools of base addresses, so that rules overlap and destinations fall inside them. Some
// sit inside the default internal list on purpose. IPv6 is always written as 8 hex groups
// (ipaddr.js misreads `::a.b.c.d`).
const V4_BASES = [
  '8.8.8.8',
  '8.8.4.4',
  '93.184.216.34',
  '1.1.1.1',
  '151.101.1.69',
  '44.1.2.3',
  '10.20.30.40',
  '127.0.0.1',
  '169.254.169.254',
  '192.168.1.1',
  '100.64.1.2',
  '203.0.113.7',
];
const V6_BASES = [
  '2606:4700:4700:0:0:0:0:1111',
  '2606:4700:4700:0:0:0:0:1001',
  '2001:4860:4860:0:0:0:0:8888',
  '2a00:1450:4001:80e:0:0:0:200e',
  '2620:fe:0:0:0:0:0:fe',
  'fd00:ec2:0:0:0:0:0:254',
  'fe80:0:0:0:0:0:0:1',
  '2001:db8:0:0:0:0:0:1',
  '64:ff9b:0:0:0:0:808:808',
  '2002:c000:204:0:0:0:0:1',
  '0:0:0:0:0:0:0:1',
  '0:0:0:0:0:0:7f00:1',
];
/** IPv4-mapped bases (8.8.8.8, 169.254.169.254, 93.184.216.34, 127.0.0.1). */
const MAPPED_BASES = [
  '0:0:0:0:0:ffff:808:808',
  '0:0:0:0:0:ffff:a9fe:a9fe',
  '0:0:0:0:0:ffff:5db8:d822',
  '0:0:0:0:0:ffff:7f00:1',
];

const big = (text: string) => toBigInt(ipaddr.parse(text));

const formatV4 = (v: bigint) =>
  [24n, 16n, 8n, 0n].map((shift) => String((v >> shift) & 255n)).join('.');
const formatV6 = (v: bigint, upper: boolean) => {
  const text = [112n, 96n, 80n, 64n, 48n, 32n, 16n, 0n]
    .map((shift) => ((v >> shift) & 0xffffn).toString(16))
    .join(':');
  return upper ? text.toUpperCase() : text;
};

/** A base address with some of its low bits flipped (few, usually). */
function addressNear(bases: readonly string[], bits: 32 | 128, maxFlipped: number = bits) {
  return fc
    .tuple(
      fc.constantFrom(...bases),
      fc.oneof(
        fc.integer({ min: 0, max: Math.min(8, maxFlipped) }),
        fc.integer({ min: 0, max: maxFlipped }),
      ),
      fc.bigInt({ min: 0n, max: (1n << BigInt(bits)) - 1n }),
    )
    .map(([base, flipped, noise]) => big(base) ^ (noise & ((1n << BigInt(flipped)) - 1n)));
}

const v4Text = addressNear(V4_BASES, 32).map(formatV4);
const v6Text = fc
  .tuple(addressNear(V6_BASES, 128), fc.boolean())
  .map(([v, upper]) => formatV6(v, upper));
const mappedText = fc
  .tuple(addressNear(MAPPED_BASES, 128, 32), fc.boolean())
  .map(([v, upper]) => formatV6(v, upper));

/** CIDR entries of every prefix length, bare addresses included. */
const cidrText = fc.oneof(
  fc
    .tuple(addressNear(V4_BASES, 32), fc.integer({ min: 0, max: 32 }), fc.boolean())
    .map(([v, len, bare]) => (len === 32 && bare ? formatV4(v) : `${formatV4(v)}/${len}`)),
  fc
    .tuple(addressNear(V6_BASES, 128), fc.integer({ min: 0, max: 128 }), fc.boolean(), fc.boolean())
    .map(([v, len, bare, upper]) =>
      len === 128 && bare ? formatV6(v, upper) : `${formatV6(v, upper)}/${len}`,
    ),
  // IPv4-mapped prefixes of /104 and longer are IPv4 prefixes.
  fc
    .tuple(addressNear(MAPPED_BASES, 128, 24), fc.integer({ min: 104, max: 128 }))
    .map(([v, len]) => `${formatV6(v, false)}/${len}`),
);

const LABELS = ['a', 'b', 'c', 'api', 'x-y', 'w1', '1a'];
const canonicalNameText = fc
  .tuple(
    fc.array(fc.constantFrom(...LABELS), { maxLength: 3 }),
    fc.constantFrom('com', 'net', 'io'),
  )
  .map(([labels, tld]) => [...labels, tld].join('.'));

/** A name as someone might write it: any case, maybe one trailing dot. */
const spelledName = fc
  .tuple(canonicalNameText, fc.constantFrom('lower', 'upper', 'mixed'), fc.boolean())
  .map(([name, style, dot]) => {
    const cased =
      style === 'lower'
        ? name
        : style === 'upper'
          ? name.toUpperCase()
          : [...name].map((c, i) => (i % 2 ? c.toUpperCase() : c)).join('');
    return dot ? `${cased}.` : cased;
  });

const allowRule: fc.Arbitrary<RefRule> = fc.oneof(
  { weight: 3, arbitrary: cidrText.map((text) => ({ kind: 'cidr' as const, text })) },
  { weight: 2, arbitrary: spelledName.map((text) => ({ kind: 'name' as const, text })) },
  {
    weight: 2,
    arbitrary: spelledName.map((text) => ({ kind: 'wildcard' as const, text: `*.${text}` })),
  },
);

/** Inserts `entry` at a position given as a fraction of the list. */
const insertAt = <T>(list: readonly T[], entry: T, at: number): T[] => {
  const index = Math.floor(at * (list.length + 1));
  return [...list.slice(0, index), entry, ...list.slice(index)];
};

const configArb: fc.Arbitrary<RefConfig> = fc
  .record({
    allowOut: fc.array(allowRule, { maxLength: 12 }),
    denyOut: fc.array(cidrText, { maxLength: 10 }),
    allTraffic: fc.oneof(
      { weight: 3, arbitrary: fc.constant(true) },
      { weight: 2, arbitrary: fc.constant(false) },
    ),
    allTrafficAt: fc.double({ min: 0, max: 0.999, noNaN: true }),
    allIPv6: fc.boolean(),
    allIPv6At: fc.double({ min: 0, max: 0.999, noNaN: true }),
    allowInternetAccess: fc.constantFrom(undefined, true, false),
  })
  .map((r) => {
    // Keep the entries design.md accepts: allowOut never holds the unspecified network, denyOut
    // only as 0.0.0.0/0 or ::/0 (added explicitly below).
    const allowOut = r.allowOut.filter(
      (rule) => rule.kind !== 'cidr' || !refIsZeroNetwork(refRange(rule.text)),
    );
    let denyOut = r.denyOut.filter((text) => !refIsZeroNetwork(refRange(text)));
    if (r.allTraffic) denyOut = insertAt(denyOut, '0.0.0.0/0', r.allTrafficAt);
    if (r.allIPv6) denyOut = insertAt(denyOut, '::/0', r.allIPv6At);
    return { allowOut, denyOut, allowInternetAccess: r.allowInternetAccess };
  });

type InternalChoice =
  { kind: 'implicit default' } | { kind: 'list'; text: string; reference: readonly string[] };

const internalArb: fc.Arbitrary<InternalChoice> = fc.oneof(
  { weight: 2, arbitrary: fc.constant({ kind: 'implicit default' as const }) },
  {
    weight: 1,
    arbitrary: fc.constant({
      kind: 'list' as const,
      text: 'default',
      reference: REF_DEFAULT_INTERNAL,
    }),
  },
  { weight: 1, arbitrary: fc.constant({ kind: 'list' as const, text: 'none', reference: [] }) },
  {
    weight: 3,
    arbitrary: fc
      .tuple(fc.array(cidrText, { minLength: 1, maxLength: 5 }), fc.constantFrom(',', ', ', ' , '))
      .map(([entries, separator]) => ({
        kind: 'list' as const,
        text: entries.join(separator),
        reference: entries,
      })),
  },
);

interface GeneratedDestination {
  readonly reference: RefDestination;
  readonly learned: ReadonlyArray<readonly [string, string]> | undefined;
  /** When set, the host (and a learned name) is built from one of the policy's name rules. */
  readonly fromRule:
    | { readonly index: number; readonly extra: readonly string[]; readonly learned: boolean }
    | undefined;
}

const ipText = fc.oneof(
  { weight: 3, arbitrary: v4Text },
  {
    weight: 2,
    arbitrary: fc
      .tuple(v6Text, fc.boolean())
      .map(([text, bracket]) => (bracket ? `[${text}]` : text)),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(mappedText, fc.boolean())
      .map(([text, bracket]) => (bracket ? `[${text}]` : text)),
  },
);

const destinationArb: fc.Arbitrary<GeneratedDestination> = fc
  .record({
    shape: fc.constantFrom('host', 'ip', 'ip', 'both', 'both'),
    neither: fc.integer({ min: 0, max: 50 }),
    host: spelledName,
    ip: ipText,
    port: fc.option(
      fc.oneof(
        { weight: 8, arbitrary: fc.integer({ min: 1, max: 65535 }) },
        { weight: 1, arbitrary: fc.constantFrom(0, -1, 65536, 1.5, Number.NaN) },
      ),
      { nil: undefined },
    ),
    learned: fc.constantFrom('none', 'this address', 'this address', 'other addresses'),
    learnedName: canonicalNameText,
    others: fc.array(fc.tuple(ipText, canonicalNameText), { maxLength: 3 }),
    fromRule: fc.option(
      fc.record({
        index: fc.nat(),
        extra: fc.array(fc.constantFrom(...LABELS), { maxLength: 2 }),
        learned: fc.boolean(),
      }),
      { nil: undefined },
    ),
  })
  .map((r) => {
    const shape = r.neither === 0 ? 'neither' : r.shape;
    const reference: RefDestination = {
      ...(shape === 'host' || shape === 'both' ? { host: r.host } : {}),
      ...(shape === 'ip' || shape === 'both' ? { ip: r.ip } : {}),
      ...(r.port === undefined ? {} : { port: r.port }),
    };
    const learned =
      r.learned === 'none'
        ? undefined
        : r.learned === 'this address'
          ? [...r.others, [r.ip, r.learnedName] as const]
          : r.others;
    return { reference, learned, fromRule: r.fromRule };
  });

/**
 * Points a generated destination at one of the policy's name rules (the rule's domain with 0-2
 * labels in front, so a wildcard's apex comes up too), so that name rules match often.
 */
function aimAtRules(config: RefConfig, generated: GeneratedDestination): GeneratedDestination {
  const names = config.allowOut.filter((rule) => rule.kind !== 'cidr').map((rule) => rule.text);
  const aim = generated.fromRule;
  if (aim === undefined || names.length === 0) return generated;
  const rule = names[aim.index % names.length]!;
  const target = [...aim.extra, rule.startsWith('*.') ? rule.slice(2) : rule].join('.');
  const { reference } = generated;
  if (aim.learned) {
    if (reference.ip === undefined) return generated;
    return {
      ...generated,
      learned: [...(generated.learned ?? []), [reference.ip, refCanon(target)]],
    };
  }
  return reference.host === undefined
    ? generated
    : { ...generated, reference: { ...reference, host: target } };
}

/** The engine's destination for the same texts, through the public parser. */
function engineDestination(reference: RefDestination): Destination {
  let destination: Destination = {};
  if (reference.host !== undefined) {
    const parsed = parseAuthority(reference.host);
    if (!parsed.ok || parsed.value.host === undefined)
      throw new Error(`host ${reference.host}: ${JSON.stringify(parsed)}`);
    destination = { ...destination, host: parsed.value.host };
  }
  if (reference.ip !== undefined) {
    const parsed = parseAuthority(reference.ip);
    if (!parsed.ok || parsed.value.ip === undefined)
      throw new Error(`ip ${reference.ip}: ${JSON.stringify(parsed)}`);
    destination = { ...destination, ip: parsed.value.ip };
  }
  return reference.port === undefined ? destination : { ...destination, port: reference.port };
}

function engineInternal(choice: InternalChoice): {
  compiled: InternalDenyList | undefined;
  reference: readonly string[];
} {
  if (choice.kind === 'implicit default')
    return { compiled: undefined, reference: REF_DEFAULT_INTERNAL };
  const parsed = parseInternalDenyList(choice.text);
  if (!parsed.ok) throw new Error(`internal list ${choice.text}: ${parsed.error}`);
  return { compiled: compileInternalDenyList(parsed.value), reference: choice.reference };
}

describe('decide agrees with the naive reference matcher', () => {
  test(`${NUM_RUNS} generated policies, several destinations each`, () => {
    const seen = { runs: 0, valid: 0, decisions: 0, lists: new Map<string, number>() };
    fc.assert(
      fc.property(
        configArb,
        internalArb,
        fc.array(destinationArb, { minLength: 1, maxLength: 6 }),
        (config, internalChoice, destinations) => {
          seen.runs++;
          const body = {
            allowOut: config.allowOut.map((rule) => rule.text),
            denyOut: config.denyOut,
            ...(config.allowInternetAccess === undefined
              ? {}
              : { allow_internet_access: config.allowInternetAccess }),
          };
          const parsed = parseNetworkConfig(body);
          expect(parsed.ok).toBe(refIsValid(config));
          if (!parsed.ok) {
            expect(parsed.errors.map((e) => e.message.startsWith(ALL_TRAFFIC_TEXT))).toEqual([
              true,
            ]);
            return;
          }
          seen.valid++;
          const internal = engineInternal(internalChoice);
          const policy =
            internal.compiled === undefined
              ? compilePolicy(parsed.value)
              : compilePolicy(parsed.value, internal.compiled);
          for (const generated of destinations) {
            const { reference, learned } = aimAtRules(config, generated);
            const refLearned = learned && new Map<string, string[]>();
            for (const [ip, name] of learned ?? [])
              refLearned!.set(refKey(ip), [...(refLearned!.get(refKey(ip)) ?? []), name]);
            const expected = refDecide(config, internal.reference, reference, refLearned);
            const actual = decide(
              policy,
              engineDestination(reference),
              learned && learnedOf(learned),
            );
            expect(outcome(actual)).toEqual(expected);
            expect(actual.reason.length).toBeGreaterThan(0);
            seen.decisions++;
            const key = `${actual.verdict}/${actual.list}`;
            seen.lists.set(key, (seen.lists.get(key) ?? 0) + 1);
          }
        },
      ),
      { numRuns: NUM_RUNS },
    );
    // The generators must exercise every outcome, or the agreement above proves little.
    expect(seen.runs).toBeGreaterThanOrEqual(NUM_RUNS);
    expect(seen.valid).toBeGreaterThan(NUM_RUNS / 2);
    for (const key of [
      'allow/allowOut',
      'allow/learned',
      'allow/default',
      'deny/denyOut',
      'deny/internal',
      'deny/invalid',
    ]) {
      expect(seen.lists.get(key) ?? 0, key).toBeGreaterThan(NUM_RUNS / 200);
    }
    // About 12 s on a quiet machine, 39 s beside a CPU load of 2 and the rest of the suite.
  }, 120_000);
});
