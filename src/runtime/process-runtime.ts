/**
 * The embedded runtime: a sandbox is a supervisor (supervisor/main.py) that builds it and brings
 * its roles to Moat, a cgroup, a disk holding its writable layer, a slot of host ids, and in
 * namespace mode a network namespace. Its files are laid out as sandbox-folders.ts says.
 *
 * Unconfined (only with --unconfined-sandboxes, where confinement is impossible) a sandbox is a
 * folder `<data>/sandboxes/<id>/root` and processes run on the host as Moat's user.
 */
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { cp, lstat, mkdir, readdir, readFile, rename, rm } from 'node:fs/promises';
import path from 'node:path';
import type { AdoptRequest, NamespaceIdentity } from './adoption.js';
import type { AgentSocket } from './agent-socket.js';
import type { SandboxCgroup, SandboxLimits } from './cgroups.js';
import { DEFAULT_USER, placeCommand, type SandboxUser, USERS } from './confinement.js';
import { type ConfinedParts, type HostProbe, probeHost } from './host-probe.js';
import { Launcher } from './launcher.js';
import { HostListeners } from './listening-ports.js';
import { ProcessTable } from './processes.js';
import type {
  EnforcementMode,
  RuntimeSandbox,
  SandboxEnvironment,
  SandboxRuntime,
} from './runtime.js';
import { SandboxFiles } from './sandbox-files.js';
import { adoptLegacyTemplates, SandboxFolders, type SandboxMeta } from './sandbox-folders.js';
import { SANDBOX_TRUST_BUNDLE, trustEnvironment } from './trust-store.js';
import { IDS_PER_SANDBOX } from './sandbox-ids.js';
import type { ProcessRuntimeOptions } from './process-runtime-options.js';
import { diskUsage, processUsage, type SandboxUsage } from './usage.js';
import { spawnSupervisor, Supervisor, SupervisorSpares } from './supervisor.js';
import { SupervisorConfigs } from './supervisor-config.js';

export const BASE_TEMPLATE = 'base';

/** Why a sandbox cannot be started here (no confinement and no override). */
export class SandboxRefused extends Error {
  override readonly name = 'SandboxRefused';
}

interface Live extends RuntimeSandbox {
  readonly supervisor: Supervisor;
  readonly cgroup: SandboxCgroup | undefined;
  readonly meta: SandboxMeta | undefined;
  /** Paused (a snapshot freezes it too, and thaws only what it froze). */
  frozen: boolean;
}

/** A supervisor made ahead of its sandbox, with the cgroup and id slot it has joined. */
interface Spare {
  readonly child: ChildProcess;
  readonly slot: number | undefined;
  readonly cgroup: SandboxCgroup | undefined;
}

/** Host pids in process group `group` (an unconfined sandbox's processes). */
async function groupMembers(group: number): Promise<number[]> {
  const pids: number[] = [];
  for (const name of await readdir('/proc').catch(() => [] as string[])) {
    if (!/^[0-9]+$/.test(name)) continue;
    const stat = await readFile(`/proc/${name}/stat`, 'utf8').catch(() => '');
    // Fields after the command (which may hold spaces): state, ppid, pgrp.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(fields[2]) === group) pids.push(Number(name));
  }
  return pids;
}

export class ProcessRuntime implements SandboxRuntime {
  readonly enforcement: EnforcementMode;
  readonly enforcementReason: string;
  readonly confined: boolean;
  readonly confinementReason: string;
  readonly trustEnvironment: SandboxEnvironment;
  private readonly dataDir: string;
  private readonly agents: AgentSocket;
  /** Set when sandboxes are confined. */
  private readonly confinedParts: ConfinedParts | undefined;
  /** Why sandboxes are refused; undefined when they start (confined or by the override). */
  private readonly refusal: string | undefined;
  private readonly folders: SandboxFolders;
  private readonly configs: SupervisorConfigs;
  private readonly live = new Map<string, Live>();
  private readonly spares: SupervisorSpares<Spare>;
  private readonly listeners = new HostListeners();

