/**
 * Leaves by name: at most `capacity` kept (the least recently used goes first), each until its
 * renewal time; concurrent requests for one name wait on one mint.
 */
export interface Fresh<T> {
  readonly value: T;
  /** When a new one is minted instead (before the old one expires). */
  readonly renewAt: number;
}

export class LeafCache<T> {
  private readonly entries = new Map<string, Fresh<T>>();
  private readonly minting = new Map<string, Promise<T>>();
  /** Mints started, and answers from the cache, since construction. */
  mints = 0;
  hits = 0;

  constructor(
    private readonly capacity: number,
    private readonly now: () => number,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  get(name: string, mint: () => Promise<Fresh<T>>): Promise<T> {
    const entry = this.entries.get(name);
    if (entry !== undefined && this.now() < entry.renewAt) {
      // Map order is insertion order: moved to the end, it is the most recently used.
      this.entries.delete(name);
      this.entries.set(name, entry);
      this.hits += 1;
      return Promise.resolve(entry.value);
    }
    const pending = this.minting.get(name);
    if (pending !== undefined) return pending;
    this.mints += 1;
    const minted = mint().then(
      (fresh) => {
        this.minting.delete(name);
        this.entries.delete(name);
        this.entries.set(name, fresh);
        if (this.entries.size > this.capacity) {
          this.entries.delete(this.entries.keys().next().value!);
        }
        return fresh.value;
      },
      (error: unknown) => {
        this.minting.delete(name);
        throw error;
      },
    );
    this.minting.set(name, minted);
    return minted;
  }
}
