/**
 * One cgroup per sandbox, holding every process of it (the supervisor joins it before it makes
 * anything): memory (over it the kernel's OOM killer acts inside this cgroup only), processes
 * and threads, CPU time, and the freezer that pauses the sandbox. cgroup v2 where the host has
 * the controllers there, else v1 (one hierarchy per controller).
 *
 * Cgroups live under `<hierarchy>/moat/<scope>/<sandboxID>`, the scope naming one Moat (its data
 * folder), so that start-up finds and ends what an earlier run of the same Moat left.
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, rmdir, writeFile } from 'node:fs/promises';
import path from 'node:path';

export interface SandboxLimits {
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly diskSizeMB: number;
  /** Processes and threads together. */
  readonly pids: number;
}

export interface SandboxCgroup {
  /** Folders whose cgroup.procs the supervisor writes its pid to. */
  readonly folders: readonly string[];
  /** Sets the bounds (before the sandbox's own processes start). */
  limit(limits: SandboxLimits): Promise<void>;
  freeze(): Promise<void>;
  thaw(): Promise<void>;
  /** Host pids of every process inside. */
  members(): Promise<number[]>;
  /** What its processes use now (for metrics). */
  usage(): Promise<CgroupUsage>;
  /** SIGKILL to everything inside (thawed first); resolves when nothing is left, the cgroup gone. */
  remove(): Promise<void>;
}

/** What a cgroup's processes use, as the kernel counts it. */
export interface CgroupUsage {
  /** CPU time of every process that ran in it, in microseconds; undefined when not counted. */
  readonly cpuMicros: number | undefined;
  /** Memory charged to it, page cache included, in bytes. */
  readonly memoryBytes: number;
  /** The page cache part of `memoryBytes`. */
  readonly cacheBytes: number;
}

export interface Cgroups {
  readonly description: string;
  /**
   * Makes a cgroup named `name` (any name unique in this Moat: one is made ahead of the sandbox
   * that will use it, so that joining it is not on the way of a create).
   */
  make(name: string): Promise<SandboxCgroup>;
  /** Ends and removes every cgroup an earlier run of this Moat left; returns how many. */
  sweep(): Promise<number>;
  /** Removes this Moat's own folders once its sandboxes' cgroups are gone. */
  release(): Promise<void>;
}

const CPU_PERIOD_US = 100_000;
const CONTROLLERS = ['memory', 'pids', 'cpu', 'freezer'] as const;
/** Joined where the host has it (cgroup v1): it counts the CPU time metrics report. */
const CPU_ACCOUNTING = 'cpuacct';
const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function signal(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // Already gone.
  }
}

/** A number from a cgroup file (`file`), or from one `key value` line of it. */
async function counter(file: string, key?: string): Promise<number | undefined> {
  const text = await readFile(file, 'utf8').catch(() => undefined);
  if (text === undefined) return undefined;
  const line = key === undefined ? text : text.split('\n').find((l) => l.startsWith(`${key} `));
  const value = Number(line?.slice(key === undefined ? 0 : key.length + 1).trim());
  return line === undefined || !Number.isFinite(value) ? undefined : value;
}