  private constructor(
    private readonly options: ProcessRuntimeOptions,
    probe: HostProbe,
  ) {
    const { data, agents, trustBundle, confinedParts } = probe;
    this.dataDir = data;
    this.agents = agents;
    this.confinedParts = confinedParts;
    this.refusal = probe.refusal;
    this.folders = new SandboxFolders(path.join(data, 'sandboxes'), confinedParts?.disks);
    this.configs = new SupervisorConfigs({
      socket: agents.path,
      folders: this.folders,
      confined: confinedParts,
      trustBundle,
      network: options.network,
      budgets: options.kernelBudgets,
    });
    this.confined = confinedParts !== undefined;
    this.confinementReason = probe.confinementReason;
    // Confined, the bundle is mounted at the system path; unconfined, there is no mount.
    this.trustEnvironment =
      trustBundle === undefined
        ? {}
        : trustEnvironment(confinedParts ? SANDBOX_TRUST_BUNDLE : trustBundle);
    this.enforcement = options.network ? 'namespace' : 'proxy';
    this.enforcementReason = options.network
      ? `each sandbox in its own network namespace, a /30 link each from ${options.network.pool}, firewall generated into nftables`
      : `sandboxes share the host network; egress is enforced for programs that use the injected proxy variables${options.proxyOnlyReason ? ` (no network namespaces: ${options.proxyOnlyReason})` : ''}`;
    this.spares = new SupervisorSpares<Spare>(
      () => this.makeSpare(),
      async (spare) => {
        if (spare.slot !== undefined) this.confinedParts?.ids.release(spare.slot);
        await spare.cgroup?.remove().catch(() => undefined);
      },
    );
  }

  /**
   * Probes the host (host-probe.ts), takes over what the probe prepared and adopts templates from
   * before layers.
   */
  static async start(dataDir: string, options: ProcessRuntimeOptions): Promise<ProcessRuntime> {
    const probe = await probeHost(dataDir, options);
    try {
      const runtime = new ProcessRuntime(options, probe);
      if (probe.confinedParts) await adoptLegacyTemplates(probe.confinedParts.layers);
      return runtime;
    } catch (error) {
      await probe.confinedParts?.ids.stop();
      await probe.agents.close();
      throw error;
    }
  }

  /** A supervisor for a sandbox to come: its own cgroup and id slot, joined and mapped. */
  private async makeSpare(): Promise<Spare> {
    if (!this.confinedParts)
      return {
        child: spawnSupervisor({ cgroups: [], ids: null }),
        slot: undefined,
        cgroup: undefined,
      };
    const { ids, cgroups } = this.confinedParts;
    const slot = ids.allocate(`spare ${randomBytes(4).toString('hex')}`);
    try {
      const cgroup = await cgroups.make(`c${randomBytes(8).toString('hex')}`);
      return { child: spawnSupervisor(this.configs.early(slot, cgroup)), slot, cgroup };
    } catch (error) {
      ids.release(slot);
      throw error;
    }
  }

  get sandboxHostIds(): { first: number; last: number } | undefined {
    const ids = this.confinedParts?.ids;
    return ids && { first: ids.first, last: ids.first + ids.slots * IDS_PER_SANDBOX - 1 };
  }

  async create(
    sandboxID: string,
    templateKey: string,
    env: SandboxEnvironment,
    address: string,
    limits: SandboxLimits,
  ): Promise<void> {
    if (this.refusal !== undefined) throw new SandboxRefused(this.refusal);
    const folder = this.folders.folder(sandboxID);
    await rm(folder, { recursive: true, force: true });
    await mkdir(folder, { recursive: true, mode: 0o700 });
    if (!this.confinedParts) {
      await this.makeUnconfinedRoot(sandboxID, templateKey);
      await this.launch(sandboxID, env, address, limits, undefined, await this.spares.take());
      return;
    }
    const { ids, layers, disks } = this.confinedParts;
    const layer = templateKey === BASE_TEMPLATE ? null : await layers.templateLayer(templateKey);
    if (layer === undefined) throw new Error(`template ${templateKey} has no layer on this node`);
    const spare = await this.spares.take();
    const slot = spare.slot!;
    ids.assign(slot, sandboxID);
    let disk: string | null = null;
    try {
      disk = disks ? await disks.create(limits.diskSizeMB) : null;
      const meta: SandboxMeta = { slot, disk, layer };
      // Its writable layer's folders are made by its supervisor.
      await this.folders.writeMeta(sandboxID, meta);
      await this.launch(sandboxID, env, address, limits, meta, spare);
    } catch (error) {
      spare.child.kill('SIGKILL');
      await spare.cgroup?.remove().catch(() => undefined);
      if (disk !== null) await disks?.remove(disk).catch(() => undefined);
      ids.release(slot);
      await rm(folder, { recursive: true, force: true });
      throw error;
    }
  }

