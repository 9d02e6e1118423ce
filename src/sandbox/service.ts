import type { Logger } from 'pino';
import {
  type AddressPool,
  type EnforcementTable,
  KernelEnforcementError,
  type KernelEnforcer,
  type UpstreamProxy,
} from '../enforce/index.js';
import type { MoatMetrics } from '../metrics/index.js';
import {
  compilePolicy,
  type InternalDenyList,
  type IPAddress,
  parseIP,
  parseNetworkConfig,
  type Policy,
} from '../policy/index.js';
import {
  type SandboxEnvironment,
  type SandboxLimits,
  SandboxRefused,
  type SandboxRuntime,
} from '../runtime/index.js';
import {
  type JsonValue,
  type Store,
  type StoreChange,
  StoreUnavailableError,
} from '../store/index.js';
import { newSandboxID, newSecret, randomName } from './ids.js';
import { type Page, paginate } from './pages.js';
import {
  asJson,
  type NetworkSettings,
  readSandbox,
  readSnapshot,
  SANDBOXES,
  type SandboxRecord,
  type SandboxState,
  type SnapshotRecord,
  TEMPLATES,
} from './records.js';
import { networkRules, storedRules, storedUpstream, upstreamProxy } from './network-settings.js';
import {
  checkLifecycle,
  type CreateRequest,
  DEFAULT_TIMEOUT,
  type EgressRules,
  type ForkResult,
  MAX_FORKS,
  notFound,
  SandboxError,
  type SandboxQuery,
  type SnapshotQuery,
} from './requests.js';
import { ExpiryTimer, KeyedQueue } from './serial.js';
import {
  isBaseTemplate,
  resolveTemplate,
  snapshotNaming,
  templateCandidates,
  templateKey,
} from './templates.js';
import { UsageHistory, type UsageSample } from './usage-history.js';

/** What the lifecycle needs to know of the other nodes of a platform. */
export interface ClusterMembership {
  readonly self: string;
  /** The node has a live heartbeat. */
  alive(node: string): boolean;
  /** Tells the node hosting `sandboxID` that its network config changed in the store. */
  announce(change: { sandboxID: string; node: string; sentAt: number }): Promise<void>;
}

export interface SandboxServiceOptions {
  readonly store: Store;
  readonly runtime: SandboxRuntime;
  readonly table: EnforcementTable;
  readonly sources: AddressPool;
  /** Writes each sandbox's firewall in its network namespace (namespace enforcement only). */
  readonly kernel?: KernelEnforcer;
  /** Other nodes sharing the store; absent for a Moat on its own. */
  readonly cluster?: ClusterMembership;
  readonly internal: InternalDenyList;
  readonly metrics: MoatMetrics;
  readonly logger: Logger;
  readonly maxPolicyEntries: number;
  /**
   * Whether a stored secret has this name: `network.rules` may name only those. Absent, rules
   * that name a secret are refused.
   */
  readonly secretExists?: (name: string) => Promise<boolean>;
  /** The team namespace of named snapshots (`<namespace>/<alias>:<tag>`). */
  readonly namespace: string;
  /** Clock in milliseconds (tests pass a controllable one). */
  readonly now?: () => number;
  /** The variables every process of the sandbox gets: its `envVars`, proxy settings... */
  readonly environment: (record: SandboxRecord) => SandboxEnvironment;
  /** Limits of sandboxes made from the base template (snapshots carry their own). */
  readonly defaultLimits: SandboxLimits;
  /** How often metrics are sampled (milliseconds; default every 5 s). */
  readonly metricsIntervalMs?: number;
}

/**
 * The sandbox lifecycle: running -> paused -> running ... -> gone, with expiry. Every change of
 * one sandbox runs alone (KeyedQueue), is durable in the store before it is acknowledged, and is
 * published to the enforcement table before the call returns.
 */
export class SandboxService {
  private readonly queue = new KeyedQueue();
  private readonly expiry: ExpiryTimer;
  private readonly now: () => number;
  private readonly log: Logger;
  /** State of every sandbox this Moat holds, for the sandboxes gauge. */
  private readonly states = new Map<string, SandboxState>();
  /** Sandboxes left paused because they could not be set up again at start-up, and why. */
  private readonly unrestored = new Map<string, string>();
  private readonly usage: UsageHistory;

  /** The store, with "unreachable" answered as 503 on reads as on writes. */
  private readonly store: Pick<Store, 'get' | 'list'>;

