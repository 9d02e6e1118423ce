/**
 * Unit tests of the tries and the interval table behind a compiled Policy, against naive
 * matchers written here: BigInt arithmetic for prefixes, string suffixes for names.
 */
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import { AddressIntervals, locate } from '../../src/policy/address-intervals.js';
import { DomainTrie } from '../../src/policy/domain-trie.js';
import { PrefixTrie } from '../../src/policy/prefix-trie.js';

type Bits = 32 | 128;

const mask = (bits: Bits, len: number): bigint =>
  len === 0 ? 0n : ((1n << BigInt(bits)) - 1n) ^ ((1n << BigInt(bits - len)) - 1n);

/** Big-endian 32-bit words of a `bits`-wide integer. */
const toWords = (bits: Bits, value: bigint): number[] =>
  Array.from({ length: bits / 32 }, (_, i) =>
    Number((value >> BigInt(bits - 32 * (i + 1))) & 0xffffffffn),
  );

interface Prefix {
  readonly network: bigint;
  readonly len: number;
}

const prefixOf = (bits: Bits, value: bigint, len: number): Prefix => ({
  network: value & mask(bits, len),
  len,
});

const contains = (bits: Bits, p: Prefix, address: bigint) =>
  (address & mask(bits, p.len)) === p.network;

/** Naive longest-prefix match over a list; the first inserted value wins for a repeated prefix. */
function naiveLookup(
  bits: Bits,
  prefixes: readonly Prefix[],
  address: bigint,
  maxLength: number = bits,
): number | undefined {
  let best: number | undefined;
  let bestLength = -1;
  prefixes.forEach((p, i) => {
    if (p.len <= maxLength && p.len > bestLength && contains(bits, p, address)) {
      best = i;
      bestLength = p.len;
    }
  });
  return best;
}

function build(bits: Bits, prefixes: readonly Prefix[]): PrefixTrie<number> {
  const trie = new PrefixTrie<number>(bits);
  prefixes.forEach((p, i) => {
    trie.insert(toWords(bits, p.network), p.len, i);
  });
  return trie;
}

const v4 = (text: string): bigint =>
  text.split('.').reduce((acc, octet) => (acc << 8n) | BigInt(Number(octet)), 0n);
const p4 = (text: string): Prefix => {
  const [address, len] = text.split('/');
  return prefixOf(32, v4(address!), Number(len ?? 32));
};

