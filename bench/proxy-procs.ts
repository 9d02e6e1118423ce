/**
 * Child processes of `npm run bench:proxy`: every one is tracked, bounded in time (`timeout`
 * for external commands, a lifetime argument for the forked scripts), ended with SIGTERM when
 * this process dies (`setpriv --pdeathsig`), and stopped by `stopChildren` on exit, error,
 * SIGINT and SIGTERM. Plus squid (installed with apt-get when missing, started with a minimal
 * loopback-only configuration) and per-process CPU accounting from /proc.
 */
import { type ChildProcess, fork, spawn, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, closeSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
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

// Last resort (an exit that skipped stopChildren).
process.on('exit', () => {
  for (const child of children) child.kill('SIGTERM');
});

export function has(command: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${command}`], { stdio: 'ignore' }).status === 0;
}

const HAS_SETPRIV = has('setpriv');

/**
 * Spawns a command bounded in time (`timeout`, which passes SIGTERM on), and ended with SIGTERM
 * if this process dies without cleaning up (`setpriv --pdeathsig`).
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

/** Forks a bench script (path relative to this file) and waits for its `{ ready }` message. */
export async function forkReady<T>(
  script: string,
  args: string[],
  execArgv: string[],
  logFile: string,
): Promise<{ child: ChildProcess; ready: T }> {
  const log = openSync(logFile, 'a');
  const child = track(
    fork(fileURLToPath(new URL(script, import.meta.url)), args, {
      execArgv,
      stdio: ['ignore', log, log, 'ipc'],
    }),
  );
  closeSync(log);
  const ready = await new Promise<T>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${script} did not start within 60 s; see ${logFile}`)),
      60_000,
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

/** A free TCP port on 127.0.0.1 (for squid, which cannot be told port 0). */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  const port = await new Promise<number>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve((server.address() as net.AddressInfo).port));
  });
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------------------------
// CPU accounting

const CLOCK_TICKS = Number(
  spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout?.trim() || 100,
);

/** User + system CPU seconds a process (all its threads) has used so far; NaN when gone. */
export function cpuSeconds(pid: number | undefined): number {
  if (pid === undefined) return Number.NaN;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return Number.NaN;
  }
}