  constructor(private readonly options: SandboxServiceOptions) {
    const unavailable = (error: unknown): never => {
      if (error instanceof StoreUnavailableError) throw new SandboxError(503, error.message);
      throw error;
    };
    this.store = {
      get: (collection, key) => options.store.get(collection, key).catch(unavailable),
      list: (collection) => options.store.list(collection).catch(unavailable),
    };
    this.now = options.now ?? Date.now;
    this.log = options.logger;
    this.expiry = new ExpiryTimer(this.now, () => void this.expireDue());
    this.usage = new UsageHistory(
      {
        running: () =>
          [...this.states].filter(([, state]) => state === 'running').map(([id]) => id),
        exists: (id) => this.states.has(id),
        read: async (id) => {
          const sandbox = options.runtime.sandbox(id);
          return sandbox && { usage: await sandbox.usage(), limits: sandbox.limits };
        },
      },
      this.now,
      options.metricsIntervalMs,
    );
    options.metrics.countSandboxesWith(() => {
      const counts = { running: 0, paused: 0 };
      for (const state of this.states.values()) counts[state]++;
      return counts;
    });
  }

  /**
   * Loads every stored sandbox: running ones are enforced again and their expiry rescheduled
   * (those already past it expire now), paused ones keep their addresses. Roots left behind by
   * a crash mid-create are removed.
   */
  async start(): Promise<void> {
    const { sources, runtime, table } = this.options;
    const records = (await this.store.list(SANDBOXES))
      .map(([key, value]) => this.read(value, key))
      .filter((record) => this.isLocal(record));
    // First clear what a previous run left (roots never recorded, processes that outlived it).
    const templates = new Set((await this.snapshots()).map((s) => s.snapshotID));
    for (const id of await runtime.reconcile(new Set(records.map((r) => r.sandboxID)), templates)) {
      this.log.warn({ sandboxID: id }, 'removed the root of a sandbox that was never created');
    }
    // Every address still valid is taken back first, so a new one never collides with it.
    const kept = records.map((record) => {
      const address = parseIP(record.sourceAddress);
      return address.ok && sources.reserve(address.value) ? address : undefined;
    });
    for (const [index, stored] of records.entries()) {
      let record = stored;
      let address = kept[index];
      if (address === undefined) {
        // Made under another pool or enforcement mode: its processes are gone anyway, so it
        // gets an address of this one (nothing outside Moat knows the old one).
        const fresh = sources.allocate();
        record = { ...record, sourceAddress: fresh.text };
        await this.write([{ collection: SANDBOXES, key: record.sandboxID, value: asJson(record) }]);
        this.log.warn(
          { sandboxID: record.sandboxID, from: stored.sourceAddress, to: fresh.text },
          `source address outside the pool ${sources.range.text}; given a new one`,
        );
        address = { ok: true, value: fresh };
      }
      this.states.set(record.sandboxID, record.state);
      // Paused as files only: nothing of it runs until it is resumed.
      if (record.state === 'paused' && record.filesOnly === true) continue;
      const policy = this.restoredPolicy(record);
      const problem = await this.bringBack(record, address.value, policy);
      // One sandbox that cannot come back must not keep the others (and Moat) down.
      if (problem !== undefined) {
        await this.leavePaused(record, problem);
        continue;
      }
      if (record.state === 'paused') continue;
      table.register(
        record.sandboxID,
        { sourceAddress: address.value, egressSecret: record.egressSecret },
        policy,
        storedUpstream(record),
      );
      this.expiry.set(record.sandboxID, record.endAt);
    }
    await this.expireDue();
    this.usage.start();
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
    const { runtime, kernel } = this.options;
    try {
      await runtime.restore(
        record.sandboxID,
        this.options.environment(record),
        address.text,
        this.limitsOf(record),
      );
      await kernel?.install(record.sandboxID, address, policy, storedUpstream(record));
      this.unrestored.delete(record.sandboxID);
      return undefined;
    } catch (error) {
      await runtime.release(record.sandboxID).catch(() => {});
      return (error as Error).message;
    }
  }

  /**
   * A sandbox that could not be set up again is paused (nothing of it runs, and it is out of
   * the enforcement table) with its files kept; resuming it tries again.
   */
  private async leavePaused(record: SandboxRecord, problem: string): Promise<void> {
    this.unrestored.set(record.sandboxID, problem);
    this.log.error(
      { sandboxID: record.sandboxID, err: problem },
      'could not restore this sandbox; it is left paused with its files, and resuming it tries again',
    );
    if (record.state === 'paused') return;
    const next: SandboxRecord = { ...record, state: 'paused', endAt: this.now() };
    await this.write([{ collection: SANDBOXES, key: record.sandboxID, value: asJson(next) }]);
    this.states.set(record.sandboxID, 'paused');
    this.transition(next, 'pause', { reason: 'restore failed' });
  }

  /** Stops the expiry timer and waits for transitions in flight. */
  async stop(): Promise<void> {
    this.expiry.stop();
    await this.usage.stop();
    await this.queue.idle();
  }

  /**
   * A stored config was valid when stored; if this Moat's limits have since changed and it no
   * longer parses, the sandbox is enforced deny-all rather than left open (fail closed).
   */
  private restoredPolicy(record: SandboxRecord): Policy {
    try {
      return this.compile(networkRules(record.network));
    } catch (error) {
      this.log.error(
        { sandboxID: record.sandboxID, err: (error as Error).message },
        'stored network config no longer compiles; enforcing deny-all for this sandbox',
      );
      return this.compile({ denyOut: ['0.0.0.0/0', '::/0'] });
    }
  }

