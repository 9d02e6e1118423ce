import { type IPAddress, matchName, type Policy } from '../policy/index.js';
import { LearnedAddressTable } from './learned.js';
import { sameSecret } from '../same-secret.js';

/** What the enforcement points know about one sandbox. */
export interface EnforcedSandbox {
  readonly sandboxID: string;
  /** The address its traffic comes from (namespace veth, or a loopback address). */
  readonly sourceAddress: IPAddress | undefined;
  /** The current compiled policy; replaced atomically by `publish`. */
  readonly policy: Policy;
  readonly learned: LearnedAddressTable;
}

export type EnforcementEvent =
  | {
      readonly type: 'published';
      readonly sandboxID: string;
      readonly policy: Policy;
      readonly droppedLearned: number;
    }
  | { readonly type: 'removed'; readonly sandboxID: string };

export interface EnforcementTableOptions {
  /** Clock in milliseconds (tests pass a controllable one). */
  readonly now?: () => number;
  /** Learned addresses kept per sandbox. */
  readonly learnedCapacity?: number;
}

interface SandboxRecord {
  sandboxID: string;
  sourceAddress: IPAddress | undefined;
  policy: Policy;
  learned: LearnedAddressTable;
  egressSecret: Buffer;
}

/**
 * sandboxID / source address / egress credential -> current compiled Policy and learned
 * addresses. Lookups never see a half-made change: a publish is one reference swap.
 */
export class EnforcementTable {
  private readonly byID = new Map<string, SandboxRecord>();
  private readonly bySource = new Map<string, SandboxRecord>();
  private readonly listeners = new Set<(event: EnforcementEvent) => void>();
  private readonly now: () => number;
  private readonly learnedCapacity: number;

  constructor(options: EnforcementTableOptions = {}) {
    this.now = options.now ?? Date.now;
    this.learnedCapacity = options.learnedCapacity ?? 4096;
  }

  get size(): number {
    return this.byID.size;
  }

  /** Adds a sandbox with its first policy. Its source address must not be in use. */
  register(
    sandboxID: string,
    identity: { sourceAddress?: IPAddress; egressSecret: string },
    policy: Policy,
  ): EnforcedSandbox {
    if (this.byID.has(sandboxID)) throw new Error(`sandbox ${sandboxID} is already registered`);
    const source = identity.sourceAddress;
    if (source !== undefined && this.bySource.has(source.text)) {
      throw new Error(
        `source address ${source.text} is already used by sandbox ${this.bySource.get(source.text)!.sandboxID}`,
      );
    }
    const record: SandboxRecord = {
      sandboxID,
      sourceAddress: source,
      policy,
      learned: new LearnedAddressTable(this.now, this.learnedCapacity),
      egressSecret: Buffer.from(identity.egressSecret),
    };
    this.byID.set(sandboxID, record);
    if (source !== undefined) this.bySource.set(source.text, record);
    this.emit({ type: 'published', sandboxID, policy, droppedLearned: 0 });
    return record;
  }

  /**
   * Swaps in a new policy. Learned addresses whose names the new policy no longer allows are
   * dropped before anyone can use them again.
   */
  publish(sandboxID: string, policy: Policy): boolean {
    const record = this.byID.get(sandboxID);
    if (record === undefined) return false;
    record.policy = policy;
    const droppedLearned = record.learned.retain((name) => matchName(policy, name) !== undefined);
    this.emit({ type: 'published', sandboxID, policy, droppedLearned });
    return true;
  }

  remove(sandboxID: string): boolean {
    const record = this.byID.get(sandboxID);
    if (record === undefined) return false;
    this.byID.delete(sandboxID);
    if (record.sourceAddress !== undefined) this.bySource.delete(record.sourceAddress.text);
    this.emit({ type: 'removed', sandboxID });
    return true;
  }

  get(sandboxID: string): EnforcedSandbox | undefined {
    return this.byID.get(sandboxID);
  }

  /**
   * Whether `sandbox`, identified earlier, is still in the table: work that awaited DNS or a
   * dial checks this before it hands anything to a sandbox that was removed meanwhile.
   */
  holds(sandbox: EnforcedSandbox): boolean {
    return this.byID.get(sandbox.sandboxID) === sandbox;
  }

  /** The sandbox whose traffic comes from this address (IPv4-mapped forms already folded). */
  fromSource(address: string): EnforcedSandbox | undefined {
    return this.bySource.get(address);
  }

  /** The sandbox identified by an egress credential; the secret is compared in constant time. */
  fromCredential(sandboxID: string, secret: string): EnforcedSandbox | undefined {
    const record = this.byID.get(sandboxID);
    if (record === undefined) return undefined;
    return sameSecret(secret, record.egressSecret) ? record : undefined;
  }

  all(): EnforcedSandbox[] {
    return [...this.byID.values()];
  }

  subscribe(listener: (event: EnforcementEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private emit(event: EnforcementEvent): void {
    for (const listener of this.listeners) listener(event);
  }
}
