import type { CanonicalName, IPAddress, LearnedAddresses } from '../policy/index.js';

interface LearnedEntry {
  readonly ip: IPAddress;
  readonly name: CanonicalName;
  readonly expiresAt: number;
}

/**
 * Addresses the DNS interceptor gave one sandbox for allowed names, each until its clamped TTL
 * runs out. Bounded: when full, the entry learned or extended longest ago makes room (the Map
 * keeps that order, so eviction is O(1); answers' expiry is absolute, so this is close to
 * "soonest to expire" without a scan).
 */
export class LearnedAddressTable implements LearnedAddresses {
  private readonly byAddress = new Map<string, LearnedEntry>();

  constructor(
    private readonly now: () => number,
    private readonly capacity: number,
  ) {}

  get size(): number {
    return this.byAddress.size;
  }

  lookup(ip: IPAddress): CanonicalName | undefined {
    const entry = this.byAddress.get(ip.text);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= this.now()) {
      this.byAddress.delete(ip.text);
      return undefined;
    }
    return entry.name;
  }

  /**
   * Records that `ip` was given for `name`, for `ttlSeconds` (already clamped). Returns the
   * entry's expiry when this added it or moved it out, undefined when nothing changed.
   */
  learn(ip: IPAddress, name: CanonicalName, ttlSeconds: number): number | undefined {
    const expiresAt = this.now() + ttlSeconds * 1000;
    const current = this.byAddress.get(ip.text);
    // Never shorten: two names may share an address, and the later answer may carry a lower TTL.
    if (current !== undefined && current.expiresAt >= expiresAt) return undefined;
    if (current !== undefined) this.byAddress.delete(ip.text);
    else if (this.byAddress.size >= this.capacity)
      this.byAddress.delete(this.byAddress.keys().next().value!);
    this.byAddress.set(ip.text, { ip, name, expiresAt });
    return expiresAt;
  }

  /** Drops entries whose name `keep` rejects, and expired ones; returns how many went. */
  retain(keep: (name: CanonicalName) => boolean): number {
    const now = this.now();
    let dropped = 0;
    for (const [key, entry] of this.byAddress) {
      if (entry.expiresAt <= now || !keep(entry.name)) {
        this.byAddress.delete(key);
        dropped++;
      }
    }
    return dropped;
  }

  /** Live entries, for the kernel enforcer. */
  entries(): Array<{ address: IPAddress; name: CanonicalName; expiresAt: number }> {
    const now = this.now();
    return [...this.byAddress.values()]
      .filter((entry) => entry.expiresAt > now)
      .map((entry) => ({ address: entry.ip, name: entry.name, expiresAt: entry.expiresAt }));
  }
}
