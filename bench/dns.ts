/**
 * `npm run bench:dns`: Moat's DNS interceptor against dnsmasq (a caching forwarder), both in
 * front of the same fake upstream on loopback, measured with dnsperf in the same run.
 *
 * Workloads: (a) cache hits, 10 names (new ones each round) asked over and over after a pass
 * that warms the cache; (b) forwarding, a distinct name for every query (`-n 1` over a file
 * longer than the run can send), so every query is a cache miss and goes upstream. Each round measures every server
 * once per workload, the order rotating from round to round, and medians are reported; the
 * upstream is measured alone too (its QPS is the ceiling for forwarding). Targets: cache-hit
 * QPS at least dnsmasq's, forwarding QPS at least half of dnsmasq's. For reference, forwarding
 * is also measured against dnsmasq without a cache (its forwarding path alone), and one run per
 * server at a fixed offered load gives latency below saturation and CPU time per query.
 *
 * Processes, all on loopback (nothing else is ever addressed; dnsperf sends from 127.77.0.2):
 * - fake upstream: bench/dns-upstream.ts, a Node UDP server answering by pattern;
 * - Moat: bench/dns-moat.ts, what `moat serve` runs (startMoat) plus one registered sandbox
 *   (this version has no API to register one, and unknown sources are REFUSED);
 * - dnsmasq, twice: `--no-resolv --no-hosts --server=127.0.0.1#<upstream>` on ports of their
 *   own, with --cache-size=10000 and with --cache-size=0;
 * - dnsperf, one run at a time.
 * With two CPUs or more, the server under test is pinned to the last CPU and dnsperf, the
 * upstream and this script to the first (taskset), so that each server gets one core.
 * dnsperf and dnsmasq come from Debian (`dnsperf`, `dnsmasq-base`); when missing they are
 * installed with apt-get (as root). `dnsmasq-base` is the binary without the Debian service, so
 * nothing starts on port 53.
 *
 * Options: `--help`. Everything is bounded: each child process has a time limit, and is stopped
 * on exit, error, SIGINT and SIGTERM, and when this process dies.
 */
import { type ChildProcess, spawnSync } from 'node:child_process';
import dgram from 'node:dgram';
import { closeSync, openSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import net from 'node:net';
import { cpus } from 'node:os';
import { join } from 'node:path';
import {
  ask,
  commandPid,
  forkTracked,
  has,
  machineBusy,
  processCpu,
  runInScratchFolder,
  sleep,
  spawnBounded,
  stopChildren,
  waitReady,
} from './lib/procs.js';
import { choice, flag, list, readOptions, text, whole } from './lib/options.js';
import { summariseProfile } from './lib/profile.js';
import { formatInt, formatMs, formatRatio, markdownTable } from './lib/table.js';

const HOST = '127.0.0.1';
/** Where dnsperf sends from; the sandbox Moat knows is registered with this address. */
const CLIENT_ADDRESS = '127.77.0.2';
const HIT_NAMES = 10;
const UPSTREAM_TTL_SECONDS = 3600;
const TARGETS = { hitRatio: 1, forwardRatio: 0.5 };
/** Offered load of the fixed-rate runs: below every server's saturation on a small machine. */
const FIXED_QPS: Record<'hit' | 'fwd', number> = { hit: 20_000, fwd: 2_000 };
const FIXED_SECONDS = 4;

/** dnsmasq0: dnsmasq with --cache-size=0, a forwarding-only reference (see the report). */
type Server = 'moat' | 'dnsmasq' | 'dnsmasq0';
type Workload = 'hit' | 'fwd';

interface Options {
  readonly rounds: number;
  readonly seconds: number;
  readonly clients: number;
  readonly outstanding: number;
  readonly workloads: readonly Workload[];
  readonly profile: boolean;
  /** Extra node flags for the Moat process (experiments), e.g. "--max-semi-space-size=64". */
  readonly nodeFlags: readonly string[];
  /** Pin the server under test to the last CPU, dnsperf and the upstream to the first. */
  readonly pin: boolean;
  /** The upstream gives every name the same address (isolates Moat's learned-address table). */
  readonly sharedAddress: boolean;
  /** Keep the scratch folder (query files, logs, profiles) instead of removing it. */
  readonly keep: boolean;
  readonly strict: boolean;
  /** Moat's --dns-udp-io. */
  readonly udpIo: string;
}

// ---------------------------------------------------------------------------------------------
// Child processes (tracked, bounded and stopped by lib/procs.ts) and CPU pinning

/** CPUs for the server under test and for the load side (dnsperf, upstream), when pinning. */
let cpuSets: { server: string; load: string } | undefined;

/** `command args` run under `taskset -c <cpus>` when pinning. */
function pinned(role: 'server' | 'load', command: string, args: string[]): string[] {
  return cpuSets ? ['taskset', '-c', cpuSets[role], command, ...args] : [command, ...args];
}

/** Pins every thread of a running process (threads it makes later inherit the mask). */
function pinProcess(role: 'server' | 'load', pid: number | undefined): void {
  if (!cpuSets || pid === undefined) return;
  const result = spawnSync('taskset', ['-a', '-p', '-c', cpuSets[role], String(pid)], {
    stdio: 'ignore',
  });
  if (result.status !== 0) throw new Error(`taskset could not pin process ${pid}`);
}

/** Forks a bench script, pins it, and waits for its `{ ready: port }` message (15 s at most). */
async function forkServer(
  role: 'server' | 'load',
  script: string,
  args: string[],
  execArgv: string[],
  logFile: string,
): Promise<{ child: ChildProcess; port: number }> {
  const child = forkTracked(script, args, execArgv, logFile);
  pinProcess(role, child.pid);
  const port = await waitReady<number>(child, script, logFile, 15_000);
  return { child, port };
}

/** A port free for both UDP and TCP on 127.0.0.1 (for dnsmasq, which cannot be told port 0). */
async function freePort(): Promise<number> {
  for (let attempt = 0; attempt < 20; attempt++) {
    const server = net.createServer();
    const port = await new Promise<number>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, HOST, () => resolve((server.address() as net.AddressInfo).port));
    });
    const udp = dgram.createSocket('udp4');
    const free = await new Promise<boolean>((resolve) => {
      udp.once('error', () => resolve(false));
      udp.bind(port, HOST, () => resolve(true));
    });
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await new Promise<void>((resolve) => {
      try {
        udp.close(() => resolve());
      } catch {
        resolve();
      }
    });
    if (free) return port;
  }
  throw new Error('no free port found on 127.0.0.1');
}

