import { type CIDR, type IPAddress, parseIP } from '../policy/index.js';

/**
 * Hands out distinct source addresses from a range, one per sandbox (in the plain process
 * runtime: loopback addresses, so a test can speak as a sandbox by binding one).
 */
export class AddressPool {
  private readonly used = new Set<number>();
  private next = 1;
  private readonly base: number;
  private readonly count: number;

  constructor(readonly range: CIDR) {
    if (range.version !== 4)
      throw new Error(`source address pool ${range.text} must be an IPv4 range`);
    this.base = range.words[0]!;
    // The network address and the broadcast address of the range are never handed out.
    this.count = 2 ** (32 - range.prefixLength);
  }

  allocate(): IPAddress {
    for (let tried = 0; tried < this.count; tried++) {
      const offset = this.next;
      this.next = this.next + 1 >= this.count - 1 ? 1 : this.next + 1;
      if (offset < 1 || offset >= this.count - 1 || this.used.has(offset)) continue;
      this.used.add(offset);
      return this.addressAt(offset);
    }
    throw new Error(
      `source address pool ${this.range.text} is exhausted (${this.used.size} addresses in use)`,
    );
  }

  /** Marks an address handed out earlier (before a restart) as in use; false if it is not ours. */
  reserve(address: IPAddress): boolean {
    const offset = (address.words[0]! - this.base) >>> 0;
    if (address.version !== 4 || offset < 1 || offset >= this.count - 1) return false;
    this.used.add(offset);
    return true;
  }

  release(address: IPAddress): void {
    if (address.version === 4) this.used.delete((address.words[0]! - this.base) >>> 0);
  }

  private addressAt(offset: number): IPAddress {
    const word = (this.base + offset) >>> 0;
    const parsed = parseIP(
      `${word >>> 24}.${(word >>> 16) & 255}.${(word >>> 8) & 255}.${word & 255}`,
    );
    if (!parsed.ok) throw new Error(parsed.error);
    return parsed.value;
  }
}
