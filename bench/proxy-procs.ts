/**
 * squid for `npm run bench:proxy`: installed with apt-get when missing, started with a minimal
 * loopback-only configuration as a bounded, tracked child (see lib/procs.ts).
 */
import { type ChildProcess, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, closeSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { commandPid, has, sleep, spawnBounded } from './lib/procs.js';

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

// ---------------------------------------------------------------------------------------------
// squid

/** Whether the installed squid was built with OpenSSL (what ssl_bump needs). */
export function squidHasOpenssl(): boolean {
  const result = spawnSync('squid', ['-v'], { encoding: 'utf8', timeout: 5000 });
  return (result.stdout ?? '').includes('--with-openssl');
}

/**
 * Installs squid from Debian when it is missing (as root), and never leaves its service up.
 * `openssl`: a build with OpenSSL is required (ssl_bump): Debian's squid-openssl, which
 * replaces the squid package (apt-get handles the conflict). As scripts/system-packages.mjs:
 * install from the package lists there are, fetch them once and retry when that fails.
 */
export function ensureSquid(
  log: (line: string) => void,
  options: { readonly openssl?: boolean } = {},
): void {
  const wanted = options.openssl === true ? 'squid-openssl' : 'squid';
  const present = () => has('squid') && (options.openssl !== true || squidHasOpenssl());
  if (present()) return;
  if (process.getuid?.() !== 0)
    throw new Error(`${wanted} is missing; install it with: sudo apt-get install -y ${wanted}`);
  const run = (args: string[]) => {
    log(`${wanted} missing; running: ${args.join(' ')}`);
    return (
      spawnSync(args[0]!, args.slice(1), {
        stdio: ['ignore', 'inherit', 'inherit'],
        env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
        timeout: 600_000,
      }).status === 0
    );
  };
  const install = () => run(['apt-get', 'install', '-y', '--no-install-recommends', wanted]);
  if (!install()) {
    if (!run(['apt-get', 'update'])) throw new Error('apt-get update failed');
    if (!install()) throw new Error(`apt-get install ${wanted} failed`);
  }
  if (!present()) throw new Error(`${wanted} still missing after apt-get install`);
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

/** Extra configuration for squid: options of its http_port line, and lines appended. */
export interface SquidExtras {
  /** Appended to `http_port 127.0.0.1:<port>` (e.g. ssl-bump and its certificate). */
  readonly portOptions?: string;
  readonly config?: readonly string[];
}

/** The uid squid drops to as root (Debian's `proxy`), undefined when not root or unknown. */
export function squidUid(): number | undefined {
  if (process.getuid?.() !== 0) return undefined;
  const proxyUser = spawnSync('id', ['-u', 'proxy'], { encoding: 'utf8' });
  const uid = Number(proxyUser.stdout?.trim());
  return proxyUser.status === 0 && Number.isInteger(uid) ? uid : undefined;
}

/**
 * squid in the foreground (-N, one process), with a minimal configuration in `dir`: loopback
 * only (HTTP port, DNS socket), access for localhost alone, no cache, no access log, the
 * origin's names from a hosts_file (no DNS query needed), plus `extras`. As root, squid drops
 * to its default effective user (proxy), so `dir` is made readable and its log writable for
 * that user.
 */
export async function startSquid(
  dir: string,
  originIp: string,
  originNames: string | readonly string[],
  lifetimeSeconds: number,
  extras: SquidExtras = {},
): Promise<RunningSquid> {
  const port = await freePort();
  const file = (name: string) => join(dir, name);
  const names = typeof originNames === 'string' ? [originNames] : originNames;
  writeFileSync(file('hosts'), names.map((name) => `${originIp} ${name}\n`).join(''));
  const config = [
    `http_port 127.0.0.1:${port}${extras.portOptions ? ` ${extras.portOptions}` : ''}`,
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
    ...(extras.config ?? []),
  ].join('\n');
  writeFileSync(file('squid.conf'), `${config}\n`);
  writeFileSync(file('squid-cache.log'), '');
  chmodSync(dir, 0o755);
  const uid = squidUid();
  if (uid !== undefined) {
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
