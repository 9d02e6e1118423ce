/**
 * The host ids of sandboxes. One Moat holds a range of host uids and gids (a RangeLock in
 * /run/moat, so no other Moat on the host hands out the same ids), split into slots of 65,536:
 * slot 0 owns Moat's stored layers, each other slot is one sandbox, whose ids 0..65535 (its
 * root, its user, every account it has) are the slot's host ids. No process ever runs with the
 * ids of slot 0, and no two sandboxes share a slot: a sandbox's processes own nothing on the
 * host but its own files.
 */
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { LOCK_DIR, RangeLock } from './range-lock.js';

export const IDS_PER_SANDBOX = 65_536;
/** Where `auto` places ranges: host ids 2^30 to 2^31 (above any account, below signed overflow). */
const AUTO_FIRST = 2 ** 30;
const AUTO_SLOTS = 1024;
const AUTO_RANGES = 2 ** 30 / (AUTO_SLOTS * IDS_PER_SANDBOX);

/** `auto`, or the first host id and the number of slots (`first+slots`). */
export type IdRangeSetting = 'auto' | { readonly first: number; readonly slots: number };

export class SandboxIds {
  /** Slot -> the sandbox whose files its ids own (held for as long as those files exist). */
  private readonly owners = new Map<number, string>();

  private constructor(
    private readonly lock: RangeLock,
    readonly first: number,
    readonly slots: number,
  ) {}

  /**
   * Takes the configured range, or with `auto` the range recorded in the data folder (else the
   * first free one that no other existing data folder took last, then the free one released
   * longest ago; then recorded), so that a Moat keeps its ids across restarts, crashes included.
   */
  static async acquire(
    setting: IdRangeSetting,
    dataDir: string,
    lockDir = LOCK_DIR,
  ): Promise<SandboxIds> {
    const record = path.join(dataDir, 'sandbox-ids');
    const make = (first: number, slots: number) =>
      new RangeLock(
        'ids',
        first,
        first + slots * IDS_PER_SANDBOX - 1,
        `the sandbox id range ${first}+${slots}`,
        'give each Moat on a host its own --sandbox-ids (or leave it auto)',
        (start, end) => `${start}+${(end - start + 1) / IDS_PER_SANDBOX}`,
        path.resolve(dataDir),
        lockDir,
      );
    if (setting !== 'auto') {
      const lock = make(setting.first, setting.slots);
      await lock.acquire();
      return new SandboxIds(lock, setting.first, setting.slots);
    }
    const recorded = existsSync(record) ? Number((await readFile(record, 'utf8')).trim()) : NaN;
    if (Number.isSafeInteger(recorded)) {
      const lock = make(recorded, AUTO_SLOTS);
      await lock.acquire();
      return new SandboxIds(lock, recorded, AUTO_SLOTS);
    }
    const ranges = Array.from({ length: AUTO_RANGES }, (_, index) => {
      const first = AUTO_FIRST + index * AUTO_SLOTS * IDS_PER_SANDBOX;
      return { first, lock: make(first, AUTO_SLOTS) };
    });
    // Then a range kept for another data folder: the one released longest ago, which is the
    // least likely to be wanted back this moment (a Moat restarting takes its own back at once).
    const keptLast = async () => {
      const written = await Promise.all(ranges.map(({ lock }) => lock.lastWritten()));
      return ranges
        .map((range, i) => ({ ...range, written: written[i]! }))
        .sort((a, b) => a.written - b.written);
    };
    for (const leaveKept of [true, false]) {
      for (const { first, lock } of leaveKept ? ranges : await keptLast()) {
        if (!(await lock.available()) || (leaveKept && (await lock.keptForAnother()))) continue;
        try {
          await lock.acquire();
        } catch {
          continue; // taken in the meantime
        }
        await writeFile(record, `${first}\n`, { mode: 0o600 });
        return new SandboxIds(lock, first, AUTO_SLOTS);
      }
    }
    throw new Error(
      `every automatic sandbox id range (${AUTO_RANGES} of ${AUTO_SLOTS} sandboxes from host id ${AUTO_FIRST}) is held by another Moat; set --sandbox-ids`,
    );
  }

  /** The first host id of the store (owner of stored layers). */
  get storeFirst(): number {
    return this.first;
  }

  /** The first host id of a slot. */
  hostFirst(slot: number): number {
    return this.first + slot * IDS_PER_SANDBOX;
  }

  /** The slot whose first host id is `first`, if it is one of this range's sandbox slots. */
  slotOf(first: number): number | undefined {
    const slot = (first - this.first) / IDS_PER_SANDBOX;
    return Number.isInteger(slot) && slot >= 1 && slot < this.slots ? slot : undefined;
  }

  /** A free slot, now `owner`'s. */
  allocate(owner: string): number {
    for (let slot = 1; slot < this.slots; slot++) {
      if (!this.owners.has(slot)) {
        this.owners.set(slot, owner);
        return slot;
      }
    }
    throw new Error(`all ${this.slots - 1} sandbox id slots are in use; raise --sandbox-ids`);
  }

  /** Takes back the slot of a sandbox whose files survived a restart; false when another has it. */
  claim(slot: number, owner: string): boolean {
    const current = this.owners.get(slot);
    if (current !== undefined && current !== owner) return false;
    if (slot < 1 || slot >= this.slots) return false;
    this.owners.set(slot, owner);
    return true;
  }

  /** Hands a slot on to its new owner (a spare's slot to the sandbox that took the spare). */
  assign(slot: number, owner: string): void {
    this.owners.set(slot, owner);
  }

  /** The sandbox's files are gone: its ids may go to another sandbox. */
  release(slot: number): void {
    this.owners.delete(slot);
  }

  async stop(): Promise<void> {
    await this.lock.release();
  }
}