async function procs(folder: string): Promise<number[]> {
  const text = await readFile(path.join(folder, 'cgroup.procs'), 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((line) => line !== '')
    .map(Number);
}

/** Waits until `folder` has no process (at most 5 s), killing whatever is in it meanwhile. */
async function emptied(folder: string, beforeEachRound: () => Promise<void>): Promise<void> {
  for (let round = 0; round < 500; round++) {
    const pids = await procs(folder);
    if (pids.length === 0) return;
    await beforeEachRound();
    for (const pid of pids) signal(pid);
    await delay(10);
  }
  throw new Error(`the cgroup ${folder} still has processes after 5 s of SIGKILL`);
}

/** Mount points of cgroup v1 controllers and of the cgroup v2 hierarchy, from mountinfo. */
function hierarchies(): { v1: Map<string, string>; v2: string | undefined } {
  const v1 = new Map<string, string>();
  let v2: string | undefined;
  let text: string;
  try {
    text = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    return { v1, v2 };
  }
  for (const line of text.split('\n')) {
    const [before, after] = line.split(' - ');
    if (before === undefined || after === undefined) continue;
    const mountPoint = before.split(' ')[4];
    const [type, , options = ''] = after.split(' ');
    if (mountPoint === undefined) continue;
    if (type === 'cgroup2') v2 ??= mountPoint;
    if (type === 'cgroup') {
      for (const option of options.split(',')) {
        if ([...CONTROLLERS, CPU_ACCOUNTING].includes(option) && !v1.has(option)) {
          v1.set(option, mountPoint);
        }
      }
    }
  }
  return { v1, v2 };
}

/** The cgroups this host lets Moat make for its sandboxes, or why it cannot. */
export function findCgroups(scope: string): { cgroups: Cgroups } | { problem: string } {
  if (process.getuid?.() !== 0) return { problem: 'Moat is not running as root' };
  const { v1, v2 } = hierarchies();
  const v2Controllers = v2
    ? (() => {
        try {
          return readFileSync(path.join(v2, 'cgroup.controllers'), 'utf8').trim().split(/\s+/);
        } catch {
          return [];
        }
      })()
    : [];
  if (v2 && ['memory', 'pids', 'cpu'].every((c) => v2Controllers.includes(c))) {
    return { cgroups: new CgroupsV2(v2, scope) };
  }
  const missing = CONTROLLERS.filter((c) => !v1.has(c));
  if (missing.length === 0) return { cgroups: new CgroupsV1(v1, scope) };
  return {
    problem: `no cgroup hierarchy with the memory, pids, cpu and freezer controllers (cgroup v1 lacks ${missing.join(', ')}${v2 ? `; cgroup v2 at ${v2} offers ${v2Controllers.join(' ') || 'none'}` : ''})`,
  };
}

/**
 * Why the cgroups found cannot do what start-up would claim for them, or undefined: one cgroup
 * made, limited, frozen, thawed and removed. Mounts say a controller exists, not that this
 * process may write it (no root on cgroup v1, a read-only /sys/fs/cgroup in a container).
 */
export async function cgroupsProblem(cgroups: Cgroups): Promise<string | undefined> {
  let made: SandboxCgroup | undefined;
  try {
    made = await cgroups.make(`probe-${process.pid}-${Date.now()}`);
    await made.limit({ cpuCount: 1, memoryMB: 64, diskSizeMB: 1, pids: 16 });
    await made.freeze();
    await made.thaw();
  } catch (error) {
    await made?.remove().catch(() => undefined);
    await cgroups.release();
    return `${cgroups.description} was found but a write test failed: ${(error as Error).message}`;
  }
  await made.remove();
  return undefined;
}

class CgroupsV1 implements Cgroups {
  readonly description: string;
  /** The controllers joined: the required ones, and cpuacct where it has its own hierarchy. */
  private readonly controllers: readonly string[];

  constructor(
    private readonly mounts: Map<string, string>,
    private readonly scope: string,
  ) {
    const cpuacct = mounts.get(CPU_ACCOUNTING);
    const ownHierarchy =
      cpuacct !== undefined && CONTROLLERS.every((c) => mounts.get(c) !== cpuacct);
    this.controllers = [...CONTROLLERS, ...(ownHierarchy ? [CPU_ACCOUNTING] : [])];
    this.description = `cgroup v1 (${[...CONTROLLERS, ...(cpuacct ? [CPU_ACCOUNTING] : [])].join(', ')})`;
  }

  private scopeFolder(controller: string): string {
    return path.join(this.mounts.get(controller)!, 'moat', this.scope);
  }

  async make(name: string): Promise<SandboxCgroup> {
    const folder = (c: string) => path.join(this.scopeFolder(c), name);
    try {
      for (const controller of this.controllers)
        await mkdir(folder(controller), { recursive: true });
    } catch (error) {
      // Nothing half-made stays behind (the freezer's folder is what sweep() looks for).
      for (const controller of this.controllers)
        await rmdir(folder(controller)).catch(() => undefined);
      throw error;
    }
    const limit = async (limits: SandboxLimits) => {
      const memory = folder('memory');
      const bytes = String(limits.memoryMB * 2 ** 20);
      await writeFile(path.join(memory, 'memory.limit_in_bytes'), bytes);
      // With swap accounting, swap counts too: the bound is on memory plus swap.
      const swap = path.join(memory, 'memory.memsw.limit_in_bytes');
      if (existsSync(swap)) await writeFile(swap, bytes);
      await writeFile(path.join(folder('pids'), 'pids.max'), String(limits.pids));
      await writeFile(path.join(folder('cpu'), 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
      await writeFile(
        path.join(folder('cpu'), 'cpu.cfs_quota_us'),
        String(Math.round(limits.cpuCount * CPU_PERIOD_US)),
      );
    };
    const freezer = folder('freezer');
    const setState = async (state: 'FROZEN' | 'THAWED') => {
      const file = path.join(freezer, 'freezer.state');
      await writeFile(file, state);
      // Freezing is asynchronous: FREEZING until every task has stopped.
      for (let i = 0; i < 400; i++) {
        if ((await readFile(file, 'utf8')).trim() === state) return;
        await delay(5);
      }
      throw new Error(`the freezer cgroup ${freezer} did not reach ${state} within 2 s`);
    };
    const accounting = this.mounts.has(CPU_ACCOUNTING) ? folder(CPU_ACCOUNTING) : undefined;
    return {
      folders: this.controllers.map(folder),
      limit,
      freeze: () => setState('FROZEN'),
      thaw: () => setState('THAWED'),
      members: () => procs(freezer),
      usage: async () => {
        const memory = folder('memory');
        const nanos =
          accounting === undefined
            ? undefined
            : await counter(path.join(accounting, 'cpuacct.usage'));
        const stat = path.join(memory, 'memory.stat');
        return {
          cpuMicros: nanos === undefined ? undefined : Math.floor(nanos / 1000),
          memoryBytes: (await counter(path.join(memory, 'memory.usage_in_bytes'))) ?? 0,
          cacheBytes: (await counter(stat, 'total_cache')) ?? (await counter(stat, 'cache')) ?? 0,
        };
      },
      remove: async () => {
        // A frozen task takes its SIGKILL only once thawed.
        const thaw = () =>
          writeFile(path.join(freezer, 'freezer.state'), 'THAWED').catch(() => undefined);
        await thaw();
        await emptied(freezer, thaw);
        for (const controller of this.controllers) {
          await emptied(folder(controller), async () => undefined);
          await rmdir(folder(controller)).catch(() => undefined);
        }
      },
    };
  }

  async sweep(): Promise<number> {
    const names = await readdir(this.scopeFolder('freezer'), { withFileTypes: true }).catch(
      () => [],
    );
    const leftovers = names.filter((entry) => entry.isDirectory()).map((entry) => entry.name);
    for (const name of leftovers) {
      const freezer = path.join(this.scopeFolder('freezer'), name);
      const thaw = () =>
        writeFile(path.join(freezer, 'freezer.state'), 'THAWED').catch(() => undefined);
      await emptied(freezer, thaw);
    }
    for (const controller of this.controllers) {
      for (const name of await readdir(this.scopeFolder(controller)).catch(() => [] as string[])) {
        await rmdir(path.join(this.scopeFolder(controller), name)).catch(() => undefined);
      }
    }
    return leftovers.length;
  }

  async release(): Promise<void> {
    for (const controller of this.controllers) {
      await rmdir(this.scopeFolder(controller)).catch(() => undefined);
    }
  }
}

class CgroupsV2 implements Cgroups {
  readonly description = 'cgroup v2 (memory, pids, cpu, freeze)';
  private readonly base: string;

  constructor(
    private readonly root: string,
    scope: string,
  ) {
    this.base = path.join(root, 'moat', scope);
  }

  /** Controllers reach a cgroup only when every ancestor hands them down. */
  private async delegate(): Promise<void> {
    await mkdir(this.base, { recursive: true });
    for (const folder of [this.root, path.dirname(this.base), this.base]) {
      await writeFile(path.join(folder, 'cgroup.subtree_control'), '+memory +pids +cpu');
    }
  }

  async make(name: string): Promise<SandboxCgroup> {
    await this.delegate();
    const folder = path.join(this.base, name);
    await mkdir(folder, { recursive: true });
    const limit = async (limits: SandboxLimits) => {
      await writeFile(path.join(folder, 'memory.max'), String(limits.memoryMB * 2 ** 20));
      const swap = path.join(folder, 'memory.swap.max');
      if (existsSync(swap)) await writeFile(swap, '0');
      await writeFile(path.join(folder, 'pids.max'), String(limits.pids));
      await writeFile(
        path.join(folder, 'cpu.max'),
        `${Math.round(limits.cpuCount * CPU_PERIOD_US)} ${CPU_PERIOD_US}`,
      );
    };
    const freeze = async (value: '0' | '1') => {
      await writeFile(path.join(folder, 'cgroup.freeze'), value);
      for (let i = 0; i < 400; i++) {
        const events = await readFile(path.join(folder, 'cgroup.events'), 'utf8');
        if (events.includes(`frozen ${value}`)) return;
        await delay(5);
      }
      throw new Error(
        `the cgroup ${folder} did not ${value === '1' ? 'freeze' : 'thaw'} within 2 s`,
      );
    };
    return {
      folders: [folder],
      limit,
      freeze: () => freeze('1'),
      thaw: () => freeze('0'),
      members: () => procs(folder),
      usage: async () => ({
        cpuMicros: await counter(path.join(folder, 'cpu.stat'), 'usage_usec'),
        memoryBytes: (await counter(path.join(folder, 'memory.current'))) ?? 0,
        cacheBytes: (await counter(path.join(folder, 'memory.stat'), 'file')) ?? 0,
      }),
      remove: async () => {
        await writeFile(path.join(folder, 'cgroup.kill'), '1').catch(() => undefined);
        await emptied(folder, () =>
          writeFile(path.join(folder, 'cgroup.freeze'), '0').catch(() => undefined),
        );
        await rmdir(folder).catch(() => undefined);
      },
    };
  }

  async sweep(): Promise<number> {
    const names = await readdir(this.base, { withFileTypes: true }).catch(() => []);
    const leftovers = names.filter((entry) => entry.isDirectory()).map((entry) => entry.name);
    for (const name of leftovers) {
      const folder = path.join(this.base, name);
      await writeFile(path.join(folder, 'cgroup.kill'), '1').catch(() => undefined);
      await emptied(folder, async () => undefined);
      await rmdir(folder).catch(() => undefined);
    }
    return leftovers.length;
  }

  async release(): Promise<void> {
    await rmdir(this.base).catch(() => undefined);
  }
}
