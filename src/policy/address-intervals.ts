/**
 * The compiled form of every address prefix a policy holds (internal list, allowOut, denyOut,
 * and their port-scoped rules), as one sorted table of elementary intervals per address family.
 * Each interval carries, per list, the value of the longest prefix of that list covering it. An
 * address is decided by one binary search over a typed array instead of one search per list:
 * prefixes are nested or disjoint, so each list's longest match is constant between two
 * consecutive prefix boundaries.
 */
import type { CIDR, IPAddress } from './address.js';

/** The lists of a table, each with the type of its values. */
export type ListValues = Record<string, unknown>;

/** A prefix of one list with its value. */
export type PrefixEntry<V extends ListValues> = {
  readonly [L in keyof V]: { readonly cidr: CIDR; readonly list: L; readonly value: V[L] };
}[keyof V];

/** One family's table: `starts[i]` (as `words` uint32 words) begins interval i. */
export interface FamilyTable<V extends ListValues> {
  readonly words: 1 | 4;
  readonly starts: Uint32Array;
  readonly count: number;
  /**
   * `buckets[b]` is the interval holding the first address whose top bits (of its first word)
   * are b, so a search covers only the intervals of one bucket. Sized to the table (no index
   * for a small one), so memory stays proportional to the rules.
   */
  readonly buckets: Uint32Array | undefined;
  readonly bucketShift: number;
  /** Per list, the value of its longest prefix covering interval i. */
  readonly lists: { readonly [L in keyof V]: ReadonlyArray<V[L] | undefined> };
  /**
   * Per interval, bit l set when list l (in the order the table was built with) holds a value
   * there: one byte per interval, small enough to stay in cache, so a search reads only the
   * lists that hold something.
   */
  readonly present: Uint8Array;
}

/**
 * Arithmetic on prefix positions: plain numbers for IPv4 (exact below 2^53, and fast), BigInt
 * for IPv6. Used at compile time only.
 */
interface Positions<K> {
  readonly bits: number;
  start(words: readonly number[]): K;
  /** The first position after a prefix of `length` bits starting at `start`. */
  after(start: K, length: number): K;
  readonly end: K;
  less(a: K, b: K): boolean;
  compare(a: K, b: K): number;
}

const V4: Positions<number> = {
  bits: 32,
  start: (w) => w[0]! >>> 0,
  after: (start, length) => start + 2 ** (32 - length),
  end: 2 ** 32,
  less: (a, b) => a < b,
  compare: (a, b) => a - b,
};

const V6: Positions<bigint> = {
  bits: 128,
  start: (w) => w.reduce((acc, x) => (acc << 32n) | BigInt(x >>> 0), 0n),
  after: (start, length) => start + (1n << BigInt(128 - length)),
  end: 1n << 128n,
  less: (a, b) => a < b,
  compare: (a, b) => (a < b ? -1 : a > b ? 1 : 0),
};

/** Ascending positions where one list's longest match changes, and the match from there on. */
interface Boundaries<T, K> {
  readonly positions: K[];
  readonly values: Array<T | undefined>;
}

/**
 * Boundaries where one list's longest match changes, ascending. Prefixes are nested or
 * disjoint: sorted by start, outer (shorter) first, a stack of open prefixes gives the
 * innermost at each point.
 */
function boundaries<T, K>(
  entries: ReadonlyArray<{ readonly cidr: CIDR; readonly value: T }>,
  at: Positions<K>,
): Boundaries<T, K> {
  const spans = entries.map((e) => {
    const start = at.start(e.cidr.words);
    return {
      start,
      after: at.after(start, e.cidr.prefixLength),
      length: e.cidr.prefixLength,
      value: e.value,
    };
  });
  spans.sort((a, b) => at.compare(a.start, b.start) || a.length - b.length);
  const positions: K[] = [];
  const values: Array<T | undefined> = [];
  const emit = (position: K, value: T | undefined) => {
    const last = positions.length - 1;
    if (last >= 0 && positions[last] === position) values[last] = value;
    else {
      positions.push(position);
      values.push(value);
    }
  };
  const open: typeof spans = [];
  const closeUpTo = (position: K) => {
    while (open.length > 0 && !at.less(position, open.at(-1)!.after)) {
      const done = open.pop()!;
      emit(done.after, open.at(-1)?.value);
    }
  };
  for (const span of spans) {
    // The same prefix twice: the first entry wins.
    const top = open.at(-1);
    if (top !== undefined && top.start === span.start && top.length === span.length) continue;
    closeUpTo(span.start);
    emit(span.start, span.value);
    open.push(span);
  }
  closeUpTo(at.end);
  return { positions, values };
}

