import type { CanonicalName, IPAddress, LearnedAddresses } from '../policy/index.js';

interface LearnedEntry {
  readonly ip: IPAddress;
  /** Every name the address was given for, each with its own expiry (ms). */
  readonly names: Map<CanonicalName, number>;
  /**
   * Those of its names the policy denies it for (a denyOut name, rules that decide requests):
   * forgetting one would open the address, so they are the last to make room.
   */
  readonly denying: Set<CanonicalName>;
  /** The latest of those. */
  expiresAt: number;
  /** How long the firewall was told to keep the address open: expiresAt and a margin. */
  firewallUntil: number;
}

/**
 * Names kept per address. Shared addresses (CDNs) are common, but one sandbox asking for more
 * than this many names of one address gains nothing from the rest: the soonest to expire goes,
 * a name that denies the address last.
 */
const MAX_NAMES_PER_ADDRESS = 16;

/**
 * How much longer than its expiry the firewall keeps a learned address open: an eighth of the
 * TTL, at most 5 s. Each answer moves an expiry a little (a cached answer's aged TTL by up to a
 * second, a TTL clamped to the minimum by the time since the last query), and without a margin
 * every one of them, a cache hit included, would wait for a firewall change.
 */
const MAX_FIREWALL_MARGIN_MS = 5_000;
const firewallMarginMs = (ttlSeconds: number) => Math.min(ttlSeconds * 125, MAX_FIREWALL_MARGIN_MS);

/**
 * Addresses the DNS interceptor gave one sandbox, each name until its clamped TTL runs out. An
 * address given for two names keeps both, so a policy that stops allowing one still leaves the
 * address open for the other. Bounded: when full, the address learned or extended longest ago
 * makes room (the Map keeps that order; answers' expiry is absolute, so this is close to
 * "soonest to expire" without a scan). An address held for a name that denies it is passed
 * over: a sandbox must not be able to make Moat forget a denial by asking for other names. When
 * every address held denies, nothing is learned (`'full'`), and the interceptor withholds the
 * new address.
 */
export class LearnedAddressTable implements LearnedAddresses {
  private readonly byAddress = new Map<string, LearnedEntry>();

  constructor(
    private readonly now: () => number,
    private readonly capacity: number,
  ) {}

  /** Addresses held (some may have expired and not been looked at since). */
  get size(): number {
    return this.byAddress.size;
  }

  names(ip: IPAddress): readonly CanonicalName[] {
    const entry = this.byAddress.get(ip.text);
    if (entry === undefined) return [];
    if (!this.prune(entry, () => true)) {
      this.byAddress.delete(ip.text);
      return [];
    }
    if (entry.names.size === 1) return [...entry.names.keys()];
    return [...entry.names].sort((a, b) => b[1] - a[1]).map(([name]) => name);
  }

