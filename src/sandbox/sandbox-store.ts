/**
 * The store as the lifecycle uses it: sandbox and snapshot records read back with the default
 * limits filled in, and an unreachable store answered as 503 on reads as on writes.
 */
import type { MoatMetrics } from '../metrics/index.js';
import type { SandboxLimits } from '../runtime/index.js';
import {
  type JsonValue,
  type Store,
  type StoreChange,
  StoreUnavailableError,
} from '../store/index.js';
import {
  asJson,
  readSandbox,
  readSnapshot,
  SANDBOXES,
  type SandboxRecord,
  type SnapshotRecord,
  TEMPLATES,
} from './records.js';
import { SandboxError } from './requests.js';

const unavailable = (error: unknown): never => {
  if (error instanceof StoreUnavailableError) throw new SandboxError(503, error.message);
  throw error;
};

export class SandboxStore {
  /** The store's reads, with "unreachable" answered as 503. */
  readonly reads: Pick<Store, 'get' | 'list'>;

  constructor(
    private readonly store: Store,
    private readonly metrics: MoatMetrics,
    /** Limits of sandboxes made from the base template (snapshots carry their own). */
    readonly defaultLimits: SandboxLimits,
  ) {
    this.reads = {
      get: (collection, key) => store.get(collection, key).catch(unavailable),
      list: (collection) => store.list(collection).catch(unavailable),
    };
  }

  /** The stored record of a sandbox; undefined when there is none (an outage throws). */
  async get(sandboxID: string): Promise<SandboxRecord | undefined> {
    const stored = await this.reads.get(SANDBOXES, sandboxID);
    return stored === undefined ? undefined : this.read(stored, sandboxID);
  }

  /** Every stored sandbox, of every node. */
  async all(): Promise<SandboxRecord[]> {
    return (await this.reads.list(SANDBOXES)).map(([key, value]) => this.read(value, key));
  }

  async snapshots(): Promise<SnapshotRecord[]> {
    return (await this.reads.list(TEMPLATES)).map(([key, value]) => readSnapshot(value, key));
  }

  save(record: SandboxRecord): Promise<void> {
    return this.commit([{ collection: SANDBOXES, key: record.sandboxID, value: asJson(record) }]);
  }

  delete(sandboxIDs: readonly string[]): Promise<void> {
    return this.commit(sandboxIDs.map((key) => ({ collection: SANDBOXES, key, value: null })));
  }

  /** Applies all changes or none; a failed write is counted. */
  async commit(changes: StoreChange[]): Promise<void> {
    try {
      await this.store.commit(changes);
    } catch (error) {
      this.metrics.storeErrors.inc();
      unavailable(error);
    }
  }

  /** A sandbox's limits: its record's, or (for records from before limits) the defaults. */
  limitsOf(record: SandboxRecord): SandboxLimits {
    return record.limits ?? this.defaultLimits;
  }

  private read(value: JsonValue, key: string): SandboxRecord {
    const record = readSandbox(value, key);
    return record.limits ? record : { ...record, limits: this.defaultLimits };
  }
}