function buildFamily<V extends ListValues, K>(
  names: ReadonlyArray<keyof V>,
  entries: ReadonlyArray<PrefixEntry<V>>,
  at: Positions<K>,
  zero: K,
): FamilyTable<V> {
  const words = at.bits === 32 ? 1 : 4;
  const perList = names.map((name) =>
    boundaries(
      entries.filter((e) => e.list === name),
      at,
    ),
  );
  const cursor = names.map(() => 0);
  const current: unknown[] = names.map(() => undefined);
  const starts: K[] = [];
  const columns: unknown[][] = names.map(() => []);
  // Merge the lists' ascending boundaries: every position where any list's match changes.
  let position: K | undefined = zero;
  while (position !== undefined && at.less(position, at.end)) {
    let next: K | undefined;
    for (let l = 0; l < names.length; l++) {
      const { positions, values } = perList[l]!;
      while (cursor[l]! < positions.length && positions[cursor[l]!] === position)
        current[l] = values[cursor[l]!++];
      if (
        cursor[l]! < positions.length &&
        (next === undefined || at.less(positions[cursor[l]!]!, next))
      ) {
        next = positions[cursor[l]!];
      }
    }
    const last = starts.length - 1;
    if (last < 0 || columns.some((column, l) => column[last] !== current[l])) {
      starts.push(position);
      columns.forEach((column, l) => column.push(current[l]));
    }
    position = next;
  }
  const packed = new Uint32Array(starts.length * words);
  starts.forEach((start, i) => {
    if (words === 1) packed[i] = start as number;
    else
      for (let w = 0; w < 4; w++)
        packed[i * 4 + w] = Number(((start as bigint) >> BigInt(32 * (3 - w))) & 0xffffffffn);
  });
  // `buckets[b]` is the interval holding the first address whose top bits are b.
  const bucketBits = Math.min(16, Math.max(0, Math.floor(Math.log2(starts.length))));
  let buckets: Uint32Array | undefined;
  if (bucketBits > 0) {
    buckets = new Uint32Array(2 ** bucketBits);
    const atMost = (i: number, first: number) => {
      const top = packed[i * words]!;
      if (top !== first) return top < first;
      for (let w = 1; w < words; w++) if (packed[i * words + w] !== 0) return false;
      return true;
    };
    let interval = 0;
    for (let b = 0; b < buckets.length; b++) {
      const first = b * 2 ** (32 - bucketBits);
      while (interval + 1 < starts.length && atMost(interval + 1, first)) interval++;
      buckets[b] = interval;
    }
  }
  return {
    words,
    starts: packed,
    count: starts.length,
    buckets,
    bucketShift: 32 - bucketBits,
    present: Uint8Array.from(starts, (_, i) =>
      columns.reduce((bits, column, l) => (column[i] === undefined ? bits : bits | (1 << l)), 0),
    ),
    lists: Object.fromEntries(
      names.map((name, l) => [name, columns[l]]),
    ) as unknown as FamilyTable<V>['lists'],
  };
}

/** Index of the interval holding `address` (the last start <= address). */
export function locate(table: FamilyTable<ListValues>, address: readonly number[]): number {
  const { starts, words, buckets } = table;
  let lo = 0;
  let hi = table.count - 1;
  const top = address[0]! >>> 0;
  if (buckets !== undefined) {
    const b = top >>> table.bucketShift;
    lo = buckets[b]!;
    if (b + 1 < buckets.length) hi = buckets[b + 1]!;
  }
  if (words === 1) {
    while (lo < hi) {
      const mid = (lo + hi + 1) >>> 1;
      if (starts[mid]! <= top) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }
  while (lo < hi) {
    const mid = (lo + hi + 1) >>> 1;
    let cmp = 0;
    for (let w = 0; w < 4 && cmp === 0; w++) {
      const s = starts[mid * 4 + w]!;
      const a = address[w]! >>> 0;
      cmp = s < a ? -1 : s > a ? 1 : 0;
    }
    if (cmp <= 0) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

export class AddressIntervals<V extends ListValues> {
  private readonly v4: FamilyTable<V>;
  private readonly v6: FamilyTable<V>;

  /**
   * `names`: every list the table holds, at most 8 (a list without entries is still asked);
   * list l is bit `1 << l` of `present`.
   */
  constructor(names: ReadonlyArray<keyof V>, entries: ReadonlyArray<PrefixEntry<V>>) {
    if (names.length > 8) throw new Error('an address table holds at most 8 lists');
    this.v4 = buildFamily(
      names,
      entries.filter((e) => e.cidr.version === 4),
      V4,
      0,
    );
    this.v6 = buildFamily(
      names,
      entries.filter((e) => e.cidr.version === 6),
      V6,
      0n,
    );
  }

  /** Intervals in both tables (for diagnostics and benchmarks). */
  get size(): number {
    return this.v4.count + this.v6.count;
  }

  /** The table an address is searched in; `locate` finds its interval there. */
  family(ip: IPAddress): FamilyTable<V> {
    return ip.version === 4 ? this.v4 : this.v6;
  }

  /** The IPv4 table, read whole (the kernel's sets are written from it). */
  get ipv4(): FamilyTable<V> {
    return this.v4;
  }
}