  private async makeUnconfinedRoot(sandboxID: string, templateKey: string): Promise<void> {
    const root = this.folders.unconfinedRoot(sandboxID);
    if (templateKey !== BASE_TEMPLATE) {
      const template = path.join(
        this.dataDir,
        'templates',
        encodeURIComponent(templateKey),
        'root',
      );
      if (!existsSync(template))
        throw new Error(`template ${templateKey} has no folder on this node`);
      await cp(template, root, {
        recursive: true,
        preserveTimestamps: true,
        verbatimSymlinks: true,
      });
      return;
    }
    for (const user of USERS.values()) await mkdir(path.join(root, user.home), { recursive: true });
    await mkdir(path.join(root, 'tmp'), { recursive: true });
  }

  async restore(
    sandboxID: string,
    env: SandboxEnvironment,
    address: string,
    limits: SandboxLimits,
  ): Promise<void> {
    if (this.refusal !== undefined) throw new SandboxRefused(this.refusal);
    if (!this.confinedParts) {
      await this.launch(sandboxID, env, address, limits, undefined, await this.spares.take());
      return;
    }
    const meta =
      (await this.folders.readMeta(sandboxID)) ??
      (await this.folders.adoptLegacySandbox(sandboxID, limits.diskSizeMB, this.confinedParts));
    const { ids, disks } = this.confinedParts;
    if (!ids.claim(meta.slot, sandboxID)) {
      throw new Error(`sandbox ${sandboxID} has id slot ${meta.slot}, which another sandbox has`);
    }
    if (meta.disk !== null) {
      if (!disks)
        throw new Error(`sandbox ${sandboxID} has a disk, and disks cannot be mounted here`);
      await disks.attach(meta.disk);
    }
    const owner = (await lstat(path.join(this.folders.upperBase(sandboxID, meta), 'root'))).uid;
    if (owner !== ids.hostFirst(meta.slot)) {
      throw new Error(
        `sandbox ${sandboxID}'s files belong to host id ${owner}, not to its slot's ${ids.hostFirst(meta.slot)} (was --sandbox-ids changed?)`,
      );
    }
    // Its slot is its own: no spare (made for another slot) fits; one is made for it now.
    const cgroup = await this.confinedParts.cgroups.make(`c${randomBytes(8).toString('hex')}`);
    const spare = {
      child: spawnSupervisor(this.configs.early(meta.slot, cgroup)),
      slot: meta.slot,
      cgroup,
    };
    try {
      await this.launch(sandboxID, env, address, limits, meta, spare);
    } catch (error) {
      await cgroup.remove().catch(() => undefined);
      throw error;
    }
  }

  /**
   * Configures the sandbox's supervisor (a spare, already in its cgroup with its user
   * namespaces made), with its network namespace, and waits until the sandbox is built.
   */
  private async launch(
    sandboxID: string,
    env: SandboxEnvironment,
    address: string,
    limits: SandboxLimits,
    meta: SandboxMeta | undefined,
    spare: Spare,
  ): Promise<void> {
    const network = this.options.network;
    const cgroup = spare.cgroup;
    let supervisor: Supervisor | undefined;
    try {
      if (network) await network.create(sandboxID, address);
      await cgroup?.limit(limits);
      const { ms, onMissed } = this.options.roleDeadline;
      supervisor = new Supervisor(
        this.configs.sandbox(sandboxID, limits, meta, cgroup),
        this.agents,
        spare.child,
        {
          ms,
          onMissed: (kind, user) =>
            onMissed(sandboxID, kind === 'proc' ? 'launcher' : 'file agent', user),
          excused: () => this.live.get(sandboxID)?.frozen === true,
        },
      );
      await supervisor.ready;
    } catch (error) {
      supervisor?.kill();
      spare.child.kill('SIGKILL');
      await supervisor?.exited;
      await cgroup?.remove().catch(() => undefined);
      await network?.destroy(sandboxID);
      throw error;
    }
    const launched = supervisor;
    // Most sandboxes run a command as `user` first: its launcher starts while create answers.
    launched.role('proc', DEFAULT_USER.name).catch(() => undefined);
    const launchers = new Map<unknown, Launcher>();
    const hostRoot = meta ? undefined : this.folders.unconfinedRoot(sandboxID);
    const processIds = () => (cgroup ? cgroup.members() : groupMembers(launched.pid ?? -1));
    const diskFolder =
      meta?.disk != null ? this.confinedParts?.disks?.folder(meta.disk) : undefined;
    const usage = async (): Promise<SandboxUsage> => {
      const used = cgroup ? await cgroup.usage() : await processUsage(await processIds());
      const disk = diskFolder === undefined ? undefined : await diskUsage(diskFolder);
      return {
        ...used,
        diskUsedBytes: disk?.used,
        diskTotalBytes: disk?.total ?? limits.diskSizeMB * 2 ** 20,
      };
    };
    this.live.set(sandboxID, {
      sandboxID,
      env,
      limits,
      confined: meta !== undefined,
      // Its ports: on the host's loopback when it shares the host's network.
      address: network ? address : '127.0.0.1',
      supervisor: launched,
      cgroup,
      meta,
      frozen: false,
      processes: new ProcessTable(() => env, {
        ownGroups: meta !== undefined,
        place: (spec) => placeCommand(spec, hostRoot),
        launcher: async (user: SandboxUser) => {
          const connection = await launched.role('proc', user.name);
          let launcher = launchers.get(connection);
          if (launcher === undefined || !launcher.alive) {
            launcher = new Launcher(connection);
            launchers.set(connection, launcher);
          }
          return launcher;
        },
      }),
      files: new SandboxFiles((user) => launched.role('file', user)),
      processIds,
      usage,
      // A confined sandbox's sockets are owned by its own ids; an unconfined one's by Moat's.
      listeningPorts: async () =>
        meta !== undefined && this.confinedParts
          ? this.listeners.ownedBy(this.confinedParts.ids.hostFirst(meta.slot), IDS_PER_SANDBOX)
          : this.listeners.heldBy(await processIds()),
    });
  }

