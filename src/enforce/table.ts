import {
  type CanonicalName,
  type Destination,
  deniesLearnedName,
  type IPAddress,
  matchName,
  type Policy,
} from '../policy/index.js';
import { LearnedAddressTable } from './learned.js';
import { matchesDigest, secretDigest } from '../secret-compare/index.js';

/**
 * The operator's SOCKS5 proxy that a sandbox's allowed TCP is tunnelled through (E2B's
 * `network.egressProxy`). The password is a secret: it is never logged or returned.
 */
export interface UpstreamProxy {
  /** As the client wrote it (`host:port`): what messages name. */
  readonly address: string;
  /** Where it is: a canonical name (resolved at each dial) or an address, and its port. */
  readonly at: Destination & { readonly port: number };
  readonly username?: string;
  readonly password?: string;
}

/** What the enforcement points know about one sandbox. */
export interface EnforcedSandbox {
  readonly sandboxID: string;
  /** The address its traffic comes from (namespace veth, or a loopback address). */
  readonly sourceAddress: IPAddress | undefined;
  /** The current compiled policy; replaced atomically by `publish`. */
  readonly policy: Policy;
  readonly learned: LearnedAddressTable;
  /** Where its allowed TCP goes after the decision: the operator's proxy, or direct. */
  readonly upstream: UpstreamProxy | undefined;
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
  upstream: UpstreamProxy | undefined;
  /** The egress secret's digest: a credential is checked on every proxied request. */
  egressDigest: Buffer;
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
    upstream?: UpstreamProxy,
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
      upstream,
      egressDigest: secretDigest(identity.egressSecret),
    };
    this.byID.set(sandboxID, record);
    if (source !== undefined) this.bySource.set(source.text, record);
    this.emit({ type: 'published', sandboxID, policy, droppedLearned: 0 });
    return record;
  }

  /**
   * Swaps in a new policy. Learned addresses whose names the new policy neither allows nor
   * denies them for are dropped before anyone can use them again. The upstream proxy is replaced with it (absent:
   * direct), as a PUT network replaces the whole config.
   */
  publish(sandboxID: string, policy: Policy, upstream?: UpstreamProxy): boolean {
    const record = this.byID.get(sandboxID);
    if (record === undefined) return false;
    record.policy = policy;
    // The same proxy keeps its identity: tunnels through it stay (see TunnelRegistry).
    if (!sameUpstream(record.upstream, upstream)) record.upstream = upstream;
    // A name the policy denies its addresses for is kept too: forgotten, its addresses would open.
    const denies = (name: CanonicalName) => deniesLearnedName(policy, name);
    const droppedLearned = record.learned.retain(
      (name) => matchName(policy, name) !== undefined || denies(name),
      denies,
    );
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
    return matchesDigest(secret, record.egressDigest) ? record : undefined;
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

const sameUpstream = (a: UpstreamProxy | undefined, b: UpstreamProxy | undefined) =>
  a === b ||
  (a !== undefined &&
    b !== undefined &&
    a.address === b.address &&
    a.username === b.username &&
    a.password === b.password);