  private compile(rules: EgressRules): Policy {
    const parsed = parseNetworkConfig(rules, { maxEntries: this.options.maxPolicyEntries });
    if (!parsed.ok) {
      throw new SandboxError(400, parsed.errors.map((problem) => problem.message).join('; '));
    }
    return compilePolicy(parsed.value, this.options.internal);
  }

  /** Every secret the policy's rules name must be stored (a 400 naming key, header and secret). */
  private async checkSecrets(policy: Policy): Promise<void> {
    const exists = this.options.secretExists ?? (async () => false);
    for (const transform of policy.rules.transforms) {
      for (const header of transform.headers) {
        for (const part of header.value) {
          if (!('secret' in part) || (await exists(part.secret))) continue;
          throw new SandboxError(
            400,
            `network.rules[${JSON.stringify(transform.ruleKey)}] header ${JSON.stringify(header.name)} names the secret ${JSON.stringify(part.secret)}, which does not exist (create it with POST /secrets first)`,
          );
        }
      }
    }
  }

  async create(request: CreateRequest): Promise<SandboxRecord> {
    const { sources } = this.options;
    const timeout = request.timeout ?? DEFAULT_TIMEOUT;
    const network: NetworkSettings = {
      allowOut: request.network?.allowOut ?? [],
      denyOut: request.network?.denyOut ?? [],
      allowInternetAccess: request.allow_internet_access ?? null,
      allowPublicTraffic: request.network?.allowPublicTraffic ?? true,
      maskRequestHost: request.network?.maskRequestHost ?? null,
      egressProxy: request.network?.egressProxy ?? null,
      httpsPorts: request.network?.httpsPorts ?? [],
      ...storedRules(request.network?.rules),
    };
    const policy = this.compile(networkRules(network));
    await this.checkSecrets(policy);
    // A proxy that cannot be used is refused before anything is made.
    upstreamProxy(network.egressProxy);
    const secure = request.secure ?? false;
    if (!network.allowPublicTraffic && !secure) {
      throw new SandboxError(
        400,
        'network.allowPublicTraffic false requires secure: true (the traffic token protects a secured sandbox)',
      );
    }
    const lifecycle = checkLifecycle(request);
    const template = await resolveTemplate(this.store, this.options.namespace, request.templateID);
    const limits = template.limits ?? this.options.defaultLimits;
    const now = this.now();
    const source = sources.allocate();
    const record: SandboxRecord = {
      sandboxID: newSandboxID(),
      templateID: template.id,
      alias: template.alias,
      state: 'running',
      startedAt: now,
      endAt: now + timeout * 1000,
      ...lifecycle,
      secure,
      envdAccessToken: secure ? newSecret() : null,
      trafficAccessToken: network.allowPublicTraffic ? null : newSecret(),
      egressSecret: newSecret(),
      sourceAddress: source.text,
      metadata: request.metadata ?? {},
      envVars: request.envVars ?? {},
      network,
      limits,
      ...(this.options.cluster ? { node: this.options.cluster.self } : {}),
    };
    // Under the template's key so that deleting the template cannot race the copy.
    await this.queue.run(templateKey(template.id), () =>
      this.launch(record, template.id, source, policy),
    );
    this.transition(record, 'create', { templateID: record.templateID, timeout });
    // timeout 0 means "expire now": the sandbox is made, then expires on the spot.
    if (timeout === 0) await this.expireDue();
    return record;
  }

  /**
   * Makes the sandbox of `record` from the files of `templateKey`, with its firewall, and
   * records and enforces it. Nothing of it is left when that fails.
   */
  private async launch(
    record: SandboxRecord,
    templateKey: string,
    source: IPAddress,
    policy: Policy,
  ): Promise<void> {
    const { runtime, sources, table } = this.options;
    const id = record.sandboxID;
    const upstream = storedUpstream(record);
    try {
      await runtime.create(
        id,
        templateKey,
        this.options.environment(record),
        source.text,
        this.limitsOf(record),
      );
      // Fail closed: a sandbox whose firewall cannot be written is not started.
      await this.options.kernel?.install(id, source, policy, upstream);
      await this.write([{ collection: SANDBOXES, key: id, value: asJson(record) }]);
    } catch (error) {
      sources.release(source);
      await runtime.destroy(id).catch(() => undefined);
      if (error instanceof KernelEnforcementError || error instanceof SandboxRefused)
        throw new SandboxError(503, `the sandbox was not created: ${error.message}`);
      throw error;
    }
    table.register(
      id,
      { sourceAddress: source, egressSecret: record.egressSecret },
      policy,
      upstream,
    );
    this.expiry.set(id, record.endAt);
    this.states.set(id, 'running');
  }

