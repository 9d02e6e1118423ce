import type { CanonicalName, IPAddress, LearnedAddresses } from '../policy/index.js';

interface LearnedEntry {
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
  private readonly entries = new Map<string, LearnedEntry>();

  constructor(
    private readonly now: () => number,
    private readonly capacity: number,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  lookup(ip: IPAddress): CanonicalName | undefined {
    const entry = this.entries.get(ip.text);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= this.now()) {
      this.entries.delete(ip.text);
      return undefined;
    }
    return entry.name;
  }

  /** Records that `ip` was given for `name`, for `ttlSeconds` (already clamped). */
  learn(ip: IPAddress, name: CanonicalName, ttlSeconds: number): void {
    const expiresAt = this.now() + ttlSeconds * 1000;
    const current = this.entries.get(ip.text);
    // Never shorten: two names may share an address, and the later answer may carry a lower TTL.
    if (current !== undefined && current.expiresAt >= expiresAt) return;
    if (current !== undefined) this.entries.delete(ip.text);
    else if (this.entries.size >= this.capacity)
      this.entries.delete(this.entries.keys().next().value!);
    this.entries.set(ip.text, { name, expiresAt });
  }

  /** Drops entries whose name `keep` rejects, and expired ones; returns how many went. */
  retain(keep: (name: CanonicalName) => boolean): number {
    const now = this.now();
    let dropped = 0;
    for (const [key, entry] of this.entries) {
      if (entry.expiresAt <= now || !keep(entry.name)) {
        this.entries.delete(key);
        dropped++;
      }
    }
    return dropped;
  }

  /** Live entries, for the kernel enforcer and for diagnostics. */
  list(): Array<{ address: string; name: string; expiresAt: number }> {
    const now = this.now();
    return [...this.entries]
      .filter(([, entry]) => entry.expiresAt > now)
      .map(([address, entry]) => ({ address, name: entry.name, expiresAt: entry.expiresAt }));
  }
}