describe('PrefixTrie (examples)', () => {
  test('empty trie matches nothing', () => {
    const trie = new PrefixTrie<string>(32);
    expect(trie.lookup(toWords(32, v4('8.8.8.8')))).toBeUndefined();
    expect(trie.size).toBe(0);
    expect(trie.values()).toEqual([]);
  });

  test('/0 matches everything', () => {
    const trie = new PrefixTrie<string>(32);
    expect(trie.insert([0], 0, 'all')).toBe(true);
    expect(trie.lookup(toWords(32, v4('255.255.255.255')))).toBe('all');
    expect(trie.lookup([0])).toBe('all');
  });

  test('longest prefix wins in either insertion order, and splits keep every prefix', () => {
    const texts = [
      '10.0.0.0/8',
      '10.1.0.0/16',
      '10.1.2.0/24',
      '10.1.2.3/32',
      '10.128.0.0/9',
      '11.0.0.0/8',
    ];
    const cases: Array<[string, string | undefined]> = [
      ['10.1.2.3', '10.1.2.3/32'],
      ['10.1.2.4', '10.1.2.0/24'],
      ['10.1.3.4', '10.1.0.0/16'],
      ['10.2.0.0', '10.0.0.0/8'],
      ['10.128.0.1', '10.128.0.0/9'],
      ['10.127.255.255', '10.0.0.0/8'],
      ['11.255.0.0', '11.0.0.0/8'],
      ['12.0.0.0', undefined],
      ['9.255.255.255', undefined],
    ];
    for (const order of [
      texts,
      [...texts].reverse(),
      [texts[3]!, texts[0]!, texts[5]!, texts[2]!, texts[4]!, texts[1]!],
    ]) {
      const trie = new PrefixTrie<string>(32);
      for (const text of order) {
        const p = p4(text);
        expect(trie.insert(toWords(32, p.network), p.len, text)).toBe(true);
      }
      expect(trie.size).toBe(texts.length);
      for (const [address, expected] of cases)
        expect(trie.lookup(toWords(32, v4(address))), address).toBe(expected);
    }
  });

  test('the first value for a prefix wins; a repeat returns false', () => {
    const trie = new PrefixTrie<string>(32);
    expect(trie.insert(toWords(32, v4('10.0.0.0')), 8, 'first')).toBe(true);
    expect(trie.insert(toWords(32, v4('10.0.0.0')), 8, 'second')).toBe(false);
    expect(trie.size).toBe(1);
    expect(trie.lookup(toWords(32, v4('10.9.9.9')))).toBe('first');
  });

  test('a prefix that was only a branching point can still be inserted', () => {
    const trie = new PrefixTrie<string>(32);
    trie.insert(toWords(32, v4('10.0.0.0')), 16, 'a');
    trie.insert(toWords(32, v4('10.1.0.0')), 16, 'b');
    // 10.0.0.0/15 is now an inner node without a value.
    expect(trie.lookup(toWords(32, v4('10.0.0.1')))).toBe('a');
    expect(trie.insert(toWords(32, v4('10.0.0.0')), 15, 'c')).toBe(true);
    expect(trie.lookup(toWords(32, v4('10.1.0.1')))).toBe('b');
    expect(trie.size).toBe(3);
  });

  test('maxLength limits the prefixes considered', () => {
    const trie = new PrefixTrie<string>(32);
    for (const text of ['10.0.0.0/8', '10.1.0.0/16', '10.1.2.0/24']) {
      const p = p4(text);
      trie.insert(toWords(32, p.network), p.len, text);
    }
    const address = toWords(32, v4('10.1.2.3'));
    expect(trie.lookup(address, 32)).toBe('10.1.2.0/24');
    expect(trie.lookup(address, 23)).toBe('10.1.0.0/16');
    expect(trie.lookup(address, 16)).toBe('10.1.0.0/16');
    expect(trie.lookup(address, 15)).toBe('10.0.0.0/8');
    expect(trie.lookup(address, 7)).toBeUndefined();
  });

  test('IPv6 prefixes across word boundaries', () => {
    const lens = [1, 31, 32, 33, 63, 64, 65, 95, 96, 97, 127, 128];
    const base = 0x2606_4700_ffff_ffff_ffff_ffff_ffff_ffffn;
    const trie = new PrefixTrie<number>(128);
    for (const len of lens) trie.insert(toWords(128, base & mask(128, len)), len, len);
    for (const len of lens) {
      // Flip the first bit below the prefix: the deepest match is now exactly `len`.
      const address = len === 128 ? base : base ^ (1n << BigInt(127 - len));
      expect(trie.lookup(toWords(128, address)), String(len)).toBe(len);
    }
    expect(trie.lookup(toWords(128, base ^ (1n << 127n)))).toBeUndefined();
  });

  test('values() lists every stored value in address order', () => {
    const trie = new PrefixTrie<string>(32);
    for (const text of ['11.0.0.0/8', '10.1.0.0/16', '10.0.0.0/8', '0.0.0.0/0', '10.1.0.0/24']) {
      const p = p4(text);
      trie.insert(toWords(32, p.network), p.len, text);
    }
    expect(trie.values()).toEqual([
      '0.0.0.0/0',
      '10.0.0.0/8',
      '10.1.0.0/16',
      '10.1.0.0/24',
      '11.0.0.0/8',
    ]);
  });
});

