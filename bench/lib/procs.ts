/**
 * Child processes of the process-level benchmarks (`npm run bench:dns`, `npm run bench:proxy`):
 * every one is tracked, bounded in time (`timeout` for external commands, a lifetime argument
 * for the forked scripts), ended with SIGTERM when this process dies (`setpriv --pdeathsig`),
 * and stopped by `stopChildren` on exit, error, SIGINT and SIGTERM. Plus per-process and
 * machine CPU accounting from /proc.
 */
import { type ChildProcess, fork, spawn, spawnSync } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const children = new Set<ChildProcess>();

export function track(child: ChildProcess): ChildProcess {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

/** SIGTERM to every child still running, SIGKILL to those that have not gone after 3 s. */
export async function stopChildren(): Promise<void> {
  const running = [...children].filter((c) => c.exitCode === null && c.signalCode === null);
  const exited = running.map(
    (c) =>
      new Promise<void>((resolve) => (c.exitCode !== null ? resolve() : c.once('exit', resolve))),
  );
  for (const child of running) child.kill('SIGTERM');
  const timer = setTimeout(() => {
    for (const child of running) if (child.exitCode === null) child.kill('SIGKILL');
  }, 3000);
  await Promise.all(exited);
  clearTimeout(timer);
}

/** Stops one tracked child (SIGTERM, then SIGKILL after 3 s). */
export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
  await exited;
  clearTimeout(timer);
}

// Last resort (an exit that skipped stopChildren): SIGTERM, which `timeout` passes on to the
// commands it runs, and on which the forked scripts exit.
process.on('exit', () => {
  for (const child of children) child.kill('SIGTERM');
});

/**
 * Runs `run` with a fresh scratch folder (`<tmp>/<prefix>XXXXXX`), then stops every child and
 * removes the folder, or keeps it when `keep`; on SIGINT or SIGTERM too, then exits with 130.
 * `label` prefixes the signal message (e.g. "bench:dns").
 */
export async function runInScratchFolder(
  label: string,
  prefix: string,
  keep: boolean,
  run: (dir: string) => Promise<void>,
): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const stop = async () => {
    await stopChildren();
    if (keep) console.log(`Scratch folder kept: ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  };
  const onSignal = (signal: NodeJS.Signals) => {
    console.error(`${label}: ${signal}, stopping`);
    void stop().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    await run(dir);
  } finally {
    await stop();
  }
}

export function has(command: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${command}`], { stdio: 'ignore' }).status === 0;
}

const HAS_SETPRIV = has('setpriv');

/**
 * Spawns and tracks a command bounded in time (`timeout`, which passes SIGTERM on), and ended
 * with SIGTERM if this process dies without cleaning up (`setpriv --pdeathsig`). The pid of the
 * command itself is `commandPid(child.pid)`.
 */
export function spawnBounded(
  seconds: number,
  command: string[],
  options: Parameters<typeof spawn>[2],
): ChildProcess {
  const bounded = ['timeout', '-k', '2', String(Math.ceil(seconds)), ...command];
  const argv = HAS_SETPRIV ? ['setpriv', '--pdeathsig', 'TERM', ...bounded] : bounded;
  return track(spawn(argv[0]!, argv.slice(1), options));
}

/** The bench folder, which `script` paths below are relative to. */
const BENCH_DIR = new URL('../', import.meta.url);

/** Forks and tracks a bench script (path relative to the bench folder), logging to `logFile`. */
export function forkTracked(
  script: string,
  args: string[],
  execArgv: string[],
  logFile: string,
): ChildProcess {
  const log = openSync(logFile, 'a');
  const child = track(
    fork(fileURLToPath(new URL(script, BENCH_DIR)), args, {
      execArgv,
      stdio: ['ignore', log, log, 'ipc'],
    }),
  );
  closeSync(log);
  return child;
}

/** Waits for a forked script's `{ ready }` message; rejects on exit or after `timeoutMs`. */
export function waitReady<T>(
  child: ChildProcess,
  script: string,
  logFile: string,
  timeoutMs: number,
): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(
      () =>
        reject(new Error(`${script} did not start within ${timeoutMs / 1000} s; see ${logFile}`)),
      timeoutMs,
    );
    const onExit = (code: number | null) => {
      clearTimeout(timer);
      let tail = '';
      try {
        tail = readFileSync(logFile, 'utf8').split('\n').slice(-12).join('\n');
      } catch {}
      reject(new Error(`${script} exited with ${code} before it was ready; its log:\n${tail}`));
    };
    child.once('exit', onExit);
    child.on('message', function onMessage(message: { ready?: T }) {
      if (message?.ready === undefined) return;
      clearTimeout(timer);
      child.off('exit', onExit);
      child.off('message', onMessage);
      resolve(message.ready);
    });
  });
}

/** Forks a bench script (path relative to the bench folder) and waits for its `{ ready }`. */
export async function forkReady<T>(
  script: string,
  args: string[],
  execArgv: string[],
  logFile: string,
  timeoutMs: number,
): Promise<{ child: ChildProcess; ready: T }> {
  const child = forkTracked(script, args, execArgv, logFile);
  const ready = await waitReady<T>(child, script, logFile, timeoutMs);
  return { child, ready };
}

