import type { FlowRecord, FlowVerdict } from './record.js';

/** What `GET /flows` filters by; every field optional. */
export interface FlowFilter {
  readonly sandboxID?: string;
  readonly verdict?: FlowVerdict;
  readonly kind?: string;
  /** Records at or after this time (ms since the epoch). */
  readonly since?: number;
  /** A substring of the name asked for or the address dialled. */
  readonly destination?: string;
  /** Whether the record carries a report-mode sandbox's `wouldDeny`. */
  readonly wouldDeny?: boolean;
}

export function matches(record: FlowRecord, filter: FlowFilter): boolean {
  if (filter.sandboxID !== undefined && record.sandboxID !== filter.sandboxID) return false;
  if (filter.verdict !== undefined && record.verdict !== filter.verdict) return false;
  if (filter.kind !== undefined && record.kind !== filter.kind) return false;
  if (filter.since !== undefined && record.time < filter.since) return false;
  if (filter.wouldDeny !== undefined && (record.wouldDeny !== undefined) !== filter.wouldDeny)
    return false;
  if (filter.destination !== undefined) {
    const { name, address } = record.destination;
    if (!name?.includes(filter.destination) && !address?.includes(filter.destination)) return false;
  }
  return true;
}

/** A sandbox's flows since this Moat started (not bounded by the ring). */
export interface FlowTotals {
  allowed: number;
  denied: number;
  bytesUp: number;
  bytesDown: number;
}

/** Takes a new record; false when it has fallen too far behind to take any more. */
export type Follower = (record: FlowRecord) => boolean;

/** Sandboxes whose totals are kept; the longest-unseen go first beyond it. */
const MAX_TOTALS = 100_000;

/**
 * The node's recent flow records: a ring of `capacity` records (a burst beyond it keeps the
 * newest), per-sandbox totals, and followers told of each new record as it is added.
 */
export class FlowStore {
  private readonly ring: (FlowRecord | undefined)[];
  /** Where the next record goes. */
  private next = 0;
  private held = 0;
  private readonly totals = new Map<string, FlowTotals>();
  private readonly followers = new Map<Follower, () => void>();

  constructor(
    readonly capacity: number,
    /**
     * Called for each record the bound pushes out (store), and for each follower cut for
     * falling behind (follower: the records it would have been sent are lost to it).
     */
    private readonly onDropped: (where: 'store' | 'follower') => void = () => {},
  ) {
    if (!Number.isInteger(capacity) || capacity < 1)
      throw new Error(`flow store size ${capacity} must be a positive integer`);
    this.ring = new Array<FlowRecord | undefined>(capacity);
  }

  get size(): number {
    return this.held;
  }

  add(record: FlowRecord): void {
    if (this.held === this.capacity) this.onDropped('store');
    else this.held++;
    this.ring[this.next] = record;
    this.next = this.next + 1 === this.capacity ? 0 : this.next + 1;
    this.count(record);
    if (this.followers.size === 0) return;
    for (const [follower, cut] of this.followers) {
      if (follower(record)) continue;
      this.followers.delete(follower);
      this.onDropped('follower');
      cut();
    }
  }

  /** Records matching `filter`, newest first, at most `limit`. */
  query(filter: FlowFilter, limit: number): FlowRecord[] {
    const found: FlowRecord[] = [];
    for (let i = 1; i <= this.held && found.length < limit; i++) {
      const record = this.ring[(this.next - i + this.capacity) % this.capacity]!;
      // Older records only from here on.
      if (filter.since !== undefined && record.time < filter.since) break;
      if (matches(record, filter)) found.push(record);
    }
    return found;
  }

  /**
   * Shows `follower` every record added from now on until it answers false (it cannot take
   * more: it is dropped and `cut` is called) or the returned function is called.
   */
  follow(follower: Follower, cut: () => void): () => void {
    this.followers.set(follower, cut);
    return () => this.followers.delete(follower);
  }

  /** Cuts every follower (the server is closing: their streams must not hold it open). */
  cutFollowers(): void {
    const cuts = [...this.followers.values()];
    this.followers.clear();
    for (const cut of cuts) cut();
  }

  /** Followers being told of new records. */
  get followerCount(): number {
    return this.followers.size;
  }

  totalsOf(sandboxID: string): FlowTotals {
    return {
      ...(this.totals.get(sandboxID) ?? { allowed: 0, denied: 0, bytesUp: 0, bytesDown: 0 }),
    };
  }

  private count(record: FlowRecord): void {
    if (record.sandboxID === '') return;
    let totals = this.totals.get(record.sandboxID);
    if (totals === undefined) {
      if (this.totals.size >= MAX_TOTALS) this.totals.delete(this.totals.keys().next().value!);
      totals = { allowed: 0, denied: 0, bytesUp: 0, bytesDown: 0 };
      this.totals.set(record.sandboxID, totals);
    }
    if (record.event === 'decision') {
      if (record.verdict === 'allow') totals.allowed++;
      else totals.denied++;
    } else {
      totals.bytesUp += record.bytesUp ?? 0;
      totals.bytesDown += record.bytesDown ?? 0;
    }
  }
}
