/**
 * Runs tasks one at a time per key, in arrival order: two requests for the same sandbox never
 * interleave their read-modify-write of its record. Different keys run concurrently.
 */
export class KeyedQueue {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, task: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    const result = previous.then(task, task);
    const tail = result.catch(() => undefined);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return result;
  }

  /** Resolves once every task queued so far has finished. */
  async idle(): Promise<void> {
    while (this.tails.size > 0) await Promise.all(this.tails.values());
  }
}

/**
 * When each sandbox expires, and one timer for the earliest. Expiry is a stored instant, not a
 * countdown: after a restart the same instants are loaded back, and anything already past is
 * due at once. The clock is injectable; `takeDue()` is what the timer's callback uses, so a test that moves
 * the clock calls the same path.
 */
export class ExpiryTimer {
  private readonly deadlines = new Map<string, number>();
  private timer: NodeJS.Timeout | undefined;
  private armedFor = Infinity;

  constructor(
    private readonly now: () => number,
    private readonly onDue: () => void,
  ) {}

  set(id: string, at: number): void {
    this.deadlines.set(id, at);
    if (at < this.armedFor) this.arm();
  }

  delete(id: string): void {
    this.deadlines.delete(id);
  }

  /** Takes out the IDs whose deadline has passed (the caller re-sets any it keeps). */
  takeDue(): string[] {
    const now = this.now();
    const ids = [...this.deadlines].filter(([, at]) => at <= now).map(([id]) => id);
    for (const id of ids) this.deadlines.delete(id);
    this.arm();
    return ids;
  }

  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.armedFor = Infinity;
  }

  private arm(): void {
    clearTimeout(this.timer);
    let next = Infinity;
    for (const at of this.deadlines.values()) if (at < next) next = at;
    this.armedFor = next;
    if (next === Infinity) return;
    // setTimeout holds at most 2^31-1 ms; a later deadline re-arms when this one fires.
    const delay = Math.min(Math.max(0, next - this.now()), 2 ** 31 - 1);
    this.timer = setTimeout(() => this.onDue(), delay);
    this.timer.unref();
  }
}
