/**
 * Holding every process of one sandbox, so that pause freezes all of them and kill ends all of
 * them, including children that forked, double-forked or called setsid.
 *
 * With a writable cgroup v1 freezer (root on the usual Linux host) each sandbox gets its own
 * cgroup: a process joins it before it execs (the shell wrapper below writes its own pid into
 * cgroup.procs first), so nothing it starts can be outside. Without one, each process leads its
 * own process group, and pause/kill signal the groups: a process that leaves its group escapes,
 * which start-up reports.
 */
import { existsSync, mkdirSync } from 'node:fs';
import { readdir, readFile, rmdir, writeFile } from 'node:fs/promises';
import path from 'node:path';

const FREEZER_ROOT = '/sys/fs/cgroup/freezer';

export interface Containment {
  /**
   * Whether each command may lead its own process group. Without a cgroup, pause and kill reach
   * commands only as members of their launcher's group, so they stay in it.
   */
  readonly ownGroups: boolean;
  /** The argv that starts `argv` inside the containment. */
  wrap(argv: readonly string[]): string[];
  /** A spawned process (its pid leads a process group). */
  track(pid: number): void;
  untrack(pid: number): void;
  pause(): Promise<void>;
  resume(): Promise<void>;
  /** SIGKILL to everything inside; resolves when nothing is left. */
  killAll(): Promise<void>;
}

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // Already gone.
  }
}

/** Signals process groups: the fallback when no freezer cgroup can be made. */
export class ProcessGroups implements Containment {
  readonly ownGroups = false;
  private readonly leaders = new Set<number>();

  wrap(argv: readonly string[]): string[] {
    return [...argv];
  }

  track(pid: number): void {
    this.leaders.add(pid);
  }

  untrack(pid: number): void {
    this.leaders.delete(pid);
  }

  async pause(): Promise<void> {
    for (const pid of this.leaders) signal(-pid, 'SIGSTOP');
  }

  async resume(): Promise<void> {
    for (const pid of this.leaders) signal(-pid, 'SIGCONT');
  }

  async killAll(): Promise<void> {
    for (const pid of this.leaders) {
      signal(-pid, 'SIGKILL');
      signal(-pid, 'SIGCONT');
    }
    this.leaders.clear();
  }
}

/**
 * One freezer cgroup per sandbox under `<freezer>/moat/<scope>/<sandboxID>`, where the scope
 * names one Moat (its data folder): several Moats on a host never touch each other's cgroups.
 */
export class FreezerCgroup implements Containment {
  readonly ownGroups = true;
  private constructor(readonly dir: string) {}

  /** Whether this host lets us make freezer cgroups (root with cgroup v1 mounted). */
  static available(): boolean {
    return existsSync(path.join(FREEZER_ROOT, 'cgroup.procs'));
  }

  /** The cgroup itself is made when the sandbox starts its first process. */
  static for(scope: string, sandboxID: string): FreezerCgroup {
    return new FreezerCgroup(path.join(FREEZER_ROOT, 'moat', scope, sandboxID));
  }

  private made = false;

  /**
   * Kills whatever a previous run of this Moat left in its cgroups (processes do not survive a
   * restart; unconfined ones would otherwise linger as orphans) and removes them.
   */
  static async sweep(scope: string): Promise<number> {
    const parent = path.join(FREEZER_ROOT, 'moat', scope);
    const entries = await readdir(parent, { withFileTypes: true }).catch(() => []);
    const leftovers = entries.filter((e) => e.isDirectory());
    for (const entry of leftovers) await new FreezerCgroup(path.join(parent, entry.name)).killAll();
    return leftovers.length;
  }

  /** Removes this Moat's cgroup folder once its sandboxes' cgroups are gone. */
  static async release(scope: string): Promise<void> {
    await rmdir(path.join(FREEZER_ROOT, 'moat', scope)).catch(() => undefined);
  }

  wrap(argv: readonly string[]): string[] {
    if (!this.made) {
      mkdirSync(this.dir, { recursive: true });
      this.made = true;
    }
    // The shell moves itself into the cgroup, then becomes the command: no window in which the
    // command (or anything it forks) runs outside.
    return [
      '/bin/sh',
      '-c',
      'echo $$ > "$0" && exec "$@"',
      path.join(this.dir, 'cgroup.procs'),
      ...argv,
    ];
  }

  track(): void {}

  untrack(): void {}

  async pause(): Promise<void> {
    if (existsSync(this.dir)) await this.setState('FROZEN');
  }

  async resume(): Promise<void> {
    if (existsSync(this.dir)) await this.setState('THAWED');
  }

  async killAll(): Promise<void> {
    for (let round = 0; round < 100; round++) {
      const pids = await this.members();
      if (pids.length === 0) break;
      for (const pid of pids) signal(pid, 'SIGKILL');
      // A frozen task takes its SIGKILL only once thawed.
      await writeFile(path.join(this.dir, 'freezer.state'), 'THAWED').catch(() => undefined);
      await delay(10);
    }
    await rmdir(this.dir).catch(() => undefined);
    this.made = false;
  }

  private async members(): Promise<number[]> {
    const text = await readFile(path.join(this.dir, 'cgroup.procs'), 'utf8').catch(() => '');
    return text
      .split('\n')
      .filter((line) => line !== '')
      .map(Number);
  }

  private async setState(state: 'FROZEN' | 'THAWED'): Promise<void> {
    const file = path.join(this.dir, 'freezer.state');
    await writeFile(file, state);
    // Freezing is asynchronous: FREEZING until every task has stopped.
    for (let i = 0; i < 200; i++) {
      if ((await readFile(file, 'utf8')).trim() === state) return;
      await delay(5);
    }
    throw new Error(`the freezer cgroup ${this.dir} did not reach ${state} within 1 s`);
  }
}