  /**
   * Makes `count` sandboxes from one copy of the sandbox's files, taken while it is frozen for
   * a moment (it keeps its ID, expiry and processes). Each fork gets the source's network
   * config, lifecycle, metadata, environment and limits, fresh tokens and no processes. Forks
   * succeed or fail one by one; the copy is made once.
   */
  async fork(sandboxID: string, count: number, seconds: number): Promise<ForkResult[]> {
    if (!Number.isSafeInteger(count) || count < 1 || count > MAX_FORKS) {
      throw new SandboxError(400, `count must be from 1 to ${MAX_FORKS} (got ${count})`);
    }
    const copy = `fork-${randomName(20)}`;
    const parent = await this.queue.run(sandboxID, async () => {
      const record = await this.get(sandboxID);
      await this.options.runtime.snapshot(sandboxID, copy);
      return record;
    });
    const policy = this.restoredPolicy(parent);
    const results: ForkResult[] = [];
    try {
      // One at a time: each is a copy-on-write mount of the same layer, cheap next to a boot.
      for (let i = 0; i < count; i++)
        results.push(await this.forkOne(parent, copy, seconds, policy));
    } finally {
      // Each fork's own record names the copy's layer; the template name is not needed any more.
      await this.options.runtime.removeTemplate(copy).catch((error: Error) => {
        this.log.warn({ sandboxID, err: error.message }, 'could not remove a fork’s copy');
      });
    }
    return results;
  }

  private async forkOne(
    parent: SandboxRecord,
    copy: string,
    seconds: number,
    policy: Policy,
  ): Promise<ForkResult> {
    try {
      const now = this.now();
      const source = this.options.sources.allocate();
      const record: SandboxRecord = {
        ...parent,
        sandboxID: newSandboxID(),
        state: 'running',
        startedAt: now,
        endAt: now + seconds * 1000,
        filesOnly: false,
        envdAccessToken: parent.secure ? newSecret() : null,
        trafficAccessToken: parent.network.allowPublicTraffic ? null : newSecret(),
        egressSecret: newSecret(),
        sourceAddress: source.text,
        ...(this.options.cluster ? { node: this.options.cluster.self } : {}),
      };
      await this.launch(record, copy, source, policy);
      this.transition(record, 'fork', { from: parent.sandboxID, timeout: seconds });
      if (seconds === 0) await this.expireDue();
      return record;
    } catch (error) {
      this.log.error({ sandboxID: parent.sandboxID, err: (error as Error).message }, 'fork failed');
      // As the API answers any error it did not expect: the details are in the log only.
      return error instanceof SandboxError
        ? error
        : new SandboxError(500, 'internal error; the server log has the details');
    }
  }

  /** Samples of a sandbox's use from `from` to `to` (milliseconds), oldest first. */
  async metrics(sandboxID: string, from?: number, to?: number): Promise<UsageSample[]> {
    await this.get(sandboxID);
    return this.usage.samples(sandboxID, from, to);
  }

  /** The newest sample of each of these sandboxes that has one. */
  latestMetrics(sandboxIDs: readonly string[]): Map<string, UsageSample> {
    const latest = new Map<string, UsageSample>();
    for (const id of sandboxIDs) {
      const sample = this.usage.latest(id);
      if (sample !== undefined) latest.set(id, sample);
    }
    return latest;
  }

  async get(sandboxID: string): Promise<SandboxRecord> {
    const stored = await this.store.get(SANDBOXES, sandboxID);
    if (stored === undefined) throw notFound(sandboxID);
    const record = this.read(stored, sandboxID);
    // A sandbox whose node stopped sending heartbeats is gone with it.
    if (!this.onLiveNode(record)) throw notFound(sandboxID);
    return record;
  }

  /** The sandbox's record, or undefined when there is none; a store outage still throws. */
  async find(sandboxID: string): Promise<SandboxRecord | undefined> {
    return this.get(sandboxID).catch((error: unknown) => {
      if (error instanceof SandboxError && error.status === 404) return undefined;
      throw error;
    });
  }

  /** The node that hosts the sandbox (this one for a Moat on its own). */
  async nodeOf(sandboxID: string): Promise<string> {
    const record = await this.get(sandboxID);
    return record.node ?? this.options.cluster?.self ?? '';
  }

  async list(query: SandboxQuery): Promise<Page<SandboxRecord>> {
    const records = (await this.store.list(SANDBOXES))
      .map(([key, value]) => this.read(value, key))
      .filter((record) => this.onLiveNode(record));
    const matching = records.filter(
      (r) =>
        query.states.includes(r.state) &&
        (query.template === undefined || r.templateID === query.template) &&
        (query.startedAfter === undefined || r.startedAt >= query.startedAfter) &&
        Object.entries(query.metadata).every(([key, value]) => r.metadata[key] === value),
    );
    return paginate(matching, (r) => [r.startedAt, r.sandboxID], query);
  }