  /**
   * Records that `ip` was given for `name`, for `ttlSeconds` (already clamped); `denies`: the
   * policy denies the address for that name on some port. Returns how long the firewall must now
   * keep the address open when that grew (it was added, or its expiry passed what the firewall
   * was last told) or when `name` is new to it (its ports may differ), undefined when the
   * firewall already covers it, and `'full'` when the table holds only denials.
   */
  learn(
    ip: IPAddress,
    name: CanonicalName,
    ttlSeconds: number,
    denies = false,
  ): number | undefined | 'full' {
    const now = this.now();
    const expiresAt = now + ttlSeconds * 1000;
    const firewallUntil = expiresAt + firewallMarginMs(ttlSeconds);
    let entry = this.byAddress.get(ip.text);
    // An expired entry is learned afresh: the firewall may no longer hold it (a rewrite from
    // entries() leaves it out), whatever it was once told.
    if (entry !== undefined && entry.expiresAt <= now) {
      this.byAddress.delete(ip.text);
      entry = undefined;
    }
    if (entry === undefined) {
      if (this.byAddress.size >= this.capacity && !this.makeRoom()) return 'full';
      const names = new Map([[name, expiresAt]]);
      const denying = new Set(denies ? [name] : []);
      this.byAddress.set(ip.text, { ip, names, denying, expiresAt, firewallUntil });
      return firewallUntil;
    }
    if (denies) entry.denying.add(name);
    // A name new to the address may open other ports: the firewall is told (see below).
    const newName = !entry.names.has(name);
    // Never shorten: a later answer for the same name may carry a lower TTL.
    if ((entry.names.get(name) ?? 0) < expiresAt) {
      entry.names.set(name, expiresAt);
      if (entry.names.size > MAX_NAMES_PER_ADDRESS) {
        // The soonest to expire goes, one that denies only when every name does.
        const order = (n: [CanonicalName, number]) =>
          (entry!.denying.has(n[0]) ? Number.MAX_SAFE_INTEGER / 2 : 0) + n[1];
        const [soonest] = [...entry.names].reduce((a, b) => (order(b) < order(a) ? b : a));
        entry.names.delete(soonest);
        entry.denying.delete(soonest);
      }
    }
    if (expiresAt <= entry.expiresAt) return newName ? entry.firewallUntil : undefined;
    entry.expiresAt = expiresAt;
    // Extended: now the most recent, the last to be evicted.
    this.byAddress.delete(ip.text);
    this.byAddress.set(ip.text, entry);
    if (expiresAt <= entry.firewallUntil) return newName ? entry.firewallUntil : undefined;
    entry.firewallUntil = firewallUntil;
    return firewallUntil;
  }

  /** The firewall did not take these addresses: the next answer for each tells it again. */
  firewallMissed(addresses: readonly IPAddress[]): void {
    for (const ip of addresses) {
      const entry = this.byAddress.get(ip.text);
      if (entry !== undefined) entry.firewallUntil = entry.expiresAt;
    }
  }

  /**
   * Drops names `keep` rejects, and expired ones; an address left with no name goes. `denies`
   * says again, for a new policy, which names deny their address. Returns how many addresses
   * went.
   */
  retain(keep: (name: CanonicalName) => boolean, denies: (name: CanonicalName) => boolean): number {
    let dropped = 0;
    for (const [key, entry] of this.byAddress) {
      if (this.prune(entry, keep)) {
        entry.denying.clear();
        for (const name of entry.names.keys()) if (denies(name)) entry.denying.add(name);
        continue;
      }
      this.byAddress.delete(key);
      dropped++;
    }
    return dropped;
  }

  /**
   * Live addresses with how long the firewall keeps each open and the names it holds (whose
   * ports it opens), for the kernel enforcer.
   */
  entries(): Array<{ address: IPAddress; expiresAt: number; names: CanonicalName[] }> {
    const now = this.now();
    return [...this.byAddress.values()]
      .filter((entry) => entry.expiresAt > now)
      .map((entry) => ({
        address: entry.ip,
        expiresAt: entry.firewallUntil,
        names: [...entry.names.keys()],
      }));
  }

  /**
   * Evicts the address learned or extended longest ago that no name denies (expired ones go
   * first, whatever they held); false when every address held is a live denial.
   */
  private makeRoom(): boolean {
    const now = this.now();
    for (const [key, entry] of this.byAddress) {
      if (entry.expiresAt > now && entry.denying.size > 0) continue;
      this.byAddress.delete(key);
      return true;
    }
    return false;
  }

  /** Removes expired names and those `keep` rejects; false when none is left. */
  private prune(entry: LearnedEntry, keep: (name: CanonicalName) => boolean): boolean {
    const now = this.now();
    if (entry.expiresAt <= now) return false;
    let latest = 0;
    for (const [name, expiresAt] of entry.names) {
      if (expiresAt <= now || !keep(name)) {
        entry.names.delete(name);
        entry.denying.delete(name);
      } else latest = Math.max(latest, expiresAt);
    }
    entry.expiresAt = latest;
    // A name that went takes its time with it, in the firewall too (on the next rewrite).
    entry.firewallUntil = Math.min(entry.firewallUntil, latest + MAX_FIREWALL_MARGIN_MS);
    return entry.names.size > 0;
  }
}
