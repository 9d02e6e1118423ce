import type { Logger } from 'pino';
import {
  type AddressPool,
  type Bandwidth,
  type EnforcementTable,
  KernelEnforcementError,
  type KernelEnforcer,
} from '../enforce/index.js';
import type { MoatMetrics } from '../metrics/index.js';
import {
  type InternalDenyList,
  type IPAddress,
  type NetworkMode,
  parseIP,
  type Policy,
  type PresetTable,
  type PresetUse,
} from '../policy/index.js';
import {
  AdoptRefused,
  type AdoptRequest,
  type SandboxEnvironment,
  type SandboxLimits,
  SandboxRefused,
  type SandboxRuntime,
  uplinkOf,
} from '../runtime/index.js';
import type { Store } from '../store/index.js';
import { ClusterReload } from './cluster-reload.js';
import { fork } from './fork.js';
import { newSandboxID, newSecret } from './ids.js';
import { type ClusterMembership, madeHere, onLiveNode } from './membership.js';
import { type Page, paginate } from './pages.js';
import type { NetworkSettings, SandboxRecord, SandboxState, SnapshotRecord } from './records.js';
import {
  bandwidthOf,
  networkRules,
  storedRules,
  storedUpstream,
  upstreamProxy,
} from './network-settings.js';
import { updateNetwork } from './network-update.js';
import { adoptionOf, NO_EXPIRY, refuseNetworkOnly } from './network-only.js';
import type { LifecycleParts } from './parts.js';
import { SandboxPolicies } from './policies.js';
import { acceptIam, checkIdentityTokens } from './iam.js';
import {
  checkLifecycle,
  type CreateRequest,
  DEFAULT_TIMEOUT,
  type EgressRules,
  type ForkResult,
  notFound,
  SandboxError,
  type SandboxQuery,
  type SnapshotQuery,
  unlessNotFound,
} from './requests.js';
import { SandboxRecovery } from './restore.js';
import { SandboxStore } from './sandbox-store.js';
import { ExpiryTimer, KeyedQueue } from './serial.js';
import { SnapshotCatalog } from './snapshots.js';
import { resolveTemplate, templateKey } from './templates.js';
import { UsageHistory, type UsageSample } from './usage-history.js';

export interface SandboxServiceOptions {
  readonly store: Store;
  readonly runtime: SandboxRuntime;
  readonly table: EnforcementTable;
  readonly sources: AddressPool;
  /** Writes each sandbox's firewall in its network namespace (namespace enforcement only). */
  readonly kernel?: KernelEnforcer;
  /** The operator's bandwidth for sandboxes whose `network.bandwidth` leaves a direction out. */
  readonly bandwidthDefaults: Bandwidth;
  /** The mode of a sandbox created without `network.mode` (kept with it from then on). */
  readonly defaultMode: NetworkMode;
  /** Other nodes sharing the store; absent for a Moat on its own. */
  readonly cluster?: ClusterMembership;
  readonly internal: InternalDenyList;
  readonly metrics: MoatMetrics;
  readonly logger: Logger;
  readonly maxPolicyEntries: number;
  /** What `preset:NAME` in allowOut may name. */
  readonly presets: PresetTable;
  /**
   * Whether a stored secret has this name: `network.rules` may name only those. Absent, rules
   * that name a secret are refused.
   */
  readonly secretExists?: (name: string) => Promise<boolean>;
  /** Workload identity is enabled (the operator set its issuer): `iam.tokens` may be given. */
  readonly identity?: boolean;
  /** The team namespace of named snapshots (`<team namespace>/<alias>:<tag>`). */
  readonly teamNamespace: string;
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
 * published to the enforcement table before the call returns. Restart recovery (restore.ts),
 * snapshots (snapshots.ts), forks (fork.ts), network updates (network-update.ts) and changes
 * other nodes stored (cluster-reload.ts) live in files of their own, on the same queue and
 * records (parts.ts).
 */
export class SandboxService {
  private readonly queue = new KeyedQueue();
  private readonly expiry: ExpiryTimer;
  private readonly now: () => number;
  private readonly log: Logger;
  /** State of every sandbox this Moat holds, for the sandboxes gauge. */
  private readonly states = new Map<string, SandboxState>();
  private readonly usage: UsageHistory;
  private readonly records: SandboxStore;
  private readonly policies: SandboxPolicies;
  /** What the pieces of the lifecycle in files of their own share. */
  private readonly parts: LifecycleParts;
  private readonly recovery: SandboxRecovery;
  private readonly snapshotCatalog: SnapshotCatalog;
  private readonly clusterReload: ClusterReload;

