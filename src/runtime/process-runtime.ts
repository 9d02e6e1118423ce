import { createHash } from 'node:crypto';
import { cp, mkdir, readdir, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import {
  bubblewrap,
  bubblewrapWorks,
  type Confinement,
  identityFiles,
  inNetworkNamespace,
  unconfined,
  USERS,
} from './confinement.js';
import { type Containment, FreezerCgroup, ProcessGroups } from './containment.js';
import { listeningPortsOf } from './listening-ports.js';
import type { NamespaceNetwork } from './network.js';
import { ProcessTable } from './processes.js';
import type {
  EnforcementMode,
  RuntimeSandbox,
  SandboxEnvironment,
  SandboxRuntime,
} from './runtime.js';

/** The writable areas every sandbox root has: each user's home and /tmp. */
const SKELETON = [...[...USERS.values()].map((u) => u.home.slice(1)), 'tmp'];

export const BASE_TEMPLATE = 'base';

export interface ProcessRuntimeOptions {
  /** Run processes unconfined even where bubblewrap works (tests of the fallback). */
  readonly confine?: boolean;
  /**
   * Give each sandbox its own network namespace (needs bubblewrap: unconfined processes would
   * run as root inside the namespace and could rewrite its firewall).
   */
  readonly network?: NamespaceNetwork;
  /** Why there is no network namespace per sandbox, for start-up output. */
  readonly proxyOnlyReason?: string;
}

/**
 * The embedded runtime: a sandbox is a folder under `<dataDir>/sandboxes/<id>/root` holding its
 * writable areas, made from `<dataDir>/templates/<key>/root` (the built-in `base` template is
 * the empty skeleton), and the processes started in it.
 */
export class ProcessRuntime implements SandboxRuntime {
  readonly enforcement: EnforcementMode;
  readonly enforcementReason: string;
  readonly confined: boolean;
  readonly confinementReason: string;
  private readonly confinement: Confinement;
  private readonly useFreezer: boolean;
  private readonly sandboxesDir: string;
  private readonly templates: string;
  private readonly live = new Map<string, RuntimeSandbox>();
  /** Names this Moat's cgroups apart from other Moats' on the host. */
  private readonly scope: string;
  private readonly network: NamespaceNetwork | undefined;

  constructor(dataDir: string, options: ProcessRuntimeOptions = {}) {
    this.sandboxesDir = path.resolve(dataDir, 'sandboxes');
    this.templates = path.resolve(dataDir, 'templates');
    this.scope = createHash('sha256').update(path.resolve(dataDir)).digest('hex').slice(0, 16);
    const bwrap =
      options.confine === false ? { ok: false, reason: 'switched off' } : bubblewrapWorks();
    this.confinement = bwrap.ok ? bubblewrap : unconfined;
    this.confined = bwrap.ok;
    if (options.network && !bwrap.ok) {
      throw new Error(
        `network namespaces need confined processes, and ${bwrap.reason}; run with --enforcement proxy`,
      );
    }
    this.network = options.network;
    this.enforcement = this.network ? 'namespace' : 'proxy';
    this.enforcementReason = this.network
      ? `each sandbox in its own network namespace, a /30 link each from ${options.network!.pool}, firewall generated into nftables`
      : `sandboxes share the host network; egress is enforced for programs that use the injected proxy variables${options.proxyOnlyReason ? ` (no network namespaces: ${options.proxyOnlyReason})` : ''}`;
    this.useFreezer = FreezerCgroup.available();
    this.confinementReason = [
      bwrap.ok ? bwrap.reason : `unconfined (${bwrap.reason}): processes see the host's files`,
      this.useFreezer
        ? 'a freezer cgroup per sandbox'
        : 'process groups (no writable cgroup freezer: a process that leaves its group escapes pause and kill)',
    ].join('; ');
  }

  rootOf(sandboxID: string): string {
    return path.join(this.sandboxesDir, sandboxID, 'root');
  }

  private templateRoot(templateKey: string): string {
    // Keys like `team/alias:tag` become one path segment; encodeURIComponent escapes `/`.
    return path.join(this.templates, encodeURIComponent(templateKey), 'root');
  }

  async create(
    sandboxID: string,
    templateKey: string,
    env: SandboxEnvironment,
    address: string,
  ): Promise<void> {
    const root = this.rootOf(sandboxID);
    await rm(path.dirname(root), { recursive: true, force: true });
    if (templateKey === BASE_TEMPLATE) {
      for (const area of SKELETON) await mkdir(path.join(root, area), { recursive: true });
    } else {
      await cp(this.templateRoot(templateKey), root, {
        recursive: true,
        preserveTimestamps: true,
        verbatimSymlinks: true,
      });
    }
    await this.restore(sandboxID, env, address);
  }

  async restore(sandboxID: string, env: SandboxEnvironment, address: string): Promise<void> {
    const root = this.rootOf(sandboxID);
    // What the sandbox sees as /etc/passwd, /etc/group, /etc/profile and (in its own network
    // namespace) /etc/resolv.conf: its own, not the host's.
    await mkdir(path.join(root, '.moat'), { recursive: true });
    const resolver = this.network?.gateway;
    for (const [name, text] of Object.entries(identityFiles(resolver))) {
      await writeFile(path.join(root, '.moat', name), text);
    }
    let confinement = this.confinement;
    if (this.network) {
      await this.network.create(sandboxID, address);
      confinement = inNetworkNamespace(confinement, this.network.namespaceOf(sandboxID)!);
    }
    const containment: Containment = this.useFreezer
      ? FreezerCgroup.for(this.scope, sandboxID)
      : new ProcessGroups();
    const processes = new ProcessTable(root, () => env, confinement, containment);
    this.live.set(sandboxID, {
      sandboxID,
      root,
      env,
      // Its ports: on the host's loopback when it shares the host's network.
      address: this.network ? address : '127.0.0.1',
      processes,
      // Every process of the sandbox runs below one of its launchers.
      listeningPorts: () => listeningPortsOf(processes.launcherPids()),
    });
  }

  sandbox(sandboxID: string): RuntimeSandbox | undefined {
    return this.live.get(sandboxID);
  }

  async pause(sandboxID: string): Promise<void> {
    await this.live.get(sandboxID)?.processes.pause();
  }

  async resume(sandboxID: string): Promise<void> {
    await this.live.get(sandboxID)?.processes.resume();
  }

  async release(sandboxID: string): Promise<void> {
    await this.live.get(sandboxID)?.processes.killAll();
    this.live.delete(sandboxID);
    await this.network?.destroy(sandboxID);
  }

  async destroy(sandboxID: string): Promise<void> {
    await this.release(sandboxID);
    await rm(path.join(this.sandboxesDir, sandboxID), { recursive: true, force: true });
  }

  async snapshot(sandboxID: string, templateKey: string): Promise<void> {
    const target = path.dirname(this.templateRoot(templateKey));
    const staging = `${target}.tmp`;
    await rm(staging, { recursive: true, force: true });
    await cp(this.rootOf(sandboxID), path.join(staging, 'root'), {
      recursive: true,
      preserveTimestamps: true,
      verbatimSymlinks: true,
      filter: (source) => path.basename(source) !== '.moat',
    });
    // Replace a previous snapshot of the same name only once the new copy is complete.
    await rm(target, { recursive: true, force: true });
    await mkdir(this.templates, { recursive: true });
    await rename(staging, target);
  }

  async removeTemplate(templateKey: string): Promise<void> {
    await rm(path.dirname(this.templateRoot(templateKey)), { recursive: true, force: true });
  }

  async reconcile(known: ReadonlySet<string>): Promise<string[]> {
    if (this.useFreezer) await FreezerCgroup.sweep(this.scope);
    const present = await readdir(this.sandboxesDir).catch(() => [] as string[]);
    const leftovers = present.filter((id) => !known.has(id));
    for (const id of leftovers) await this.destroy(id);
    return leftovers;
  }

  /**
   * Ends every sandbox's processes and removes their namespaces (Moat is stopping); roots stay
   * for the next start, which makes the namespaces again.
   */
  async stop(): Promise<void> {
    await Promise.all([...this.live.values()].map((s) => s.processes.killAll()));
    this.live.clear();
    await this.network?.sweep();
    if (this.useFreezer) await FreezerCgroup.release(this.scope);
  }
}