/** Sends `request` to a forked child and waits for a reply holding `key`, or undefined. */
export function ask<T>(
  child: ChildProcess,
  request: unknown,
  key: string,
  timeoutMs: number,
): Promise<T | undefined> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      child.off('message', listener);
      child.off('exit', onExit);
      resolve(undefined);
    }, timeoutMs);
    const onExit = () => {
      clearTimeout(timer);
      child.off('message', listener);
      resolve(undefined);
    };
    const listener = (message: Record<string, unknown>) => {
      if (message?.[key] === undefined) return;
      clearTimeout(timer);
      child.off('message', listener);
      child.off('exit', onExit);
      resolve(message as T);
    };
    child.on('message', listener);
    child.once('exit', onExit);
    if (!child.connected) return onExit();
    child.send(request as Parameters<ChildProcess['send']>[0], (error) => {
      if (error) onExit();
    });
  });
}

/**
 * Ends a bench child with its parent (the IPC channel closing), on SIGTERM or SIGINT, and after
 * `lifetimeSeconds` whatever happens: `stop` runs once, then the process exits.
 */
export function endWithParent(
  lifetimeSeconds: number,
  stop: () => Promise<unknown> | unknown = () => undefined,
): void {
  let stopping = false;
  const end = () => {
    if (stopping) return;
    stopping = true;
    void Promise.resolve()
      .then(stop)
      .finally(() => process.exit(0));
  };
  setTimeout(end, lifetimeSeconds * 1000).unref();
  for (const event of ['disconnect', 'SIGTERM', 'SIGINT'] as const) process.on(event, end);
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------------------------
// CPU accounting

const CLOCK_TICKS = Number(
  spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout?.trim() || 100,
);

/** User and system CPU seconds a process (all its threads) has used so far; throws when gone. */
export function processCpu(pid: number): { user: number; sys: number } {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // Fields after the command name, which is in parentheses and may hold spaces.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { user: Number(fields[11]) / CLOCK_TICKS, sys: Number(fields[12]) / CLOCK_TICKS };
}

/** User + system CPU seconds a process (all its threads) has used so far; NaN when gone. */
export function cpuSeconds(pid: number | undefined): number {
  if (pid === undefined) return Number.NaN;
  try {
    const { user, sys } = processCpu(pid);
    return user + sys;
  } catch {
    return Number.NaN;
  }
}

/**
 * CPU seconds of a process and every descendant it has now (squid's helpers, say); NaN when
 * the process is gone. Descendants that exited since are not counted.
 */
export function treeCpuSeconds(pid: number | undefined): number {
  if (pid === undefined) return Number.NaN;
  let total = 0;
  const pending = [pid];
  for (let seen = 0; pending.length > 0 && seen < 1000; seen++) {
    const next = pending.pop()!;
    const cpu = cpuSeconds(next);
    if (!Number.isFinite(cpu)) {
      if (next === pid) return Number.NaN;
      continue;
    }
    total += cpu;
    try {
      for (const task of readdirSync(`/proc/${next}/task`)) {
        const text = readFileSync(`/proc/${next}/task/${task}/children`, 'utf8').trim();
        for (const child of text.split(/\s+/).filter(Boolean)) pending.push(Number(child));
      }
    } catch {
      // Gone meanwhile.
    }
  }
  return total;
}

/** The process that `timeout` runs (setpriv and taskset exec theirs, so it is the command). */
export function commandPid(timeoutPid: number): number | undefined {
  try {
    const text = readFileSync(`/proc/${timeoutPid}/task/${timeoutPid}/children`, 'utf8').trim();
    const pid = Number(text.split(/\s+/)[0]);
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The heading every benchmark prints: its title, the machine, the scratch folder, and a warning
 * when other work already keeps the machine busy.
 */
export async function printHeading(title: string, dir: string): Promise<void> {
  const busy = await machineBusy(500);
  console.log(`# ${title}\n`);
  console.log(
    `Machine: ${cpus().length} x ${cpus()[0]?.model.trim() ?? '?'}, Node ${process.version}. ` +
      `Scratch folder ${dir}.`,
  );
  if (busy > 0.15) {
    console.log(
      `WARNING: the machine was ${Math.round(busy * 100)}% busy before the run (other ` +
        'processes); expect noisy numbers.',
    );
  }
}

/** Share of the machine's CPU time that was busy over `ms` (other work on the machine). */
export async function machineBusy(ms: number): Promise<number> {
  const a = machineCpu();
  await sleep(ms);
  const b = machineCpu();
  return b.total === a.total ? 0 : (b.busy - a.busy) / (b.total - a.total);
}

/**
 * CPU seconds of the whole machine so far: busy (not idle, not iowait), total, and two parts of
 * busy that no process is charged for: stolen (a virtual machine's CPUs running its host's
 * other guests) and softirq (the kernel's deferred network work, loopback TCP included).
 */
export function machineCpu(): { busy: number; total: number; stolen: number; softirq: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1);
  // user nice system idle iowait irq softirq steal (guest time is already in user).
  const values = fields.slice(0, 8).map(Number);
  const idle = (values[3] ?? 0) + (values[4] ?? 0);
  const total = values.reduce((a, b) => a + b, 0);
  return {
    busy: (total - idle) / CLOCK_TICKS,
    total: total / CLOCK_TICKS,
    stolen: (values[7] ?? 0) / CLOCK_TICKS,
    softirq: (values[6] ?? 0) / CLOCK_TICKS,
  };
}