  sandbox(sandboxID: string): RuntimeSandbox | undefined {
    return this.live.get(sandboxID);
  }

  adopt(
    sandboxID: string,
    request: AdoptRequest,
    address: string,
    expected?: NamespaceIdentity,
  ): Promise<NamespaceIdentity> {
    const network = this.options.network;
    if (network === undefined)
      return Promise.reject(new Error('network-only sandboxes need namespace enforcement'));
    return network.adopt(sandboxID, request, address, expected);
  }

  async lostNamespaces(): Promise<Map<string, string>> {
    return (await this.options.network?.lost()) ?? new Map<string, string>();
  }

  async pause(sandboxID: string): Promise<void> {
    const live = this.live.get(sandboxID);
    if (live === undefined) return;
    if (live.cgroup) await live.cgroup.freeze();
    else this.signalGroup(live, 'SIGSTOP');
    live.frozen = true;
  }

  async resume(sandboxID: string): Promise<void> {
    const live = this.live.get(sandboxID);
    if (live === undefined) return;
    if (live.cgroup) await live.cgroup.thaw();
    else this.signalGroup(live, 'SIGCONT');
    live.frozen = false;
  }

  /** Unconfined, every process of the sandbox is in its supervisor's process group. */
  private signalGroup(live: Live, signal: NodeJS.Signals): void {
    const pid = live.supervisor.pid;
    if (pid === undefined) return;
    try {
      process.kill(-pid, signal);
    } catch {
      // Already gone.
    }
  }

  /** Ends every process of the sandbox and takes down its namespace; its files stay. */
  async release(sandboxID: string): Promise<void> {
    const live = this.live.get(sandboxID);
    if (live === undefined) {
      await this.options.network?.destroy(sandboxID);
      return;
    }
    this.live.delete(sandboxID);
    if (!live.cgroup) this.signalGroup(live, 'SIGKILL');
    live.supervisor.kill();
    await live.cgroup?.remove();
    await live.supervisor.exited;
    await this.options.network?.destroy(sandboxID);
  }

  async destroy(sandboxID: string): Promise<void> {
    await this.release(sandboxID);
    // A damaged record names no disk: that one goes at the next start's reconcile.
    const meta = this.confinedParts
      ? await this.folders.readMeta(sandboxID).catch(() => undefined)
      : undefined;
    if (meta?.disk != null) await this.confinedParts!.disks?.remove(meta.disk);
    await rm(this.folders.folder(sandboxID), { recursive: true, force: true });
    if (meta) this.confinedParts!.ids.release(meta.slot);
    if (meta?.layer != null) await this.collectLayers();
  }

