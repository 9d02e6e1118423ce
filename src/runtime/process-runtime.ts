import { createHash } from 'node:crypto';
import { cp, mkdir, readdir, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import {
  bubblewrap,
  bubblewrapWorks,
  type Confinement,
  identityFiles,
  unconfined,
  USERS,
} from './confinement.js';
import { type Containment, FreezerCgroup, ProcessGroups } from './containment.js';
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
}

/**
 * The embedded runtime: a sandbox is a folder under `<dataDir>/sandboxes/<id>/root` holding its
 * writable areas, made from `<dataDir>/templates/<key>/root` (the built-in `base` template is
 * the empty skeleton), and the processes started in it.
 */
export class ProcessRuntime implements SandboxRuntime {
  readonly enforcement: EnforcementMode = 'proxy';
  readonly enforcementReason =
    'sandboxes share the host network; egress is enforced for programs that use the injected proxy variables';
  readonly confined: boolean;
  readonly confinementReason: string;
  private readonly confinement: Confinement;
  private readonly useFreezer: boolean;
  private readonly sandboxesDir: string;
  private readonly templates: string;
  private readonly live = new Map<string, RuntimeSandbox>();
  /** Names this Moat's cgroups apart from other Moats' on the host. */
  private readonly scope: string;

  constructor(dataDir: string, options: ProcessRuntimeOptions = {}) {
    this.sandboxesDir = path.resolve(dataDir, 'sandboxes');
    this.templates = path.resolve(dataDir, 'templates');
    this.scope = createHash('sha256').update(path.resolve(dataDir)).digest('hex').slice(0, 16);
    const bwrap =
      options.confine === false ? { ok: false, reason: 'switched off' } : bubblewrapWorks();
    this.confinement = bwrap.ok ? bubblewrap : unconfined;
    this.confined = bwrap.ok;
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

  async create(sandboxID: string, templateKey: string, env: SandboxEnvironment): Promise<void> {
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
    await this.restore(sandboxID, env);
  }

  async restore(sandboxID: string, env: SandboxEnvironment): Promise<void> {
    const root = this.rootOf(sandboxID);
    // What the sandbox sees as /etc/passwd, /etc/group and /etc/profile: its own, not the host's.
    await mkdir(path.join(root, '.moat'), { recursive: true });
    for (const [name, text] of Object.entries(identityFiles())) {
      await writeFile(path.join(root, '.moat', name), text);
    }
    const containment: Containment = this.useFreezer
      ? FreezerCgroup.for(this.scope, sandboxID)
      : new ProcessGroups();
    this.live.set(sandboxID, {
      sandboxID,
      root,
      env,
      processes: new ProcessTable(root, () => env, this.confinement, containment),
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

  async destroy(sandboxID: string): Promise<void> {
    await this.live.get(sandboxID)?.processes.killAll();
    this.live.delete(sandboxID);
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

  /** Ends every sandbox's processes (Moat is stopping); roots stay for the next start. */
  async stop(): Promise<void> {
    await Promise.all([...this.live.values()].map((s) => s.processes.killAll()));
    this.live.clear();
    if (this.useFreezer) await FreezerCgroup.release(this.scope);
  }
}
