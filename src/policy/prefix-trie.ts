/**
 * A path-compressed binary trie over IP prefixes (one per address family), answering
 * longest-prefix match. Keys are big-endian 32-bit words, so IPv4 and IPv6 share the code.
 * Path compression keeps the node count at most 2n for n prefixes, whatever their lengths.
 */
import { maskWords } from './address.js';

interface TrieNode<T> {
  readonly prefixLength: number;
  readonly key: readonly number[];
  value: T | undefined;
  zero: TrieNode<T> | null;
  one: TrieNode<T> | null;
}

const bitAt = (words: readonly number[], i: number): number =>
  (words[i >>> 5]! >>> (31 - (i & 31))) & 1;

/** True when `a` and `b` agree on their first `length` bits. */
function samePrefix(a: readonly number[], b: readonly number[], length: number): boolean {
  const full = length >>> 5;
  for (let i = 0; i < full; i++) if (a[i] !== b[i]) return false;
  const rest = length & 31;
  return rest === 0 || ((a[full]! ^ b[full]!) & (~0 << (32 - rest))) === 0;
}

/** Number of leading bits on which `a` and `b` agree, at most `limit`. */
function commonPrefixLength(a: readonly number[], b: readonly number[], limit: number): number {
  for (let i = 0; i * 32 < limit; i++) {
    const diff = (a[i]! ^ b[i]!) >>> 0;
    if (diff !== 0) return Math.min(limit, i * 32 + Math.clz32(diff));
  }
  return limit;
}

export class PrefixTrie<T> {
  private readonly root: TrieNode<T>;
  private count = 0;

  constructor(readonly bits: 32 | 128) {
    this.root = {
      prefixLength: 0,
      key: new Array(bits / 32).fill(0),
      value: undefined,
      zero: null,
      one: null,
    };
  }

  get size(): number {
    return this.count;
  }

  /**
   * Inserts `value` for the prefix `key/prefixLength` (key already masked). The first value
   * for a prefix wins; returns false when the prefix was already present.
   */
  insert(key: readonly number[], prefixLength: number, value: T): boolean {
    let node = this.root;
    for (;;) {
      if (node.prefixLength === prefixLength) {
        if (node.value !== undefined) return false;
        node.value = value;
        this.count++;
        return true;
      }
      const side = bitAt(key, node.prefixLength);
      const child = side ? node.one : node.zero;
      if (child === null) {
        this.attach(node, side, this.leaf(key, prefixLength, value));
        return true;
      }
      const common = commonPrefixLength(child.key, key, Math.min(child.prefixLength, prefixLength));
      if (common === child.prefixLength) {
        node = child;
        continue;
      }
      // The new prefix diverges from `child` (or ends) inside child's compressed path: split.
      const split: TrieNode<T> =
        common === prefixLength
          ? this.leaf(key, prefixLength, value)
          : {
              prefixLength: common,
              key: maskWords(key, common),
              value: undefined,
              zero: null,
              one: null,
            };
      this.attach(split, bitAt(child.key, common), child);
      if (common !== prefixLength)
        this.attach(split, bitAt(key, common), this.leaf(key, prefixLength, value));
      this.attach(node, side, split);
      return true;
    }
  }

  /** The value of the longest prefix of at most `maxLength` bits containing `address`. */
  lookup(address: readonly number[], maxLength: number = this.bits): T | undefined {
    let node = this.root;
    let best = node.value;
    while (node.prefixLength < maxLength) {
      const next = bitAt(address, node.prefixLength) ? node.one : node.zero;
      if (
        next === null ||
        next.prefixLength > maxLength ||
        !samePrefix(next.key, address, next.prefixLength)
      )
        break;
      if (next.value !== undefined) best = next.value;
      node = next;
    }
    return best;
  }

  /** Every stored value, in address order. */
  values(): T[] {
    const out: T[] = [];
    const walk = (node: TrieNode<T> | null): void => {
      if (node === null) return;
      if (node.value !== undefined) out.push(node.value);
      walk(node.zero);
      walk(node.one);
    };
    walk(this.root);
    return out;
  }

  private leaf(key: readonly number[], prefixLength: number, value: T): TrieNode<T> {
    this.count++;
    return { prefixLength, key: maskWords(key, prefixLength), value, zero: null, one: null };
  }

  private attach(parent: TrieNode<T>, side: number, child: TrieNode<T>): void {
    if (side) parent.one = child;
    else parent.zero = child;
  }
}