// ---------------------------------------------------------------------------------------------
// Tools

function ensureTools(): void {
  const missing = ['dnsperf', 'dnsmasq'].filter((tool) => !has(tool));
  if (missing.length === 0) return;
  const packages = ['dnsperf', 'dnsmasq-base'];
  if (process.getuid?.() !== 0) {
    throw new Error(
      `${missing.join(' and ')} missing; install them with: sudo apt-get install -y ${packages.join(' ')}`,
    );
  }
  const run = (args: string[]) => {
    console.log(`bench:dns: ${missing.join(' and ')} missing; running: ${args.join(' ')}`);
    const result = spawnSync(args[0]!, args.slice(1), {
      stdio: ['ignore', 'inherit', 'inherit'],
      env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
      timeout: 600_000,
    });
    if (result.status !== 0) throw new Error(`${args.join(' ')} failed (${result.status})`);
  };
  run(['apt-get', 'update']);
  // dnsmasq-base: the dnsmasq binary alone, without the Debian service that would take port 53.
  run(['apt-get', 'install', '-y', '--no-install-recommends', ...packages]);
  const still = ['dnsperf', 'dnsmasq'].filter((tool) => !has(tool));
  if (still.length > 0) throw new Error(`${still.join(' and ')} still missing after apt-get`);
}

function toolVersion(command: string, args: string[], pattern: RegExp): string {
  const result = spawnSync(command, args, { encoding: 'utf8', timeout: 5000 });
  const match = pattern.exec(`${result.stdout}${result.stderr}`);
  return match?.[1] ?? '?';
}

// ---------------------------------------------------------------------------------------------
// DNS probe (readiness and sanity check)

function encodeQuery(id: number, name: string): Buffer {
  const labels = name.split('.');
  const out = Buffer.alloc(12 + labels.reduce((n, l) => n + 1 + l.length, 1) + 4);
  out.writeUInt16BE(id, 0);
  out.writeUInt16BE(0x0100, 2); // RD
  out.writeUInt16BE(1, 4);
  let i = 12;
  for (const label of labels) {
    out[i++] = label.length;
    i += out.write(label, i, 'latin1');
  }
  out[i++] = 0;
  out.writeUInt16BE(1, i); // A
  out.writeUInt16BE(1, i + 2); // IN
  return out;
}

/** One A query from `source`; resolves with the rcode and answer count, or undefined. */
function probe(
  port: number,
  name: string,
  source: string,
): Promise<{ rcode: number; answers: number } | undefined> {
  return new Promise((resolve) => {
    const socket = dgram.createSocket('udp4');
    const id = Math.floor(Math.random() * 65536);
    let settled = false;
    const done = (value: { rcode: number; answers: number } | undefined) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.close();
      resolve(value);
    };
    const timer = setTimeout(() => done(undefined), 300);
    socket.on('error', () => done(undefined));
    socket.on('message', (reply) => {
      if (reply.length < 12 || reply.readUInt16BE(0) !== id) return;
      done({ rcode: reply.readUInt16BE(2) & 0xf, answers: reply.readUInt16BE(6) });
    });
    socket.bind(0, source, () => socket.send(encodeQuery(id, name), port, HOST));
  });
}

