import type { CIDR, IPAddress } from './address.js';
import { PrefixTrie } from './prefix-trie.js';

/** Longest-prefix lookup over both address families. */
export class AddressPrefixMap<T> {
  private readonly v4 = new PrefixTrie<T>(32);
  private readonly v6 = new PrefixTrie<T>(128);

  /** Adds a prefix; the first value for a prefix wins (returns false for a repeat). */
  insert(cidr: CIDR, value: T): boolean {
    return (cidr.version === 4 ? this.v4 : this.v6).insert(cidr.words, cidr.prefixLength, value);
  }

  lookup(ip: IPAddress): T | undefined {
    return (ip.version === 4 ? this.v4 : this.v6).lookup(ip.words);
  }

  /** The longest stored prefix of at most `maxLength` bits that covers the whole of `cidr`. */
  covering(cidr: CIDR, maxLength = cidr.prefixLength): T | undefined {
    return (cidr.version === 4 ? this.v4 : this.v6).lookup(cidr.words, maxLength);
  }

  get size(): number {
    return this.v4.size + this.v6.size;
  }
}