  constructor(private readonly options: SandboxServiceOptions) {
    const { runtime } = options;
    this.now = options.now ?? Date.now;
    this.log = options.logger;
    this.records = new SandboxStore(options.store, options.metrics, options.defaultLimits);
    this.policies = new SandboxPolicies(options);
    const parts: LifecycleParts = {
      ...options,
      queue: this.queue,
      records: this.records,
      policies: this.policies,
      now: this.now,
      transition: (record, what, details) => this.transition(record, what, details),
    };
    this.parts = parts;
    this.recovery = new SandboxRecovery({
      ...parts,
      adopt: (record, running) => this.adopt(record, running),
    });
    this.snapshotCatalog = new SnapshotCatalog({ ...parts, get: (id) => this.get(id) });
    this.clusterReload = new ClusterReload({
      ...parts,
      find: (id) => this.find(id),
      running: () => this.running(),
      end: (id) => this.unhost(id),
    });
    this.expiry = new ExpiryTimer(this.now, () => void this.expireDue());
    this.usage = new UsageHistory(
      {
        running: () => this.running(),
        exists: (id) => this.states.has(id),
        read: async (id) => {
          const sandbox = runtime.sandbox(id);
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
   * Loads every stored sandbox of this node (restore.ts), then expires those already past their
   * deadline and starts sampling their use.
   */
  async start(): Promise<void> {
    await this.recovery.restoreAll();
    await this.expireDue();
    this.usage.start();
  }

  /** Stops the expiry timer and waits for transitions in flight. */
  async stop(): Promise<void> {
    this.expiry.stop();
    await this.usage.stop();
    await this.queue.idle();
  }

  async create(request: CreateRequest): Promise<SandboxRecord> {
    const { sources, runtime } = this.options;
    const adopt = adoptionOf(request, {
      mode: runtime.enforcement,
      reason: runtime.enforcementReason,
    });
    // A network-only sandbox without a timeout never expires: its namespace's owner ends it.
    const timeout = request.timeout ?? (adopt ? undefined : DEFAULT_TIMEOUT);
    const network: NetworkSettings = {
      allowOut: request.network?.allowOut ?? [],
      denyOut: request.network?.denyOut ?? [],
      allowInternetAccess: request.allow_internet_access ?? null,
      allowPublicTraffic: request.network?.allowPublicTraffic ?? true,
      maskRequestHost: request.network?.maskRequestHost ?? null,
      egressProxy: request.network?.egressProxy ?? null,
      httpsPorts: request.network?.httpsPorts ?? [],
      ...storedRules(request.network?.rules),
      ...(request.network?.bandwidth === undefined ? {} : { bandwidth: request.network.bandwidth }),
      // Fixed now, so a later change of the operator's default changes no sandbox.
      mode: request.network?.mode ?? this.options.defaultMode,
    };
    const policy = this.policies.compile(networkRules(network));
    const iam = acceptIam(request.iam, this.options.identity === true);
    checkIdentityTokens(policy, iam, this.options.identity === true);
    await this.policies.checkSecrets(policy);
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
    const template = await resolveTemplate(
      this.records.reads,
      this.options.teamNamespace,
      request.templateID,
    );
    const limits = template.limits ?? this.options.defaultLimits;
    const now = this.now();
    const source = sources.allocate();
    const record: SandboxRecord = {
      sandboxID: newSandboxID(),
      templateID: template.id,
      alias: template.alias,
      state: 'running',
      startedAt: now,
      endAt: timeout === undefined ? NO_EXPIRY : now + timeout * 1000,
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
      ...(iam === undefined ? {} : { iam }),
      ...madeHere(this.options.cluster),
    };
    // Under the template's key so that deleting the template cannot race the copy.
    const made = await this.queue.run(templateKey(template.id), () =>
      adopt
        ? this.launch(record, adopt, source, policy)
        : this.launch(record, template.id, source, policy),
    );
    this.transition(made, 'create', {
      templateID: made.templateID,
      timeout: timeout ?? null,
      ...(adopt === undefined ? {} : adopt),
    });
    // timeout 0 means "expire now": the sandbox is made, then expires on the spot.
    if (timeout === 0) await this.expireDue();
    return made;
  }

  /**
   * Makes the sandbox of `found` from the files of `template`, or adopts the namespace it names
   * (network-only), with its firewall, and records and enforces it. Nothing of it is left when
   * that fails. Returns the record as stored.
   */
  private async launch(
    found: SandboxRecord,
    template: string | AdoptRequest,
    source: IPAddress,
    policy: Policy,
  ): Promise<SandboxRecord> {
    const { runtime, sources } = this.options;
    const id = found.sandboxID;
    const upstream = storedUpstream(found);
    let record = found;
    try {
      if (typeof template === 'string') {
        await runtime.create(
          id,
          template,
          this.options.environment(record),
          source.text,
          this.records.limitsOf(record),
        );
      } else {
        const identity = await runtime.adopt(id, template, source.text);
        record = { ...record, link: { ...template, identity } };
      }
      // Fail closed: a sandbox whose firewall cannot be written is not started.
      await this.options.kernel?.install(
        id,
        source,
        policy,
        upstream,
        record.link && uplinkOf(record.link),
      );
      await this.options.kernel?.limitBandwidth(
        id,
        bandwidthOf(record.network, this.options.bandwidthDefaults),
      );
      await this.records.save(record);
    } catch (error) {
      // The address last: its slot names the link and the namespace's handle, which another
      // create must not get while this one's are still being taken down.
      await runtime.destroy(id).catch(() => undefined);
      sources.release(source);
      if (error instanceof AdoptRefused) throw new SandboxError(400, error.message);
      if (error instanceof KernelEnforcementError || error instanceof SandboxRefused)
        throw new SandboxError(503, `the sandbox was not created: ${error.message}`);
      throw error;
    }
    this.adopt(record, { address: source, policy });
    return record;
  }

  /**
   * Makes `count` sandboxes from one copy of the sandbox's files (fork.ts); each succeeds or
   * fails on its own.
   */
  async fork(sandboxID: string, count: number, seconds: number): Promise<ForkResult[]> {
    refuseNetworkOnly(await this.get(sandboxID), 'fork');
    return fork(
      {
        ...this.parts,
        get: (id) => this.get(id),
        launch: (record, template, source, policy) => this.launch(record, template, source, policy),
        expireDue: () => this.expireDue(),
      },
      sandboxID,
      count,
      seconds,
    );
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
    const record = await this.records.get(sandboxID);
    // A sandbox whose node stopped sending heartbeats is gone with it.
    if (record === undefined || !onLiveNode(this.options.cluster, record)) {
      throw notFound(sandboxID);
    }
    return record;
  }

  /** The presets a sandbox's allowOut names, each with its version and entries. */
  presetsOf(record: SandboxRecord): readonly PresetUse[] {
    return this.policies.presetsOf(record);
  }

  /** The sandbox's record, or undefined when there is none; a store outage still throws. */
  find(sandboxID: string): Promise<SandboxRecord | undefined> {
    return unlessNotFound(this.get(sandboxID));
  }

  /** The node that hosts the sandbox (this one for a Moat on its own). */
  async nodeOf(sandboxID: string): Promise<string> {
    const record = await this.get(sandboxID);
    return record.node ?? this.options.cluster?.self ?? '';
  }

  async list(query: SandboxQuery): Promise<Page<SandboxRecord>> {
    const records = (await this.records.all()).filter((r) => onLiveNode(this.options.cluster, r));
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
      refuseNetworkOnly(record, 'pause');
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
      refuseNetworkOnly(record, 'resume');
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
    return this.change(sandboxID, 'running', (record) => updateNetwork(this.parts, record, rules));
  }

  /**
   * Enforces the stored network config of a sandbox this node hosts, announced by the node that
   * stored it (cluster-reload.ts). False, logged, when there was nothing to do.
   */
  reload(sandboxID: string): Promise<boolean> {
    return this.clusterReload.reload(sandboxID);
  }

  /** After the store was out of reach: enforces again what it holds for this node's sandboxes. */
  reloadAll(): Promise<void> {
    return this.clusterReload.reloadAll();
  }

  /** Removes the records of sandboxes whose node is gone (its heartbeat lapsed). */
  forgetGoneNodes(): Promise<string[]> {
    return this.clusterReload.forgetGoneNodes();
  }

  /** Sandboxes this node hosts now. */
  get hostedCount(): number {
    return this.states.size;
  }

  /** Copies the sandbox's root into a new template; the sandbox keeps running. */
  async createSnapshot(sandboxID: string, name: string | undefined): Promise<SnapshotRecord> {
    refuseNetworkOnly(await this.get(sandboxID), 'snapshot');
    return this.snapshotCatalog.create(sandboxID, name);
  }

  listSnapshots(query: SnapshotQuery): Promise<Page<SnapshotRecord>> {
    return this.snapshotCatalog.list(query);
  }

  snapshots(): Promise<SnapshotRecord[]> {
    return this.records.snapshots();
  }

  /** Deletes a snapshot, or every tag of a template; refused while a sandbox made from it exists. */
  deleteTemplate(id: string): Promise<void> {
    return this.snapshotCatalog.delete(id);
  }

  /** The node whose data folder holds a template's files (undefined: any node). */
  templateNode(templateID: string): Promise<string | undefined> {
    return this.snapshotCatalog.nodeOf(templateID);
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
          const record = await this.records.get(id);
          if (record?.state !== 'running') return;
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
    await this.records.save(next);
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
      await this.records.save(next);
    } catch (error) {
      if (memory) await runtime.resume(record.sandboxID);
      else await this.recovery.coldBoot(record);
      throw error;
    }
    // A paused sandbox sends nothing; dropping it from the table makes that certain.
    this.options.table.remove(record.sandboxID);
    this.expiry.delete(record.sandboxID);
    this.states.set(record.sandboxID, 'paused');
    this.transition(next, why === 'expire' ? 'autoPause' : 'pause', { memory });
    return next;
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
    const policy = this.policies.stored(record);
    const address = parseIP(record.sourceAddress);
    if (!address.ok) throw new SandboxError(500, address.error);
    const frozen = record.filesOnly !== true && this.recovery.restored(record.sandboxID);
    // Asked to start from its files: its frozen processes are ended first.
    if (frozen && fromFiles) await this.options.runtime.release(record.sandboxID);
    if (!frozen || fromFiles) await this.recovery.coldBoot(record);
    await this.records.save(next);
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

  /** Removes the sandbox; `why` is the transition logged (`lost`: with the reason). */
  private async remove(
    record: SandboxRecord,
    why: 'kill' | 'expire' | 'lost',
    details: object = {},
  ): Promise<void> {
    await this.records.delete([record.sandboxID]);
    await this.unhost(record.sandboxID);
    const address = parseIP(record.sourceAddress);
    if (address.ok) this.options.sources.release(address.value);
    this.transition(record, why, details);
  }

  /**
   * Detaches every network-only sandbox whose namespace is lost (its path no longer names what
   * was adopted: the runtime that made it deleted it), logging why. Run periodically.
   */
  async detachLost(): Promise<void> {
    const lost = await this.options.runtime.lostNamespaces();
    await Promise.all(
      [...lost].map(([id, reason]) =>
        this.queue.run(id, async () => {
          const record = await this.records.get(id);
          if (record?.link === undefined) return;
          this.log.warn({ sandboxID: id, reason }, 'network-only sandbox lost its namespace');
          await this.remove(record, 'lost', { reason });
        }),
      ),
    );
  }

  /** The sandboxes running on this node. */
  private running(): string[] {
    return [...this.states].filter(([, state]) => state === 'running').map(([id]) => id);
  }

  /** Ends what runs here of a sandbox and forgets it (its record is gone). */
  private async unhost(sandboxID: string): Promise<void> {
    this.recovery.forget(sandboxID);
    this.options.table.remove(sandboxID);
    this.expiry.delete(sandboxID);
    this.states.delete(sandboxID);
    this.usage.forget(sandboxID);
    await this.options.runtime.destroy(sandboxID);
  }

  /**
   * This node holds the sandbox, in its record's state; `running`: enforced with this address
   * and policy and due to expire at its `endAt`.
   */
  private adopt(record: SandboxRecord, running?: { address: IPAddress; policy: Policy }): void {
    this.states.set(record.sandboxID, record.state);
    if (running === undefined) return;
    this.options.table.register(
      record.sandboxID,
      { sourceAddress: running.address, egressSecret: record.egressSecret },
      running.policy,
      storedUpstream(record),
    );
    this.expiry.set(record.sandboxID, record.endAt);
  }

  private transition(record: SandboxRecord, what: string, details: object): void {
    this.options.metrics.sandboxTransitions.inc({ transition: what });
    this.log.info({ sandboxID: record.sandboxID, transition: what, ...details }, 'sandbox ' + what);
  }
}
