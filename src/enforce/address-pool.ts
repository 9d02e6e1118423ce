import { type CIDR, type IPAddress, parseIP } from '../policy/index.js';

export interface AddressPoolOptions {
  /**
   * Addresses per sandbox. 1: every address but the range's first and last (loopback sources).
   * 4: one /30 link per sandbox, the sandbox getting its third address (`.2` of the /30) and the
   * host its second; the range's first /30 is kept for the host's gateway address.
   */
  readonly block?: 1 | 4;
}

/**
 * Hands out distinct source addresses from a range, one per sandbox (in the plain process
 * runtime: loopback addresses, so a test can speak as a sandbox by binding one; in the
 * namespace runtime: the sandbox end of its veth link).
 */
export class AddressPool {
  private readonly used = new Set<number>();
  private readonly base: number;
  private readonly block: number;
  /** Offset of the sandbox's address inside its block. */
  private readonly inner: number;
  private readonly firstSlot: number;
  private readonly lastSlot: number;
  private next: number;

  constructor(
    readonly range: CIDR,
    options: AddressPoolOptions = {},
  ) {
    if (range.version !== 4)
      throw new Error(`source address pool ${range.text} must be an IPv4 range`);
    this.base = range.words[0]!;
    this.block = options.block ?? 1;
    const count = 2 ** (32 - range.prefixLength);
    // Single addresses: the network address and the broadcast address are never handed out.
    // Links: slot 0 holds the gateway, the others one /30 each.
    this.inner = this.block === 1 ? 0 : 2;
    this.firstSlot = 1;
    this.lastSlot = this.block === 1 ? count - 2 : count / this.block - 1;
    if (this.lastSlot < this.firstSlot)
      throw new Error(`source address pool ${range.text} is too small`);
    this.next = this.firstSlot;
  }

  /** How many sandboxes the pool can hold at once. */
  get capacity(): number {
    return this.lastSlot - this.firstSlot + 1;
  }

  allocate(): IPAddress {
    for (let tried = 0; tried < this.capacity; tried++) {
      const slot = this.next;
      this.next = slot >= this.lastSlot ? this.firstSlot : slot + 1;
      if (this.used.has(slot)) continue;
      this.used.add(slot);
      return this.addressAt(slot * this.block + this.inner);
    }
    throw new Error(
      `source address pool ${this.range.text} is exhausted (${this.used.size} sandboxes hold addresses from it)`,
    );
  }

  /** Marks an address handed out earlier (before a restart) as in use; false if it is not ours. */
  reserve(address: IPAddress): boolean {
    const slot = this.slotOf(address);
    if (slot === undefined) return false;
    this.used.add(slot);
    return true;
  }

  release(address: IPAddress): void {
    const slot = this.slotOf(address);
    if (slot !== undefined) this.used.delete(slot);
  }

  /** The sandbox's link number (its /30 within the range); names its namespace and veth. */
  slotOf(address: IPAddress): number | undefined {
    if (address.version !== 4) return undefined;
    const offset = (address.words[0]! - this.base) >>> 0;
    if ((offset - this.inner) % this.block !== 0) return undefined;
    const slot = (offset - this.inner) / this.block;
    return slot >= this.firstSlot && slot <= this.lastSlot ? slot : undefined;
  }

  /** The address `delta` away from `address` (the host end of a sandbox's link is -1). */
  static offset(address: IPAddress, delta: number): IPAddress {
    return addressOf((address.words[0]! + delta) >>> 0);
  }

  private addressAt(offset: number): IPAddress {
    return addressOf((this.base + offset) >>> 0);
  }
}

function addressOf(word: number): IPAddress {
  const parsed = parseIP(
    `${word >>> 24}.${(word >>> 16) & 255}.${(word >>> 8) & 255}.${word & 255}`,
  );
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.value;
}