describe('PrefixTrie agrees with a naive matcher (property)', () => {
  for (const bits of [32, 128] as const) {
    // A few base values, so that prefixes nest and addresses fall inside them.
    const bases =
      bits === 32
        ? [0x0a000000n, 0x0a010203n, 0x08080808n, 0xc0a80101n, 0xffffffffn, 0n]
        : [
            0x2606_4700_4700_0000_0000_0000_0000_1111n,
            0x2606_4700_0000_0000_0000_0000_0000_0000n,
            0xfe80n << 112n,
            1n,
            0n,
          ];
    const value = fc
      .tuple(
        fc.constantFrom(...bases),
        fc.integer({ min: 0, max: bits }),
        fc.bigInt({ min: 0n, max: (1n << BigInt(bits)) - 1n }),
      )
      .map(([base, low, noise]) => base ^ (noise & ((1n << BigInt(low)) - 1n)));
    const prefix = fc
      .tuple(value, fc.integer({ min: 0, max: bits }))
      .map(([v, len]) => prefixOf(bits, v, len));

    test(`${bits}-bit: lookup, size and values()`, () => {
      fc.assert(
        fc.property(
          fc.array(prefix, { maxLength: 40 }),
          fc.array(value, { minLength: 1, maxLength: 20 }),
          fc.integer({ min: 0, max: bits }),
          (prefixes, addresses, maxLength) => {
            const trie = build(bits, prefixes);
            for (const address of addresses) {
              const words = toWords(bits, address);
              expect(trie.lookup(words)).toBe(naiveLookup(bits, prefixes, address));
              expect(trie.lookup(words, maxLength)).toBe(
                naiveLookup(bits, prefixes, address, maxLength),
              );
            }
            const distinct = prefixes
              .map((p, i) => ({ ...p, i }))
              .filter(
                (p, i) =>
                  prefixes.findIndex((q) => q.network === p.network && q.len === p.len) === i,
              );
            expect(trie.size).toBe(distinct.length);
            const ordered = [...distinct].sort((a, b) =>
              a.network === b.network ? a.len - b.len : a.network < b.network ? -1 : 1,
            );
            expect(trie.values()).toEqual(ordered.map((p) => p.i));
          },
        ),
        { numRuns: 2000 },
      );
    });

    test(`${bits}-bit: the interval table (bucketed search) finds the same longest prefix`, () => {
      // Addresses at and around the edges of the table's top-bits buckets as well.
      const edge = fc
        .tuple(fc.integer({ min: 0, max: 0xffff }), fc.constantFrom(0n, 1n, -1n))
        .map(([top, step]) => {
          const start = BigInt(top) << BigInt(bits - 16);
          const max = (1n << BigInt(bits)) - 1n;
          const at = start + step;
          return at < 0n ? 0n : at > max ? max : at;
        });
      fc.assert(
        fc.property(
          fc.array(prefix, { maxLength: 60 }),
          fc.array(fc.oneof(value, edge), { minLength: 1, maxLength: 20 }),
          (prefixes, addresses) => {
            const version = bits === 32 ? 4 : 6;
            const table = new AddressIntervals<{ allow: number }>(
              ['allow'],
              prefixes.map((p, i) => ({
                cidr: {
                  version,
                  words: toWords(bits, p.network),
                  prefixLength: p.len,
                  hadHostBits: false,
                  text: '',
                },
                list: 'allow',
                value: i,
              })),
            );
            for (const address of addresses) {
              const words = toWords(bits, address);
              const family = table.family({ version, words, text: '' });
              expect(family.lists.allow[locate(family, words)], address.toString(16)).toBe(
                naiveLookup(bits, prefixes, address),
              );
            }
          },
        ),
        { numRuns: 1000 },
      );
    });
  }
});

/** Naive name matching: an exact rule beats a wildcard; the deepest wildcard wins. */
function naiveName(
  rules: ReadonlyArray<readonly [string, 'exact' | 'wildcard']>,
  name: string,
): number | undefined {
  const exact = rules.findIndex(([n, kind]) => kind === 'exact' && n === name);
  if (exact >= 0) return exact;
  let best: number | undefined;
  let bestLength = -1;
  rules.forEach(([n, kind], i) => {
    if (kind === 'wildcard' && name.endsWith(`.${n}`) && n.length > bestLength) {
      best = i;
      bestLength = n.length;
    }
  });
  return best;
}

describe('DomainTrie', () => {
  test('examples', () => {
    const trie = new DomainTrie<string>();
    expect(trie.lookup('example.com')).toBeUndefined();
    expect(trie.insert('example.com', 'wildcard', '*.example.com')).toBe(true);
    expect(trie.insert('example.com', 'wildcard', 'again')).toBe(false);
    expect(trie.insert('api.example.com', 'exact', 'api.example.com')).toBe(true);
    expect(trie.insert('com', 'wildcard', '*.com')).toBe(true);
    expect(trie.size).toBe(3);
    expect(trie.lookup('example.com')).toBe('*.com');
    expect(trie.lookup('www.example.com')).toBe('*.example.com');
    expect(trie.lookup('a.b.example.com')).toBe('*.example.com');
    expect(trie.lookup('api.example.com')).toBe('api.example.com');
    expect(trie.lookup('v1.api.example.com')).toBe('*.example.com');
    expect(trie.lookup('notexample.com')).toBe('*.com');
    expect(trie.lookup('com')).toBeUndefined();
    expect(trie.lookup('example.com.evil')).toBeUndefined();
    expect(trie.lookup('')).toBeUndefined();
  });

  test('agrees with a naive matcher (property)', () => {
    const label = fc.constantFrom('a', 'b', 'ab', 'x-y', '1');
    const name = fc
      .tuple(fc.array(label, { maxLength: 4 }), fc.constantFrom('com', 'net'))
      .map(([labels, tld]) => [...labels, tld].join('.'));
    fc.assert(
      fc.property(
        fc.array(fc.tuple(name, fc.constantFrom('exact' as const, 'wildcard' as const)), {
          maxLength: 20,
        }),
        fc.array(name, { minLength: 1, maxLength: 20 }),
        (rules, names) => {
          const trie = new DomainTrie<number>();
          rules.forEach(([n, kind], i) => {
            trie.insert(n, kind, i);
          });
          for (const n of names) expect(trie.lookup(n), n).toBe(naiveName(rules, n));
        },
      ),
      { numRuns: 2000 },
    );
  });
});