  /** Kills a running sandbox or removes a paused one. */
  kill(sandboxID: string): Promise<void> {
    return this.queue.run(sandboxID, async () => {
      const record = await this.get(sandboxID);
      await this.remove(record, 'kill');
    });
  }

  /** The sandbox expires `seconds` from now; may shorten. Only for running sandboxes. */
  setTimeout(sandboxID: string, seconds: number): Promise<SandboxRecord> {
    return this.change(sandboxID, 'running', async (record) =>
      this.extend(record, this.now() + seconds * 1000, 'timeout'),
    );
  }

  /** Extends the expiry to at least `seconds` from now; never shortens. */
  refresh(sandboxID: string, seconds: number): Promise<SandboxRecord> {
    return this.change(sandboxID, 'running', async (record) =>
      this.extend(record, Math.max(record.endAt, this.now() + seconds * 1000), 'refresh'),
    );
  }

  /**
   * Pauses a running sandbox: with `memory` its processes are frozen and go on at resume;
   * without, they are ended and only its files are kept (resuming cold-boots it).
   */
  pause(sandboxID: string, memory = true): Promise<SandboxRecord> {
    return this.queue.run(sandboxID, async () => {
      const record = await this.get(sandboxID);
      if (record.state === 'paused') {
        throw new SandboxError(409, `Sandbox "${sandboxID}" is already paused`);
      }
      return this.pauseNow(record, 'pause', memory);
    });
  }

  /** Deprecated resume: a running sandbox is a conflict. */
  resume(sandboxID: string, seconds: number): Promise<SandboxRecord> {
    return this.queue.run(sandboxID, async () => {
      const record = await this.get(sandboxID);
      if (record.state === 'running') {
        throw new SandboxError(409, `Sandbox "${sandboxID}" is already running`);
      }
      return this.resumeNow(record, seconds, 'resume');
    });
  }

  /**
   * Resumes a paused sandbox (`resumed: true`), or extends a running one without shortening
   * its expiry. `memory: false` resumes it from its files only (a cold boot), even when its
   * processes were kept.
   */
  connect(
    sandboxID: string,
    seconds: number,
    memory = true,
  ): Promise<{ record: SandboxRecord; resumed: boolean }> {
    return this.queue.run(sandboxID, async () => {
      const record = await this.get(sandboxID);
      if (record.state === 'paused') {
        const resumed = await this.resumeNow(record, seconds, 'connect', !memory);
        return { record: resumed, resumed: true };
      }
      const endAt = Math.max(record.endAt, this.now() + seconds * 1000);
      return { record: await this.extend(record, endAt, 'connect'), resumed: false };
    });
  }

  /**
   * Traffic arrived for the sandbox (ingress, sandbox API): a paused sandbox with autoResume is
   * resumed for the default timeout. Returns the sandbox as it now is.
   */
  wake(sandboxID: string): Promise<SandboxRecord> {
    return this.queue.run(sandboxID, async () => {
      const record = await this.get(sandboxID);
      // Paused as files only, it must be resumed explicitly: traffic would meet a cold boot.
      if (record.state === 'running' || !record.autoResume || record.filesOnly === true) {
        return record;
      }
      return this.resumeNow(record, DEFAULT_TIMEOUT, 'autoResume');
    });
  }

  /** Replaces the egress rules: validated, stored, compiled and published before it returns. */
  updateNetwork(sandboxID: string, rules: EgressRules): Promise<SandboxRecord> {
    const { metrics } = this.options;
    return this.change(sandboxID, 'running', async (record) => {
      let policy: Policy;
      let upstream: UpstreamProxy | undefined;
      // The proxy is no part of the policy (which decides), but of where allowed flows go.
      const { egressProxy, ...policyRules } = rules;
      try {
        policy = this.compile(policyRules);
        upstream = upstreamProxy(egressProxy);
        await this.checkSecrets(policy);
      } catch (error) {
        metrics.policyPublishes.inc({ result: 'invalid' });
        throw error;
      }
      const next: SandboxRecord = {
        ...record,
        network: {
          ...record.network,
          allowOut: rules.allowOut ?? [],
          denyOut: rules.denyOut ?? [],
          allowInternetAccess: rules.allow_internet_access ?? null,
          egressProxy: egressProxy ?? null,
          // Replaced like every other field: a body without rules clears them.
          rules: undefined,
          ...storedRules(rules.rules),
        },
      };
      try {
        await this.write([{ collection: SANDBOXES, key: sandboxID, value: asJson(next) }]);
      } catch (error) {
        metrics.policyPublishes.inc({ result: 'failed' });
        throw error;
      }
      if (!this.isLocal(next)) {
        // Stored; the node that hosts it hears of it on the cluster channel and enforces it.
        await this.options
          .cluster!.announce({
            sandboxID,
            node: next.node!,
            sentAt: Date.now(),
          })
          .catch((error: Error) => {
            metrics.policyPublishes.inc({ result: 'failed' });
            throw new SandboxError(
              503,
              `the new network config is stored, but the node ${next.node} that hosts the sandbox could not be told (${error.message}); it applies it when its connection to the store returns`,
            );
          });
        metrics.policyPublishes.inc({ result: 'applied' });
        this.transition(next, 'network', { node: next.node });
        return next;
      }
      this.options.table.publish(sandboxID, policy, upstream);
      try {
        await this.options.kernel?.enforce(sandboxID, policy, upstream);
      } catch (error) {
        metrics.policyPublishes.inc({ result: 'failed' });
        this.log.error({ sandboxID, err: (error as Error).message }, 'firewall update failed');
        throw new SandboxError(
          503,
          `the new network config is stored and Moat's DNS and proxy enforce it, but ${(error as Error).message}`,
        );
      }
      metrics.policyPublishes.inc({ result: 'applied' });
      this.transition(next, 'network', {
        allowOut: next.network.allowOut.length,
        denyOut: next.network.denyOut.length,
      });
      return next;
    });
  }