/** The process that `timeout` (under setpriv, which execs) runs. */
export function commandPid(timeoutPid: number): number | undefined {
  try {
    const text = readFileSync(`/proc/${timeoutPid}/task/${timeoutPid}/children`, 'utf8').trim();
    const pid = Number(text.split(/\s+/)[0]);
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/** Share of the machine's CPU time that was busy over `ms` (other work on the machine). */
export async function machineBusy(ms: number): Promise<number> {
  const a = machineCpu();
  await sleep(ms);
  const b = machineCpu();
  return b.total === a.total ? 0 : (b.busy - a.busy) / (b.total - a.total);
}

/** CPU seconds of the whole machine so far: busy (not idle, not iowait) and total. */
export function machineCpu(): { busy: number; total: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1);
  // user nice system idle iowait irq softirq steal (guest time is already in user).
  const values = fields.slice(0, 8).map(Number);
  const idle = (values[3] ?? 0) + (values[4] ?? 0);
  const total = values.reduce((a, b) => a + b, 0);
  return { busy: (total - idle) / CLOCK_TICKS, total: total / CLOCK_TICKS };
}

// ---------------------------------------------------------------------------------------------
// squid

/** Installs squid from Debian when it is missing (as root), and never leaves its service up. */
export function ensureSquid(log: (line: string) => void): void {
  if (has('squid')) return;
  if (process.getuid?.() !== 0)
    throw new Error('squid is missing; install it with: sudo apt-get install -y squid');
  const run = (args: string[]) => {
    log(`bench:proxy: squid missing; running: ${args.join(' ')}`);
    const result = spawnSync(args[0]!, args.slice(1), {
      stdio: ['ignore', 'inherit', 'inherit'],
      env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
      timeout: 600_000,
    });
    if (result.status !== 0) throw new Error(`${args.join(' ')} failed (${result.status})`);
  };
  run(['apt-get', 'update']);
  run(['apt-get', 'install', '-y', '--no-install-recommends', 'squid']);
  if (!has('squid')) throw new Error('squid still missing after apt-get install');
  stopSystemSquid(log);
}

/**
 * The Debian package starts a squid service on 0.0.0.0:3128 where services may start. Stop it
 * (when it runs) so nothing listens beyond loopback and it takes no CPU during the run.
 */
export function stopSystemSquid(log: (line: string) => void): void {
  let pid: number | undefined;
  try {
    pid = Number(readFileSync('/run/squid.pid', 'utf8').trim());
  } catch {
    return;
  }
  if (!Number.isInteger(pid) || pid <= 0) return;
  try {
    process.kill(pid, 0);
  } catch {
    return;
  }
  log(`bench:proxy: a system squid (pid ${pid}) is running; stopping it with squid -k shutdown`);
  spawnSync('squid', ['-k', 'shutdown'], { stdio: 'ignore', timeout: 30_000 });
}

export function squidVersion(): string {
  const result = spawnSync('squid', ['-v'], { encoding: 'utf8', timeout: 5000 });
  return /Version (\S+)/.exec(result.stdout ?? '')?.[1] ?? '?';
}

export interface RunningSquid {
  readonly port: number;
  readonly config: string;
  readonly child: ChildProcess;
  pid(): number | undefined;
}

/**
 * squid in the foreground (-N, one process), with a minimal configuration in `dir`: loopback
 * only (HTTP port, DNS socket), access for localhost alone, no cache, no access log, the
 * origin's name from a hosts_file (no DNS query needed). As root, squid drops to its default
 * effective user (proxy), so `dir` is made readable and its log writable for that user.
 */
export async function startSquid(
  dir: string,
  originIp: string,
  originName: string,
  lifetimeSeconds: number,
): Promise<RunningSquid> {
  const port = await freePort();
  const file = (name: string) => join(dir, name);
  writeFileSync(file('hosts'), `${originIp} ${originName}\n`);
  const config = [
    `http_port 127.0.0.1:${port}`,
    'http_access allow localhost',
    'http_access deny all',
    'cache deny all',
    'cache_mem 0 MB',
    `hosts_file ${file('hosts')}`,
    // Never asked (the hosts_file answers); on loopback all the same, as is squid's DNS socket.
    'dns_nameservers 127.0.0.1',
    'udp_incoming_address 127.0.0.1',
    'udp_outgoing_address 127.0.0.1',
    `pid_filename ${file('squid.pid')}`,
    `cache_log ${file('squid-cache.log')}`,
    'access_log none',
    'cache_store_log none',
    'logfile_rotate 0',
    `coredump_dir ${dir}`,
    'netdb_filename none',
    'pinger_enable off',
    'client_db off',
    'shutdown_lifetime 0 seconds',
    'max_filedescriptors 16384',
  ].join('\n');
  writeFileSync(file('squid.conf'), `${config}\n`);
  writeFileSync(file('squid-cache.log'), '');
  chmodSync(dir, 0o755);
  const proxyUser = spawnSync('id', ['-u', 'proxy'], { encoding: 'utf8' });
  const uid = Number(proxyUser.stdout?.trim());
  if (process.getuid?.() === 0 && proxyUser.status === 0 && Number.isInteger(uid)) {
    chownSync(dir, uid, -1);
    chownSync(file('squid-cache.log'), uid, -1);
  }
  const parse = spawnSync('squid', ['-k', 'parse', '-f', file('squid.conf')], {
    encoding: 'utf8',
    timeout: 20_000,
  });
  if (parse.status !== 0) throw new Error(`squid -k parse failed:\n${parse.stderr}`);
  const log = openSync(file('squid.out'), 'a');
  const child = spawnBounded(lifetimeSeconds, ['squid', '-N', '-f', file('squid.conf')], {
    stdio: ['ignore', log, log],
  });
  closeSync(log);
  // Ready when the port accepts connections (15 s at most).
  for (let attempt = 0; ; attempt++) {
    if (child.exitCode !== null)
      throw new Error(`squid exited with ${child.exitCode}; see ${file('squid-cache.log')}`);
    const open = await new Promise<boolean>((resolve) => {
      const socket = net.connect({ host: '127.0.0.1', port }, () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
    });
    if (open) break;
    if (attempt >= 150) throw new Error(`squid did not listen on ${port} within 15 s`);
    await sleep(100);
  }
  return { port, config, child, pid: () => (child.pid ? commandPid(child.pid) : undefined) };
}