  /**
   * Copies the sandbox's files into template `templateKey` (replacing one of that name only
   * once the copy is complete). A running sandbox is frozen meanwhile, so the copy is of one
   * moment.
   */
  async snapshot(sandboxID: string, templateKey: string): Promise<void> {
    const live = this.live.get(sandboxID);
    if (!this.confinedParts) {
      await this.unconfinedSnapshot(sandboxID, templateKey);
      return;
    }
    const meta = live?.meta ?? (await this.folders.readMeta(sandboxID));
    if (meta === undefined) throw new Error(`sandbox ${sandboxID} has no files on this node`);
    const { ids, layers } = this.confinedParts;
    const freeze = live !== undefined && !live.frozen ? live.cgroup : undefined;
    await freeze?.freeze();
    if (freeze) live!.frozen = true;
    try {
      await layers.snapshot(templateKey, {
        upper: this.folders.upperBase(sandboxID, meta),
        upperFirst: ids.hostFirst(meta.slot),
        lower: meta.layer ?? undefined,
        // A sparse file's holes are not data; what is, cannot exceed the sandbox's disk.
        budgetBytes: (live?.limits.diskSizeMB ?? this.options.defaultDiskMB) * 2 ** 20,
      });
    } finally {
      await freeze?.thaw();
      if (freeze) live!.frozen = false;
    }
    await this.collectLayers();
  }

  private async unconfinedSnapshot(sandboxID: string, templateKey: string): Promise<void> {
    const target = path.join(this.dataDir, 'templates', encodeURIComponent(templateKey));
    const staging = `${target}.${randomBytes(4).toString('hex')}.new`;
    await cp(this.folders.unconfinedRoot(sandboxID), path.join(staging, 'root'), {
      recursive: true,
      preserveTimestamps: true,
      verbatimSymlinks: true,
    });
    const retired = `${target}.${randomBytes(4).toString('hex')}.old`;
    await rename(target, retired).catch(() => undefined);
    await rename(staging, target);
    await rm(retired, { recursive: true, force: true });
  }

  async removeTemplate(templateKey: string): Promise<void> {
    if (!this.confinedParts) {
      const target = path.join(this.dataDir, 'templates', encodeURIComponent(templateKey));
      await rm(target, { recursive: true, force: true });
      return;
    }
    await this.confinedParts.layers.removeTemplate(templateKey);
    await this.collectLayers();
  }

  /** Removes layers no template and no sandbox on this node names. */
  private async collectLayers(): Promise<void> {
    const inUse = new Set<string>();
    for (const id of await readdir(this.folders.root).catch(() => [] as string[])) {
      // A damaged record might name any layer: then none is removed this time.
      const meta = await this.folders.readMeta(id).catch(() => null);
      if (meta === null) return;
      if (meta?.layer) inUse.add(meta.layer);
    }
    await this.confinedParts!.layers.collect(inUse);
  }

  async reconcile(
    known: ReadonlySet<string>,
    knownTemplates: ReadonlySet<string>,
  ): Promise<string[]> {
    const present = await readdir(this.folders.root).catch(() => [] as string[]);
    const leftovers = present.filter((id) => !known.has(id));
    if (this.confinedParts) {
      const { cgroups, disks, layers } = this.confinedParts;
      await cgroups.sweep();
      await layers.removeStaging();
      for (const key of await layers.templateKeys()) {
        if (!knownTemplates.has(key)) await layers.removeTemplate(key);
      }
      for (const id of leftovers) await this.destroy(id);
      const disksInUse = new Set<string>();
      let damaged = false;
      for (const id of known) {
        // A damaged record fails that sandbox's restore (which names it), not the start.
        const meta = await this.folders.readMeta(id).catch(() => null);
        damaged ||= meta === null;
        if (!meta) continue;
        // Its ids own its files whether or not it comes back now.
        this.confinedParts.ids.claim(meta.slot, id);
        if (meta.disk) disksInUse.add(meta.disk);
      }
      // A damaged record may name any disk: then no disk is removed this time.
      if (!damaged) await disks?.reconcile(disksInUse);
      disks?.refill();
      await this.collectLayers();
    } else {
      for (const id of leftovers) await this.destroy(id);
    }
    // The first spare supervisor, now that the sweep of leftover cgroups is done.
    this.spares.refill();
    return leftovers;
  }

  /** Ends every sandbox's processes (Moat is stopping); their files stay for the next start. */
  async stop(): Promise<void> {
    await Promise.all([...this.live.keys()].map((id) => this.release(id)));
    await this.spares.stop();
    await this.options.network?.sweep();
    if (this.confinedParts) {
      const { cgroups, disks, ids } = this.confinedParts;
      await cgroups.release();
      await disks?.stop();
      await ids.stop();
    }
    await this.agents.close();
  }
}