  /**
   * Enforces the stored network config of a sandbox this node hosts (another node stored it and
   * said so on the cluster channel). Returns false when there was nothing to do.
   */
  reload(sandboxID: string): Promise<boolean> {
    return this.queue.run(sandboxID, async () => {
      const record = await this.find(sandboxID);
      if (record === undefined || record.state !== 'running' || !this.isLocal(record)) {
        return false;
      }
      const policy = this.restoredPolicy(record);
      const upstream = storedUpstream(record);
      if (!this.options.table.publish(sandboxID, policy, upstream)) return false;
      await this.options.kernel?.enforce(sandboxID, policy, upstream).catch((error: Error) => {
        this.log.error({ sandboxID, err: error.message }, 'firewall update failed');
      });
      this.transition(record, 'network', { from: 'cluster' });
      return true;
    });
  }

  /**
   * After the store was out of reach: enforces again what it holds for every running sandbox
   * here (changes announced meanwhile were missed); sandboxes whose record is gone are ended.
   */
  async reloadAll(): Promise<void> {
    for (const [sandboxID, state] of [...this.states]) {
      if (state !== 'running') continue;
      const stored = await this.store.get(SANDBOXES, sandboxID);
      if (stored === undefined) {
        this.log.warn({ sandboxID }, 'the store no longer holds this sandbox; ending it');
        this.options.table.remove(sandboxID);
        this.expiry.delete(sandboxID);
        this.states.delete(sandboxID);
        await this.options.runtime.destroy(sandboxID);
        continue;
      }
      await this.reload(sandboxID);
    }
  }

  /** Removes the records of sandboxes whose node is gone (its heartbeat lapsed). */
  async forgetGoneNodes(): Promise<string[]> {
    const cluster = this.options.cluster;
    if (cluster === undefined) return [];
    const gone = (await this.store.list(SANDBOXES))
      .map(([key, value]) => this.read(value, key))
      .filter((record) => !this.onLiveNode(record));
    if (gone.length === 0) return [];
    await this.write(gone.map((r) => ({ collection: SANDBOXES, key: r.sandboxID, value: null })));
    for (const record of gone) {
      this.log.warn(
        { sandboxID: record.sandboxID, node: record.node },
        'removed a sandbox whose node is gone',
      );
    }
    return gone.map((r) => r.sandboxID);
  }

  /** Sandboxes this node hosts now. */
  get hostedCount(): number {
    return this.states.size;
  }

  private isLocal(record: SandboxRecord): boolean {
    const cluster = this.options.cluster;
    return cluster === undefined || record.node === undefined || record.node === cluster.self;
  }

  private onLiveNode(record: SandboxRecord): boolean {
    return this.isLocal(record) || this.options.cluster!.alive(record.node!);
  }

  /** Copies the sandbox's root into a new template; the sandbox keeps running. */
  createSnapshot(sandboxID: string, name: string | undefined): Promise<SnapshotRecord> {
    const naming = snapshotNaming(this.options.namespace, name);
    return this.queue.run(sandboxID, async () => {
      const record = await this.get(sandboxID);
      const snapshot: SnapshotRecord = {
        ...naming,
        sandboxID,
        createdAt: this.now(),
        limits: this.limitsOf(record),
        ...(this.options.cluster ? { node: this.options.cluster.self } : {}),
      };
      await this.queue.run(templateKey(snapshot.snapshotID), async () => {
        await this.options.runtime.snapshot(sandboxID, snapshot.snapshotID);
        await this.write([
          { collection: TEMPLATES, key: snapshot.snapshotID, value: asJson(snapshot) },
        ]);
      });
      this.transition(record, 'snapshot', { snapshotID: snapshot.snapshotID });
      return snapshot;
    });
  }

