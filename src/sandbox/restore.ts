/**
 * Restart recovery: the sandboxes the store holds for this node are set up again (runtime and
 * firewall) when Moat starts, and a sandbox whose processes are gone is cold-booted from its
 * files. One that cannot come back is left paused with its files, never dropped; a
 * network-only one whose namespace is gone is detached.
 */
import { type IPAddress, parseIP, type Policy } from '../policy/index.js';
import { uplinkOf } from '../runtime/index.js';
import { isLocal } from './membership.js';
import { bandwidthOf, storedUpstream } from './network-settings.js';
import type { LifecycleParts } from './parts.js';
import type { SandboxRecord } from './records.js';
import { SandboxError } from './requests.js';

/** What recovery uses of the lifecycle's parts. */
export interface RestoreContext extends Pick<
  LifecycleParts,
  | 'runtime'
  | 'kernel'
  | 'bandwidthDefaults'
  | 'sources'
  | 'records'
  | 'policies'
  | 'cluster'
  | 'logger'
  | 'now'
  | 'environment'
  | 'transition'
> {
  /**
   * The lifecycle holds the sandbox again, in its record's state; `running`: enforced with this
   * address and policy, and due to expire at its `endAt`.
   */
  adopt(record: SandboxRecord, running?: { address: IPAddress; policy: Policy }): void;
}

export class SandboxRecovery {
  /** Sandboxes left paused because they could not be set up again at start-up, and why. */
  private readonly unrestored = new Map<string, string>();

  constructor(private readonly context: RestoreContext) {}

  /**
   * Loads every stored sandbox of this node: running ones are enforced again, paused ones keep
   * their addresses. Roots left behind by a crash mid-create are removed.
   */
  async restoreAll(): Promise<void> {
    const { sources, runtime, records, logger } = this.context;
    const stored = (await records.all()).filter((r) => isLocal(this.context.cluster, r));
    // First clear what a previous run left (roots never recorded, processes that outlived it).
    const templates = new Set((await records.snapshots()).map((s) => s.snapshotID));
    for (const id of await runtime.reconcile(new Set(stored.map((r) => r.sandboxID)), templates)) {
      logger.warn({ sandboxID: id }, 'removed the root of a sandbox that was never created');
    }
    // Every address still valid is taken back first, so a new one never collides with it.
    const kept = stored.map((record) => {
      const address = parseIP(record.sourceAddress);
      return address.ok && sources.reserve(address.value) ? address.value : undefined;
    });
    for (const [index, found] of stored.entries()) {
      let record = found;
      let address = kept[index];
      if (address === undefined) {
        // Made under another pool or enforcement mode: its processes are gone anyway, so it
        // gets an address of this one (nothing outside Moat knows the old one).
        address = sources.allocate();
        record = { ...record, sourceAddress: address.text };
        await records.save(record);
        logger.warn(
          { sandboxID: record.sandboxID, from: found.sourceAddress, to: address.text },
          `source address outside the pool ${sources.range.text}; given a new one`,
        );
      }
      // Paused as files only: nothing of it runs until it is resumed.
      if (record.state === 'paused' && record.filesOnly === true) {
        this.context.adopt(record);
        continue;
      }
      const policy = this.context.policies.stored(record);
      const problem = await this.bringBack(record, address, policy);
      // One sandbox that cannot come back must not keep the others (and Moat) down.
      if (problem !== undefined && record.link !== undefined)
        await this.detach(record, address, problem);
      else if (problem !== undefined) await this.leavePaused(record, problem);
      else this.context.adopt(record, record.state === 'running' ? { address, policy } : undefined);
    }
  }

  /**
   * Starts a sandbox again from its files (its processes are gone); a failure leaves it
   * paused, to be tried again at the next resume.
   */
  async coldBoot(record: SandboxRecord): Promise<void> {
    const address = parseIP(record.sourceAddress);
    if (!address.ok) throw new SandboxError(500, address.error);
    const policy = this.context.policies.stored(record);
    const problem = await this.bringBack(record, address.value, policy);
    if (problem !== undefined) {
      this.unrestored.set(record.sandboxID, problem);
      throw new SandboxError(
        503,
        `sandbox ${record.sandboxID} could not be restored on this host: ${problem}; it stays paused with its files`,
      );
    }
  }

  /** The sandbox's processes were kept: it was not left paused by a failed restore. */
  restored(sandboxID: string): boolean {
    return !this.unrestored.has(sandboxID);
  }

  forget(sandboxID: string): void {
    this.unrestored.delete(sandboxID);
  }

  /**
   * Sets up the sandbox's runtime and firewall again after a restart; returns why that failed,
   * with whatever was half set up taken down again (its files stay).
   */
  private async bringBack(
    record: SandboxRecord,
    address: IPAddress,
    policy: Policy,
  ): Promise<string | undefined> {
    const { runtime, kernel, records } = this.context;
    try {
      // Network-only: the namespace is adopted again only while its path names the same one.
      if (record.link !== undefined)
        await runtime.adopt(record.sandboxID, record.link, address.text, record.link.identity);
      else
        await runtime.restore(
          record.sandboxID,
          this.context.environment(record),
          address.text,
          records.limitsOf(record),
        );
      await kernel?.install(
        record.sandboxID,
        address,
        policy,
        storedUpstream(record),
        record.link && uplinkOf(record.link),
      );
      await kernel?.limitBandwidth(
        record.sandboxID,
        bandwidthOf(record.network, this.context.bandwidthDefaults),
      );
      this.unrestored.delete(record.sandboxID);
      return undefined;
    } catch (error) {
      await runtime.release(record.sandboxID).catch(() => {});
      return (error as Error).message;
    }
  }

  /**
   * A network-only sandbox whose namespace could not be adopted again (gone, or its path names
   * another) is detached: nothing of it is left to pause, and its namespace is not Moat's.
   */
  private async detach(record: SandboxRecord, address: IPAddress, problem: string): Promise<void> {
    this.context.logger.warn(
      { sandboxID: record.sandboxID, reason: problem },
      'network-only sandbox not adopted again at start-up; detached',
    );
    await this.context.records.delete([record.sandboxID]);
    this.context.sources.release(address);
    this.context.transition(record, 'lost', { reason: problem });
  }

  /**
   * A sandbox that could not be set up again is paused (nothing of it runs, and it is out of
   * the enforcement table) with its files kept; resuming it tries again.
   */
  private async leavePaused(record: SandboxRecord, problem: string): Promise<void> {
    this.unrestored.set(record.sandboxID, problem);
    this.context.logger.error(
      { sandboxID: record.sandboxID, err: problem },
      'could not restore this sandbox; it is left paused with its files, and resuming it tries again',
    );
    if (record.state === 'paused') {
      this.context.adopt(record);
      return;
    }
    const next: SandboxRecord = { ...record, state: 'paused', endAt: this.context.now() };
    await this.context.records.save(next);
    this.context.adopt(next);
    this.context.transition(next, 'pause', { reason: 'restore failed' });
  }
}