/** Waits until `port` answers an A query with NOERROR and one address (10 s at most). */
async function waitAnswering(label: string, port: number): Promise<void> {
  let last = 'no answer';
  for (let attempt = 0; attempt < 50; attempt++) {
    const reply = await probe(port, `probe${attempt}.ready.bench.test`, CLIENT_ADDRESS);
    if (reply?.rcode === 0 && reply.answers === 1) return;
    if (reply) last = `rcode ${reply.rcode}, ${reply.answers} answers`;
    await sleep(200);
  }
  throw new Error(`${label} on port ${port} does not answer A queries (${last})`);
}

// ---------------------------------------------------------------------------------------------
// dnsperf

interface PerfResult {
  readonly qps: number;
  readonly sent: number;
  readonly completed: number;
  readonly lost: number;
  readonly runSeconds: number;
  readonly avgMs: number;
  readonly minMs: number;
  readonly maxMs: number;
  readonly stddevMs: number;
  readonly rcodes: Record<string, number>;
}

function parseDnsperf(output: string): PerfResult {
  const num = (pattern: RegExp, group = 1) => {
    const match = pattern.exec(output);
    if (!match) throw new Error(`dnsperf output lacks ${pattern}:\n${output}`);
    return Number(match[group]);
  };
  const latency = /Average Latency \(s\):\s+([\d.]+) \(min ([\d.]+), max ([\d.]+)\)/;
  const rcodes: Record<string, number> = {};
  const codes = /Response codes:\s+(.*)/.exec(output)?.[1] ?? '';
  for (const match of codes.matchAll(/([A-Z]+) (\d+) \(/g)) rcodes[match[1]!] = Number(match[2]);
  return {
    qps: num(/Queries per second:\s+([\d.]+)/),
    sent: num(/Queries sent:\s+(\d+)/),
    completed: num(/Queries completed:\s+(\d+)/),
    lost: num(/Queries lost:\s+(\d+)/),
    runSeconds: num(/Run time \(s\):\s+([\d.]+)/),
    avgMs: num(latency, 1) * 1000,
    minMs: num(latency, 2) * 1000,
    maxMs: num(latency, 3) * 1000,
    stddevMs: num(/Latency StdDev \(s\):\s+([\d.]+)/) * 1000,
    rcodes,
  };
}

interface PerfRun {
  readonly port: number;
  readonly file: string;
  readonly seconds: number;
  /** Run through the file at most once (every query a distinct name). */
  readonly once: boolean;
  readonly clients: number;
  readonly outstanding: number;
  /** Offered load, queries per second (dnsperf -Q); unbounded when absent. */
  readonly qps?: number;
}

async function dnsperf(run: PerfRun): Promise<PerfResult> {
  const args = [
    ...['-s', HOST, '-p', String(run.port), '-a', CLIENT_ADDRESS],
    ...['-d', run.file, '-l', String(run.seconds), '-t', '2'],
    ...['-c', String(run.clients), '-T', '1', '-q', String(run.outstanding)],
    ...(run.once ? ['-n', '1'] : []),
    ...(run.qps ? ['-Q', String(run.qps)] : []),
  ];
  // `timeout` bounds dnsperf even if this process is killed outright.
  const child = spawnBounded(run.seconds + 15, pinned('load', 'dnsperf', args), {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout?.on('data', (chunk: Buffer) => {
    output += chunk.toString();
  });
  child.stderr?.on('data', (chunk: Buffer) => {
    output += chunk.toString();
  });
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  if (code !== 0) throw new Error(`dnsperf ${args.join(' ')} exited ${code}:\n${output}`);
  return parseDnsperf(output);
}

// ---------------------------------------------------------------------------------------------
// Query files

async function writeQueryFile(path: string, names: (i: number) => string, count: number) {
  const lines: string[] = new Array(count);
  for (let i = 0; i < count; i++) lines[i] = `${names(i)} A`;
  await writeFile(path, `${lines.join('\n')}\n`);
}

// ---------------------------------------------------------------------------------------------
// The run

const median = (values: readonly number[]): number => {
  const sorted = [...values].filter(Number.isFinite).sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
};

const qpsText = (qps: number) => formatInt(qps);
const msText = (ms: number) => `${formatMs(ms)} ms`;
const usText = (seconds: number) => `${(seconds * 1e6).toFixed(1)} µs`;
const rcodeText = (r: PerfResult) =>
  Object.entries(r.rcodes)
    .map(([code, n]) => (code === 'NOERROR' ? `${formatInt(n)}` : `${code} ${formatInt(n)}`))
    .join(', ');

interface Measured {
  readonly round: number;
  readonly workload: Workload | 'ceiling';
  readonly server: Server | 'upstream';
  readonly result: PerfResult;
  /** Queries the upstream answered during the run, per completed query. */
  readonly upstreamPerQuery: number;
}

const SUMMARY = `Moat's DNS interceptor against dnsmasq (a caching forwarder), both in front of the same
fake upstream on loopback, measured with dnsperf in one run: (hit) cache hits on 10 names and
(fwd) forwarding, a distinct name per query; medians over rounds, with latency and CPU per
query at a fixed load. Needs dnsperf and dnsmasq (installed with apt-get when missing).`;

const OPTIONS = {
  rounds: whole({ default: 3, min: 1, max: 9, help: 'rounds, each measuring every server once' }),
  seconds: whole({ default: 8, min: 2, max: 30, help: 'seconds of each measured run' }),
  clients: whole({ default: 4, min: 1, max: 64, help: 'dnsperf clients (-c)' }),
  outstanding: whole({ default: 100, min: 1, max: 1000, help: 'dnsperf queries in flight (-q)' }),
  workloads: list<Workload>({ known: ['hit', 'fwd'], default: ['hit', 'fwd'], help: 'what runs' }),
  strict: flag('exit 1 when a target fails'),
  'no-pin': flag('do not pin the server under test and dnsperf to CPUs of their own'),
  'udp-io': choice({
    known: ['auto', 'dgram'],
    default: 'auto',
    help: "Moat's --dns-udp-io (dgram: the node:dgram fallback)",
  }),
  profile: flag(
    'run Moat under node --cpu-prof and summarise where its CPU time went (implies --keep)',
  ),
  'shared-address': flag("every name resolves to one address (keeps Moat's learned table small)"),
  'node-flags': text({ default: '', value: 'FLAGS', help: 'extra node flags for Moat' }),
  keep: flag('keep the scratch folder with query files and logs'),
};

function parseOptions(): Options {
  const values = readOptions('bench:dns', SUMMARY, OPTIONS);
  return {
    rounds: values.rounds,
    seconds: values.seconds,
    clients: values.clients,
    outstanding: values.outstanding,
    workloads: values.workloads,
    profile: values.profile,
    nodeFlags: values['node-flags'].split(/\s+/).filter(Boolean),
    pin: !values['no-pin'] && cpus().length >= 2 && has('taskset'),
    sharedAddress: values['shared-address'],
    keep: values.keep || values.profile,
    strict: values.strict,
    udpIo: values['udp-io'],
  };
}

async function main(): Promise<void> {
  const options = parseOptions();
  ensureTools();
  await runInScratchFolder('bench:dns', 'moat-bench-dns-', options.keep, (dir) =>
    run(options, dir),
  );
}

const SERVER_LABEL: Record<Server, string> = {
  moat: 'Moat',
  dnsmasq: 'dnsmasq',
  dnsmasq0: 'dnsmasq --cache-size=0',
};

const SERVERS_FOR: Record<Workload, readonly Server[]> = {
  hit: ['moat', 'dnsmasq'],
  fwd: ['moat', 'dnsmasq', 'dnsmasq0'],
};

/** Starts dnsmasq as a forwarder to the fake upstream on a port of its own. */
async function startDnsmasq(
  cacheSize: number,
  upstreamPort: number,
  lifetime: string,
  logFile: string,
): Promise<{ port: number; args: string[]; pid: () => number }> {
  const port = await freePort();
  const args = [
    '--keep-in-foreground',
    '--conf-file=/dev/null',
    '--no-resolv',
    '--no-hosts',
    '--no-poll',
    `--server=${HOST}#${upstreamPort}`,
    `--port=${port}`,
    `--listen-address=${HOST}`,
    '--bind-interfaces',
    `--cache-size=${cacheSize}`,
    '--pid-file=',
    '--log-facility=-',
    '--user=root',
    '--group=root',
  ];
  const log = openSync(logFile, 'a');
  const child = spawnBounded(Number(lifetime), pinned('server', 'dnsmasq', args), {
    stdio: ['ignore', log, log],
  });
  closeSync(log);
  child.once('exit', (code) => {
    if (code !== null && code !== 0 && code !== 124)
      console.error(`bench:dns: dnsmasq exited ${code}; see ${logFile}`);
  });
  const pid = () => {
    const pid = commandPid(child.pid!);
    if (pid === undefined) throw new Error(`no child under pid ${child.pid}`);
    return pid;
  };
  return { port, args, pid };
}

async function run(options: Options, dir: string): Promise<void> {
  const { rounds, seconds, workloads } = options;
  if (options.pin) {
    cpuSets = { server: String(cpus().length - 1), load: '0' };
    pinProcess('load', process.pid);
  }
  const busy = await machineBusy(1000);
  const warmSeconds = 2;
  const ceilingSeconds = Math.min(seconds, 5);
  // Each child's hard lifetime: the planned run time, twice over, plus a margin.
  const runs = workloads.reduce((n, w) => n + SERVERS_FOR[w].length, 0);
  const planned =
    rounds * (runs * (seconds + 1) + ceilingSeconds + 1) +
    runs * (warmSeconds + 1) +
    (runs + 1) * (FIXED_SECONDS + 1) +
    10;
  const lifetime = String(2 * planned + 120);
  // Forwarding runs use -n 1 over a file longer than the run can send at 60k QPS; a faster
  // server just finishes the file early (dnsperf's QPS is over its real run time).
  const fwdLines = Math.max(200_000, seconds * 60_000);

  console.log(`# DNS benchmark: Moat vs dnsmasq (dnsperf, ${rounds} rounds, medians)\n`);
  const dnsperfVersion = toolVersion('dnsperf', ['-h'], /Version (\S+)/);
  const dnsmasqVersion = toolVersion('dnsmasq', ['--version'], /version (\S+)/);
  console.log(
    `Machine: ${cpus().length} x ${cpus()[0]?.model.trim() ?? '?'}, Node ${process.version}, ` +
      `dnsperf ${dnsperfVersion}, dnsmasq ${dnsmasqVersion}. About ` +
      `${Math.round(planned / 60)} min.`,
  );

  if (busy > 0.15) {
    console.log(
      `WARNING: the machine was ${Math.round(busy * 100)}% busy before the benchmark started ` +
        '(other processes); expect noisy numbers.',
    );
  }

  // New cache-hit names for every phase and round: the pass that warms the caches then always
  // fetches them afresh. (Hot names whose cached answers are older than everything else in
  // Moat's full learned-address table make every hit pay an eviction scan; that pathology is
  // reported separately rather than left to depend on how many names the run before sent.)
  const hitFile = async (tag: string) => {
    const path = join(dir, `hit-${tag}.txt`);
    await writeQueryFile(path, (i) => `www${i}.${tag}.hit.bench.test`, HIT_NAMES);
    return path;
  };
  const fwdFile = async (tag: string) => {
    const path = join(dir, `fwd-${tag}.txt`);
    await writeQueryFile(path, (i) => `q${i}.${tag}.fwd.bench.test`, fwdLines);
    return path;
  };

  const upstream = await forkServer(
    'load',
    './dns-upstream.js',
    ['0', lifetime, options.sharedAddress ? 'shared' : 'distinct'],
    [],
    join(dir, 'upstream.log'),
  );
  const moatLog = join(dir, 'moat.log');
  const profileDir = join(dir, 'profile');
  const moat = await forkServer(
    'server',
    './dns-moat.js',
    ['0', String(upstream.port), CLIENT_ADDRESS, lifetime, options.udpIo],
    [
      ...options.nodeFlags,
      ...(options.profile ? ['--cpu-prof', '--cpu-prof-dir', profileDir] : []),
    ],
    moatLog,
  );
  const dnsmasq = await startDnsmasq(10_000, upstream.port, lifetime, join(dir, 'dnsmasq.log'));
  const dnsmasq0 = workloads.includes('fwd')
    ? await startDnsmasq(0, upstream.port, lifetime, join(dir, 'dnsmasq0.log'))
    : undefined;

  await waitAnswering('the fake upstream', upstream.port);
  await waitAnswering('Moat', moat.port);
  await waitAnswering('dnsmasq', dnsmasq.port);
  if (dnsmasq0) await waitAnswering('dnsmasq --cache-size=0', dnsmasq0.port);

  const ports: Record<Server | 'upstream', number> = {
    moat: moat.port,
    dnsmasq: dnsmasq.port,
    dnsmasq0: dnsmasq0?.port ?? 0,
    upstream: upstream.port,
  };
  console.log(
    [
      '',
      'Setup (all on loopback):',
      '- fake upstream: bench/dns-upstream.ts, one Node process answering every A query by ' +
        `pattern: one A record, TTL ${UPSTREAM_TTL_SECONDS} s, ` +
        `${options.sharedAddress ? 'the same address for every name' : 'an address derived from the name'}` +
        ` (127.0.0.1:${upstream.port}).`,
      `- Moat: bench/dns-moat.ts (127.0.0.1:${moat.port}), what \`moat serve\` runs (startMoat) ` +
        'with its config defaults (cache 10,000, timeout 2,000 ms, pino at warn, metrics on) and ' +
        '--dns-rate-limit 10000000 (the limiter never refuses), plus one sandbox registered at ' +
        `source ${CLIENT_ADDRESS} with a default-allow policy: this version has no API to ` +
        'register one, and unknown sources are REFUSED.',
      `- dnsmasq (127.0.0.1:${dnsmasq.port}): ${dnsmasq.args.join(' ')}.`,
      ...(dnsmasq0
        ? [
            `- dnsmasq --cache-size=0 (127.0.0.1:${dnsmasq0.port}), forwarding only: the same ` +
              'flags without a cache, a reference for the forwarding path alone.',
          ]
        : []),
      `- dnsperf from ${CLIENT_ADDRESS}: -c ${options.clients} -T 1 -q ${options.outstanding} ` +
        `-t 2, ${seconds} s per run, no rate limit: QPS is the server's saturated throughput ` +
        'and latency is under that load.',
      `- cache hit: ${HIT_NAMES} names (new ones each round), looped, after a pass that warms ` +
        'the cache; forwarding: ' +
        `a distinct name for every query (-n 1 over ${formatInt(fwdLines)} names, new names ` +
        'each round), so every query goes upstream.' +
        (workloads.includes('fwd')
          ? ' The forwarding warm-up fills both caches (10,000 answers), so every measured run ' +
            'sees a full cache, as on a busy resolver.'
          : ''),
      cpuSets
        ? `- CPUs pinned with taskset: the server under test on CPU ${cpuSets.server}; dnsperf, ` +
          `the fake upstream and this script on CPU ${cpuSets.load} (the upstream moves to ` +
          `CPU ${cpuSets.server} for its own ceiling run).`
        : '- CPUs not pinned.',
      `- ${rounds} rounds, the server order rotating each round; medians reported.` +
        (options.profile ? ' Moat runs under node --cpu-prof (slower).' : ''),
      '',
    ].join('\n'),
  );

  const upstreamCount = async () =>
    (await ask<{ answered: number }>(upstream.child, 'count', 'answered', 2000))?.answered ??
    Number.NaN;
  const measure = async (
    round: number,
    workload: Workload | 'ceiling',
    server: Server | 'upstream',
    file: string,
    runSeconds: number,
  ): Promise<Measured> => {
    if (workload === 'hit') {
      // Warm the cache: every name once (the forwarding runs may have pushed them out).
      await dnsperf({
        port: ports[server],
        file,
        seconds: 5,
        once: true,
        clients: 1,
        outstanding: 10,
      });
    }
    const before = await upstreamCount();
    const result = await dnsperf({
      port: ports[server],
      file,
      seconds: runSeconds,
      once: workload !== 'hit',
      clients: options.clients,
      outstanding: options.outstanding,
    });
    const after = await upstreamCount();
    await sleep(300);
    const measured = {
      round,
      workload,
      server,
      result,
      upstreamPerQuery: (after - before) / Math.max(1, result.completed),
    };
    const name = server === 'upstream' ? 'upstream' : SERVER_LABEL[server];
    const failed = result.completed - (result.rcodes.NOERROR ?? 0) + result.lost;
    if (failed > 0.01 * result.sent) {
      console.log(
        `WARNING: ${name} ${workload}: ${failed} of ${result.sent} queries lost or not NOERROR`,
      );
    }
    process.stdout.write(
      `  round ${round} ${workload.padEnd(7)} ${name.padEnd(22)} ${qpsText(result.qps).padStart(7)} QPS, ` +
        `avg ${msText(result.avgMs)}, lost ${result.lost}, answers ${rcodeText(result)}, ` +
        `upstream queries per answer ${measured.upstreamPerQuery.toFixed(2)}\n`,
    );
    return measured;
  };

  // Warm-up, not measured: JIT, socket buffers, caches.
  console.log('Warm-up (not counted):');
  const warmFwd = workloads.includes('fwd') ? await fwdFile('warm') : undefined;
  const warmHit = await hitFile('warm');
  for (const workload of workloads) {
    for (const server of SERVERS_FOR[workload]) {
      await measure(0, workload, server, workload === 'hit' ? warmHit : warmFwd!, warmSeconds);
    }
  }
  if (warmFwd) rmSync(warmFwd, { force: true });

  console.log('Measured runs:');
  const results: Measured[] = [];
  for (let round = 1; round <= rounds; round++) {
    const file = await fwdFile(`r${round}`);
    const hits = await hitFile(`r${round}`);
    for (const workload of workloads) {
      const servers = SERVERS_FOR[workload];
      const shift = (round - 1) % servers.length;
      const order = [...servers.slice(shift), ...servers.slice(0, shift)];
      for (const server of order) {
        results.push(
          await measure(round, workload, server, workload === 'hit' ? hits : file, seconds),
        );
      }
    }
    // The ceiling: the upstream alone, on the CPU the servers get.
    pinProcess('server', upstream.child.pid);
    results.push(await measure(round, 'ceiling', 'upstream', file, ceilingSeconds));
    pinProcess('load', upstream.child.pid);
    rmSync(file, { force: true });
  }

  // Fixed offered load, one run each: latency below saturation, and CPU time per query of the
  // server process (user + system, all threads), which contention on the machine hardly moves.
  console.log('Fixed offered load (CPU per query):');
  const efficiency: Array<{
    workload: Workload;
    server: Server | 'upstream';
    result: PerfResult;
    user: number;
    sys: number;
  }> = [];
  const pids: Record<Server | 'upstream', () => number> = {
    moat: () => moat.child.pid!,
    dnsmasq: dnsmasq.pid,
    dnsmasq0: () => dnsmasq0!.pid(),
    upstream: () => upstream.child.pid!,
  };
  for (const workload of workloads) {
    const file = workload === 'hit' ? await hitFile('fixed') : await fwdFile('fixed');
    // The logic-free Node responder answers the cache-hit load too: a floor for a Node server.
    const servers: Array<Server | 'upstream'> = [
      ...SERVERS_FOR[workload],
      ...(workload === 'hit' ? ['upstream' as const] : []),
    ];
    for (const server of servers) {
      if (server === 'upstream') pinProcess('server', upstream.child.pid);
      if (workload === 'hit' && server !== 'upstream') {
        await dnsperf({
          port: ports[server],
          file,
          seconds: 5,
          once: true,
          clients: 1,
          outstanding: 10,
        });
      }
      const pid = pids[server]();
      const before = processCpu(pid);
      const result = await dnsperf({
        port: ports[server],
        file,
        seconds: FIXED_SECONDS,
        once: workload === 'fwd',
        clients: options.clients,
        outstanding: options.outstanding,
        qps: FIXED_QPS[workload],
      });
      const after = processCpu(pid);
      if (server === 'upstream') pinProcess('load', upstream.child.pid);
      const entry = {
        workload,
        server,
        result,
        user: (after.user - before.user) / Math.max(1, result.completed),
        sys: (after.sys - before.sys) / Math.max(1, result.completed),
      };
      efficiency.push(entry);
      const name = server === 'upstream' ? 'fake upstream' : SERVER_LABEL[server];
      process.stdout.write(
        `  ${workload.padEnd(4)} ${formatInt(FIXED_QPS[workload])}/s ${name.padEnd(22)} ` +
          `${qpsText(result.qps).padStart(7)} QPS, avg ${msText(result.avgMs)}, ` +
          `CPU ${usText(entry.user + entry.sys)} per query (user ${usText(entry.user)}, ` +
          `sys ${usText(entry.sys)})\n`,
      );
    }
    if (workload === 'fwd') rmSync(file, { force: true });
  }

  const moatCounts = await ask<{ metrics: Record<string, number>; learned: number; udpIo: string }>(
    moat.child,
    'metrics',
    'metrics',
    2000,
  );

  // ------------------------------------------------------------------------- report
  const pick = (workload: Measured['workload'], server: Measured['server']) =>
    results.filter((m) => m.workload === workload && m.server === server).map((m) => m.result);
  const med = (rs: PerfResult[], key: keyof PerfResult) => median(rs.map((r) => r[key] as number));
  const ceilingQps = med(pick('ceiling', 'upstream'), 'qps');
  const rows: string[][] = [];
  const ratio = (workload: Workload, peer: Server) =>
    med(pick(workload, 'moat'), 'qps') / med(pick(workload, peer), 'qps');
  const row = (label: string, workload: Workload, peer: Server) => {
    const m = pick(workload, 'moat');
    const d = pick(workload, peer);
    rows.push([
      label,
      qpsText(med(m, 'qps')),
      qpsText(med(d, 'qps')),
      formatRatio(ratio(workload, peer)),
      msText(med(m, 'avgMs')),
      msText(med(d, 'avgMs')),
      workload === 'hit' ? 'n/a' : qpsText(ceilingQps),
    ]);
  };
  if (workloads.includes('hit')) row(`cache hit (${HIT_NAMES} names)`, 'hit', 'dnsmasq');
  if (workloads.includes('fwd')) {
    row('forwarding (distinct names)', 'fwd', 'dnsmasq');
    row('forwarding, vs dnsmasq --cache-size=0', 'fwd', 'dnsmasq0');
  }
  console.log(`\n## Results (median of ${rounds} rounds)\n`);
  console.log(
    markdownTable(
      [
        'workload',
        'Moat QPS',
        'dnsmasq QPS',
        'ratio',
        'Moat avg latency',
        'dnsmasq avg latency',
        'upstream ceiling QPS',
      ],
      rows,
    ),
  );
  console.log(
    [
      '',
      "ratio = Moat QPS / dnsmasq QPS. Latency is dnsperf's average at saturation " +
        `(${options.outstanding} queries outstanding), so it mostly mirrors throughput.`,
      `Upstream ceiling: dnsperf straight at the fake upstream (median of ${rounds} runs of ` +
        `${ceilingSeconds} s); it bounds forwarding; cache hits never reach it.`,
      "dnsmasq --cache-size=0: dnsmasq's forwarding path without its cache. With a cache full of " +
        'unexpired answers, dnsmasq scans the whole cache for expired entries on every insertion ' +
        '(cache.c, really_insert -> cache_scan_free), which is what limits the cached dnsmasq ' +
        'on the forwarding workload.',
    ].join('\n'),
  );

  const detail: string[][] = [];
  for (const workload of workloads) {
    for (const server of SERVERS_FOR[workload]) {
      const rs = pick(workload, server);
      const all = results.filter((m) => m.workload === workload && m.server === server);
      detail.push([
        workload === 'hit' ? 'cache hit' : 'forwarding',
        SERVER_LABEL[server],
        rs.map((r) => qpsText(r.qps)).join(' / '),
        msText(med(rs, 'stddevMs')),
        msText(med(rs, 'maxMs')),
        formatInt(rs.reduce((n, r) => n + r.lost, 0)),
        formatInt(rs.reduce((n, r) => n + r.completed - (r.rcodes.NOERROR ?? 0), 0)),
        median(all.map((m) => m.upstreamPerQuery)).toFixed(2),
      ]);
    }
  }
  const ceilings = pick('ceiling', 'upstream');
  detail.push([
    'ceiling',
    'fake upstream',
    ceilings.map((r) => qpsText(r.qps)).join(' / '),
    msText(med(ceilings, 'stddevMs')),
    msText(med(ceilings, 'maxMs')),
    formatInt(ceilings.reduce((n, r) => n + r.lost, 0)),
    formatInt(ceilings.reduce((n, r) => n + r.completed - (r.rcodes.NOERROR ?? 0), 0)),
    '1.00',
  ]);
  console.log('\nEvery round, and the latency spread (medians):\n');
  console.log(
    markdownTable(
      [
        'workload',
        'server',
        'QPS by round',
        'latency stddev',
        'max latency',
        'lost',
        'not NOERROR',
        'upstream queries per answer',
      ],
      detail,
      ['left', 'left', 'right', 'right', 'right', 'right', 'right', 'right'],
    ),
  );
  if (moatCounts) {
    const counts = Object.entries(moatCounts.metrics)
      .map(([k, v]) => `${k} ${formatInt(v)}`)
      .join(', ');
    console.log(
      `\nMoat's counters over the whole run: ${counts}; learned addresses held ${formatInt(moatCounts.learned)}; UDP I/O ${moatCounts.udpIo}.`,
    );
  }

  console.log(
    `\n## At a fixed offered load (one ${FIXED_SECONDS} s run each)\n\n` +
      'CPU time the server process used per answered query (user + system, all threads, from ' +
      '/proc/<pid>/stat), and latency below saturation.\n',
  );
  console.log(
    markdownTable(
      ['workload', 'offered QPS', 'server', 'avg latency', 'CPU per query', 'user', 'system'],
      efficiency.map((e) => [
        e.workload === 'hit' ? 'cache hit' : 'forwarding',
        formatInt(FIXED_QPS[e.workload]),
        e.server === 'upstream' ? 'fake upstream (no logic, Node)' : SERVER_LABEL[e.server],
        msText(e.result.avgMs),
        usText(e.user + e.sys),
        usText(e.user),
        usText(e.sys),
      ]),
      ['left', 'right', 'left', 'right', 'right', 'right', 'right'],
    ),
  );

  console.log('\n## Targets\n');
  const verdicts: boolean[] = [];
  const verdict = (pass: boolean, text: string) => {
    verdicts.push(pass);
    console.log(`${pass ? 'PASS' : 'FAIL'}: ${text}`);
  };
  if (workloads.includes('hit')) {
    const r = ratio('hit', 'dnsmasq');
    verdict(
      r >= TARGETS.hitRatio,
      `cache-hit QPS at least dnsmasq's: Moat/dnsmasq = ${formatRatio(r)} (target >= ${TARGETS.hitRatio}x)`,
    );
  }
  if (workloads.includes('fwd')) {
    const r = ratio('fwd', 'dnsmasq');
    verdict(
      r >= TARGETS.forwardRatio,
      `forwarding QPS at least half of dnsmasq's: Moat/dnsmasq = ${formatRatio(r)} (target >= ${TARGETS.forwardRatio}x)`,
    );
    const r0 = ratio('fwd', 'dnsmasq0');
    console.log(
      `INFO: against dnsmasq --cache-size=0 (forwarding path alone), Moat/dnsmasq = ${formatRatio(r0)}` +
        ` (${r0 >= TARGETS.forwardRatio ? 'also meets' : 'would not meet'} the half target).`,
    );
  }

  const warnings = readFileSync(moatLog, 'utf8').split('\n').filter(Boolean);
  if (warnings.length > 0) {
    console.log(`\nMoat logged ${warnings.length} lines at warn or above; first: ${warnings[0]}`);
  }

  if (options.profile) {
    await stopChildren();
    const profiles = readdirSync(profileDir).filter((f) => f.endsWith('.cpuprofile'));
    if (profiles.length === 0) console.log('\nNo CPU profile was written.');
    for (const file of profiles) {
      console.log(`\n## Moat CPU profile (${join(profileDir, file)})\n`);
      console.log(summariseProfile(join(profileDir, file)));
    }
  }
  if (options.strict && verdicts.includes(false)) process.exitCode = 1;
}

main().catch(async (error: unknown) => {
  console.error(`bench:dns: ${(error as Error).stack ?? String(error)}`);
  await stopChildren();
  process.exit(1);
});