  async listSnapshots(query: SnapshotQuery): Promise<Page<SnapshotRecord>> {
    const wanted =
      query.name === undefined ? undefined : snapshotNaming(this.options.namespace, query.name);
    const snapshots = (await this.snapshots()).filter(
      (s) =>
        (query.sandboxID === undefined || s.sandboxID === query.sandboxID) &&
        (wanted === undefined ||
          s.snapshotID === wanted.snapshotID ||
          (query.name?.includes(':') !== true && s.templateID === wanted.templateID)),
    );
    return paginate(snapshots, (s) => [s.createdAt, s.snapshotID], { ...query, order: 'desc' });
  }

  snapshots(): Promise<SnapshotRecord[]> {
    return this.options.store
      .list(TEMPLATES)
      .then((entries) => entries.map(([key, value]) => readSnapshot(value, key)));
  }

  /**
   * Deletes a snapshot (by its ID, or every tag of a template ID). Refused while a sandbox made
   * from it still exists.
   */
  async deleteTemplate(id: string): Promise<void> {
    if (isBaseTemplate(id)) {
      throw new SandboxError(400, `template "${id}" is built in and cannot be deleted`);
    }
    // A template ID without a tag names every tag of that template.
    const candidates = new Set(templateCandidates(this.options.namespace, id));
    const templates = new Set(id.includes(':') ? [] : [id, `${this.options.namespace}/${id}`]);
    const matching = (await this.snapshots()).filter(
      (s) => candidates.has(s.snapshotID) || templates.has(s.templateID),
    );
    if (matching.length === 0) {
      throw new SandboxError(404, `template "${id}" doesn't exist or you don't have access to it`);
    }
    for (const snapshot of matching) {
      await this.queue.run(templateKey(snapshot.snapshotID), async () => {
        const users = (await this.store.list(SANDBOXES))
          .map(([k, value]) => this.read(value, k))
          .filter((r) => r.templateID === snapshot.snapshotID)
          .map((r) => r.sandboxID);
        if (users.length > 0) {
          throw new SandboxError(
            409,
            `template "${snapshot.snapshotID}" is used by sandbox${users.length > 1 ? 'es' : ''} ${users.join(', ')}; kill ${users.length > 1 ? 'them' : 'it'} first`,
          );
        }
        await this.write([{ collection: TEMPLATES, key: snapshot.snapshotID, value: null }]);
        await this.options.runtime.removeTemplate(snapshot.snapshotID);
        this.log.info({ snapshotID: snapshot.snapshotID }, 'template deleted');
      });
    }
  }

  /**
   * Expires every running sandbox past its deadline: pause when autoPause, else kill. Resolves
   * once this sweep and any sweep already running (the timer's) are done, so a caller never
   * returns while a due sandbox is still enforced as running.
   */
  expireDue(): Promise<void> {
    const sweep = Promise.all(
      this.expiry.takeDue().map((id) =>
        this.queue.run(id, async () => {
          const stored = await this.store.get(SANDBOXES, id);
          if (stored === undefined) return;
          const record = this.read(stored, id);
          if (record.state !== 'running') return;
          if (record.endAt > this.now()) {
            this.expiry.set(id, record.endAt);
            return;
          }
          try {
            if (record.autoPause) {
              await this.pauseNow(record, 'expire', record.autoPauseMemory ?? true);
            } else await this.remove(record, 'expire');
          } catch (error) {
            // Keep it due: the next sweep tries again (a store outage must not lose expiries).
            this.log.error({ sandboxID: id, err: (error as Error).message }, 'expiry failed');
            this.expiry.set(id, this.now() + 1000);
          }
        }),
      ),
    );
    this.sweeps = Promise.all([this.sweeps, sweep]).then(() => undefined);
    return this.sweeps;
  }

  private sweeps: Promise<void> = Promise.resolve();

  // -- transitions; each runs inside the sandbox's queue slot --

  private async change(
    sandboxID: string,
    state: SandboxState,
    apply: (record: SandboxRecord) => Promise<SandboxRecord>,
  ): Promise<SandboxRecord> {
    return this.queue.run(sandboxID, async () => {
      const record = await this.get(sandboxID);
      // A sandbox not in the required state is "not found" to these calls (wire-compat.md).
      if (record.state !== state) throw notFound(sandboxID);
      return apply(record);
    });
  }

  private async extend(record: SandboxRecord, endAt: number, what: string): Promise<SandboxRecord> {
    const next = { ...record, endAt };
    await this.write([{ collection: SANDBOXES, key: record.sandboxID, value: asJson(next) }]);
    this.expiry.set(record.sandboxID, endAt);
    this.transition(next, what, { endAt: new Date(endAt).toISOString() });
    return next;
  }

  private async pauseNow(
    record: SandboxRecord,
    why: string,
    memory: boolean,
  ): Promise<SandboxRecord> {
    const { runtime } = this.options;
    const next: SandboxRecord = {
      ...record,
      state: 'paused',
      endAt: this.now(),
      filesOnly: !memory,
    };
    // Files only: its processes end and its namespace goes; its files stay for a cold boot.
    if (memory) await runtime.pause(record.sandboxID);
    else await runtime.release(record.sandboxID);
    try {
      await this.write([{ collection: SANDBOXES, key: record.sandboxID, value: asJson(next) }]);
    } catch (error) {
      if (memory) await runtime.resume(record.sandboxID);
      else await this.coldBoot(record);
      throw error;
    }
    // A paused sandbox sends nothing; dropping it from the table makes that certain.
    this.options.table.remove(record.sandboxID);
    this.expiry.delete(record.sandboxID);
    this.states.set(record.sandboxID, 'paused');
    this.transition(next, why === 'expire' ? 'autoPause' : 'pause', { memory });
    return next;
  }

  /**
   * Starts a sandbox again from its files (its processes are gone); a failure leaves it
   * paused, to be tried again at the next resume.
   */
  private async coldBoot(record: SandboxRecord): Promise<void> {
    const address = parseIP(record.sourceAddress);
    if (!address.ok) throw new SandboxError(500, address.error);
    const problem = await this.bringBack(record, address.value, this.restoredPolicy(record));
    if (problem !== undefined) {
      this.unrestored.set(record.sandboxID, problem);
      throw new SandboxError(
        503,
        `sandbox ${record.sandboxID} could not be restored on this host: ${problem}; it stays paused with its files`,
      );
    }
  }

  private async resumeNow(
    record: SandboxRecord,
    seconds: number,
    why: string,
    fromFiles = false,
  ): Promise<SandboxRecord> {
    const now = this.now();
    const next: SandboxRecord = {
      ...record,
      state: 'running',
      endAt: now + seconds * 1000,
      filesOnly: false,
    };
    const policy = this.restoredPolicy(record);
    const address = parseIP(record.sourceAddress);
    if (!address.ok) throw new SandboxError(500, address.error);
    const frozen = record.filesOnly !== true && !this.unrestored.has(record.sandboxID);
    // Asked to start from its files: its frozen processes are ended first.
    if (frozen && fromFiles) await this.options.runtime.release(record.sandboxID);
    if (!frozen || fromFiles) await this.coldBoot(record);
    await this.write([{ collection: SANDBOXES, key: record.sandboxID, value: asJson(next) }]);
    const upstream = storedUpstream(record);
    this.options.table.register(
      record.sandboxID,
      { sourceAddress: address.value, egressSecret: record.egressSecret },
      policy,
      upstream,
    );
    // Addresses learned before the pause were forgotten with it; the firewall forgets them too.
    await this.options.kernel?.enforce(record.sandboxID, policy, upstream).catch((error: Error) => {
      this.log.error({ sandboxID: record.sandboxID, err: error.message }, 'firewall update failed');
    });
    await this.options.runtime.resume(record.sandboxID);
    this.expiry.set(record.sandboxID, next.endAt);
    this.states.set(record.sandboxID, 'running');
    this.transition(next, why, { endAt: new Date(next.endAt).toISOString() });
    return next;
  }

  private async remove(record: SandboxRecord, why: string): Promise<void> {
    await this.write([{ collection: SANDBOXES, key: record.sandboxID, value: null }]);
    this.unrestored.delete(record.sandboxID);
    this.options.table.remove(record.sandboxID);
    this.expiry.delete(record.sandboxID);
    this.states.delete(record.sandboxID);
    this.usage.forget(record.sandboxID);
    await this.options.runtime.destroy(record.sandboxID);
    const address = parseIP(record.sourceAddress);
    if (address.ok) this.options.sources.release(address.value);
    this.transition(record, why === 'expire' ? 'expire' : 'kill', {});
  }

  private async write(changes: StoreChange[]): Promise<void> {
    try {
      await this.options.store.commit(changes);
    } catch (error) {
      this.options.metrics.storeErrors.inc();
      if (error instanceof StoreUnavailableError) throw new SandboxError(503, error.message);
      throw error;
    }
  }

  private transition(record: SandboxRecord, what: string, details: object): void {
    this.options.metrics.sandboxTransitions.inc({ transition: what });
    this.log.info({ sandboxID: record.sandboxID, transition: what, ...details }, 'sandbox ' + what);
  }

  // -- templates and snapshot names --

  /**
   * The node whose data folder holds a template's files: a sandbox made from a snapshot must be
   * made there. Undefined for the built-in template (every node has it) and a Moat on its own.
   */
  async templateNode(templateID: string): Promise<string | undefined> {
    return (await resolveTemplate(this.store, this.options.namespace, templateID)).node;
  }

  /** A sandbox's limits: its record's, or (for records from before limits) the defaults. */
  private limitsOf(record: SandboxRecord): SandboxLimits {
    return record.limits ?? this.options.defaultLimits;
  }

  /** A stored sandbox record, with the default limits where it has none. */
  private read(value: JsonValue, key: string): SandboxRecord {
    const record = readSandbox(value, key);
    return record.limits ? record : { ...record, limits: this.options.defaultLimits };
  }
}
