/**
 * `npm run bench:proxy`: Moat's egress proxy against squid and against no proxy at all (a
 * direct connection), with the same local origin and the same load client in one run.
 *
 * Workloads:
 * (a) new CONNECT tunnels per second, each carrying one small HTTP request (closed loop, a fixed
 *     concurrency): tunnels/s and p50/p99 of the whole iteration;
 * (a') the same iteration at a fixed, unsaturated rate (open loop, 500/s): p50/p99 of the tunnel
 *     setup (TCP connect + CONNECT 200) against the direct TCP connect;
 * (b) bulk throughput of one tunnel (1 GiB from the origin, MB/s);
 * (c) absolute-form GET requests per second over keep-alive connections.
 * Each round measures Moat, squid and direct one after the other (A B C A B C ...) for every
 * workload; medians over rounds and per-round ratios are reported, with a verdict per target.
 *
 * Processes, all on loopback (nothing else is ever addressed), each with its own event loop:
 * - origin: bench/proxy-origin.ts, a small HTTP/1.1 responder and a bulk TCP source (127.0.0.20);
 * - Moat: bench/proxy-moat.ts, startMoat from a loadConfig'd MoatConfig, a fake DNS upstream,
 *   one registered sandbox (default-allow policy, egress secret);
 * - squid (Debian package; apt-get installs it when missing) with a minimal loopback config;
 * - load client: bench/proxy-client.ts, raw sockets, the same code for all three modes.
 *
 * Each run also records CPU time of every process (from /proc), the rest of the machine's CPU
 * (noise), Moat's event-loop delay and how many connections the origin saw.
 *
 * Options: `--help`. Every child process is bounded in time and stopped on exit, error, SIGINT
 * and SIGTERM, and when this process dies.
 */
import type { ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { formatInt, formatMs, formatRatio, markdownTable } from './lib/table.js';
import { median } from './lib/timing.js';
import {
  type BulkResult,
  type ClosedLoopResult,
  type Job,
  type JobResult,
  type Mode,
  ORIGIN_IP,
  ORIGIN_NAME,
  type OriginAddress,
  type RateResult,
  SMALL_BODY_BYTES,
  type Via,
} from './proxy-common.js';
import {
  ask,
  cpuSeconds,
  forkReady,
  machineBusy,
  machineCpu,
  runInScratchFolder,
  sleep,
  stopChild,
  stopChildren,
} from './lib/procs.js';
import { choice, flag, list, readOptions, text, whole } from './lib/options.js';
import { summariseProfile } from './lib/profile.js';
import {
  ensureSquid,
  type RunningSquid,
  squidVersion,
  startSquid,
  stopSystemSquid,
} from './proxy-procs.js';

type Workload = 'tunnels' | 'rate' | 'bulk' | 'get';
const WORKLOADS: readonly Workload[] = ['tunnels', 'rate', 'bulk', 'get'];
const MODES: readonly Mode[] = ['moat', 'squid', 'direct'];
/** How long a forked script may take to say it is ready. */
const START_TIMEOUT_MS = 60_000;
const LABEL: Record<Mode, string> = {
  moat: 'Moat',
  squid: 'squid',
  direct: 'direct',
};
/** The targets checked (docs/benchmarks.md): ratios to squid and to direct, and p99 over direct. */
const TARGETS = {
  bulkVsSquid: 1,
  bulkVsDirect: 0.5,
  tunnelsVsSquid: 1,
  getVsSquid: 1,
  p99AboveDirectMs: 1,
};

interface Options {
  readonly rounds: number;
  readonly seconds: number;
  readonly rate: number;
  readonly rateSeconds: number;
  readonly bulkBytes: number;
  readonly concurrency: number;
  readonly connections: number;
  readonly workloads: readonly Workload[];
  readonly modes: readonly Mode[];
  readonly profile: boolean;
  readonly nodeFlags: readonly string[];
  readonly proxyIo: 'auto' | 'node';
  readonly moatImport: string | undefined;
  readonly keep: boolean;
  readonly strict: boolean;
}

const SUMMARY = `Moat's egress proxy against squid and against a direct connection, with the same loopback
origin and load client in one run: new CONNECT tunnels per second (closed loop), tunnel setup
latency at a fixed rate, bulk throughput of one tunnel, and absolute-form GETs per second;
medians over rounds, with CPU per process. Needs squid (installed with apt-get when missing).`;

const OPTIONS = {
  rounds: whole({ default: 5, min: 1, max: 15, help: 'rounds, each measuring every mode once' }),
  seconds: whole({ default: 4, min: 1, max: 30, help: 'seconds of each closed-loop run' }),
  rate: whole({ default: 500, min: 1, max: 5000, help: 'tunnels per second of the rate run' }),
  'rate-seconds': whole({ default: 5, min: 1, max: 30, help: 'seconds of the rate run' }),
  'bulk-mib': whole({ default: 1024, min: 1, max: 16384, help: 'MiB through the bulk tunnel' }),
  concurrency: whole({ default: 32, min: 1, max: 512, help: 'tunnels in flight' }),
  connections: whole({ default: 32, min: 1, max: 512, help: 'keep-alive connections for GET' }),
  workloads: list({ known: WORKLOADS, default: WORKLOADS, help: 'what runs' }),
  modes: list({ known: MODES, default: MODES, help: 'what is measured' }),
  'proxy-io': choice({
    known: ['auto', 'node'],
    default: 'auto',
    help: "Moat's --proxy-io: the native relay, or Node's sockets",
  }),
  strict: flag('exit 1 when a target fails'),
  keep: flag('keep the scratch folder with logs'),
  profile: flag(
    'run Moat under node --cpu-prof and summarise where its CPU time went (implies --keep)',
  ),
  'node-flags': text({
    default: '',
    value: 'FLAGS',
    help: 'extra node flags for Moat, e.g. --max-semi-space-size=64',
  }),
  'moat-import': text({
    default: undefined,
    value: 'FILE',
    help: "an extra --import for Moat's process",
  }),
};

function parseOptions(): Options {
  const values = readOptions('bench:proxy', SUMMARY, OPTIONS);
  return {
    rounds: values.rounds,
    seconds: values.seconds,
    rate: values.rate,
    rateSeconds: values['rate-seconds'],
    bulkBytes: values['bulk-mib'] * 2 ** 20,
    concurrency: values.concurrency,
    connections: values.connections,
    workloads: WORKLOADS.filter((w) => values.workloads.includes(w)),
    modes: MODES.filter((m) => values.modes.includes(m)),
    profile: values.profile,
    nodeFlags: values['node-flags'].split(/\s+/).filter(Boolean),
    proxyIo: values['proxy-io'],
    moatImport: values['moat-import'],
    keep: values.keep || values.profile,
    strict: values.strict,
  };
}

// ---------------------------------------------------------------------------------------------
// Running jobs

interface Measured {
  readonly round: number;
  readonly workload: Workload;
  readonly mode: Mode;
  readonly result: JobResult;
  /** CPU seconds of the proxy process (Moat or squid) during the run; NaN for direct. */
  readonly proxyCpu: number;
  readonly originCpu: number;
  readonly clientCpu: number;
  /** CPU seconds the rest of the machine used during the run (other processes, the kernel). */
  readonly otherCpu: number;
  /** Machine-wide, CPU seconds the host took for its other guests (steal)... */
  readonly stolenCpu: number;
  /** ...and the kernel's deferred network work (softirq), charged to no process. */
  readonly softirqCpu: number;
  /** Event-loop delay of Moat's process during the run (ms), when the run went through Moat. */
  readonly loop: LoopDelay | undefined;
  /** Connections and requests the origin's HTTP responder saw during the run. */
  readonly originConnections: number;
  readonly originRequests: number;
  readonly wallSeconds: number;
}

interface Procs {
  readonly client: ChildProcess;
  readonly origin: ChildProcess;
  readonly moat: ChildProcess | undefined;
  readonly squid: RunningSquid | undefined;
}

function jobFor(workload: Workload, via: Via, options: Options, short: boolean): Job {
  const seconds = short ? 1 : options.seconds;
  switch (workload) {
    case 'tunnels':
      return { type: 'tunnels', via, concurrency: options.concurrency, seconds };
    case 'rate':
      return { type: 'rate', via, rate: options.rate, seconds: short ? 1 : options.rateSeconds };
    case 'bulk':
      return {
        type: 'bulk',
        via,
        bytes: short ? Math.min(options.bulkBytes, 256 * 2 ** 20) : options.bulkBytes,
      };
    case 'get':
      return { type: 'get', via, connections: options.connections, seconds };
  }
}

interface LoopDelay {
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
}

interface OriginStats {
  readonly connections: number;
  readonly requests: number;
}

async function originStats(origin: ChildProcess): Promise<OriginStats> {
  const reply = await ask<{ stats: OriginStats }>(origin, 'stats', 'stats', 5000);
  return reply?.stats ?? { connections: Number.NaN, requests: Number.NaN };
}

async function runJob(
  procs: Procs,
  job: Job,
): Promise<{
  result: JobResult;
  cpu: number[];
  other: number;
  stolen: number;
  softirq: number;
  origin: OriginStats;
  loop: LoopDelay | undefined;
  wall: number;
}> {
  const proxyPid = () =>
    job.via.mode === 'moat'
      ? procs.moat?.pid
      : job.via.mode === 'squid'
        ? procs.squid?.pid()
        : undefined;
  const pids = [proxyPid(), procs.origin.pid, procs.client.pid];
  const moatProcess = job.via.mode === 'moat' ? procs.moat : undefined;
  if (moatProcess) await ask(moatProcess, 'loop-reset', 'loopReset', 5000);
  const statsBefore = await originStats(procs.origin);
  const before = pids.map(cpuSeconds);
  const machineBefore = machineCpu();
  const started = performance.now();
  const reply = await ask<{ result?: JobResult; error?: string }>(
    procs.client,
    { job },
    'result',
    120_000,
  );
  const wall = (performance.now() - started) / 1000;
  const after = pids.map(cpuSeconds);
  const machineAfter = machineCpu();
  const machine = machineAfter.busy - machineBefore.busy;
  const cpu = after.map((a, i) => a - before[i]!);
  const ours = cpu.reduce((sum, c) => sum + (Number.isFinite(c) ? c : 0), 0);
  const statsAfter = await originStats(procs.origin);
  const loop = moatProcess
    ? (await ask<{ loop: LoopDelay }>(moatProcess, 'loop', 'loop', 5000))?.loop
    : undefined;
  const origin = {
    connections: statsAfter.connections - statsBefore.connections,
    requests: statsAfter.requests - statsBefore.requests,
  };
  if (reply?.result === undefined)
    throw new Error(`the load client did not answer job ${JSON.stringify(job)}`);
  const stolen = machineAfter.stolen - machineBefore.stolen;
  const softirq = machineAfter.softirq - machineBefore.softirq;
  const other = Math.max(0, machine - ours);
  return { result: reply.result, cpu, other, stolen, softirq, origin, loop, wall };
}

// ---------------------------------------------------------------------------------------------
// Formatting

const num = (n: number) => (Number.isFinite(n) ? formatInt(n) : 'n/a');
const ms = (n: number) => (Number.isFinite(n) ? formatMs(n) : 'n/a');
const ratio = (n: number) => (Number.isFinite(n) ? formatRatio(n) : 'n/a');
const mb = (n: number) => (Number.isFinite(n) ? formatInt(n) : 'n/a');
const us = (seconds: number) =>
  Number.isFinite(seconds) ? `${(seconds * 1e6).toFixed(0)} µs` : 'n/a';
const pct = (n: number) => (Number.isFinite(n) ? `${Math.round(n * 100)}%` : 'n/a');
const signedMs = (n: number) => (Number.isFinite(n) ? `${n >= 0 ? '+' : ''}${formatMs(n)}` : 'n/a');

function describe(m: Measured): string {
  const r = m.result;
  const errors =
    'errors' in r && r.errors > 0 ? `, ${r.errors} errors (first: ${r.firstError})` : '';
  switch (m.workload) {
    case 'tunnels': {
      const t = r as ClosedLoopResult;
      return `${num(t.perSecond)} tunnels/s, p50 ${ms(t.latency.p50)} ms, p99 ${ms(t.latency.p99)} ms, setup p50 ${ms(t.setup?.p50 ?? Number.NaN)} ms${errors}`;
    }
    case 'rate': {
      const t = r as RateResult;
      return `${num(t.achievedRate)}/s done, setup p50 ${ms(t.setup.p50)} ms, p99 ${ms(t.setup.p99)} ms, max ${ms(t.setup.max)} ms; full p99 ${ms(t.full.p99)} ms; client lag p99 ${ms(t.lag.p99)} ms${errors}`;
    }
    case 'bulk': {
      const t = r as BulkResult;
      return `${mb(t.mbPerSecond)} MB/s (${formatInt(t.bytes / 2 ** 20)} MiB in ${t.seconds.toFixed(2)} s)${t.error ? `, error: ${t.error}` : ''}`;
    }
    case 'get': {
      const t = r as ClosedLoopResult;
      const conns =
        m.mode === 'direct'
          ? ''
          : `, origin connections per 1,000 GETs ${((1000 * m.originConnections) / Math.max(1, m.originRequests)).toFixed(1)}`;
      return `${num(t.perSecond)} req/s, p50 ${ms(t.latency.p50)} ms, p99 ${ms(t.latency.p99)} ms${conns}${errors}`;
    }
  }
}

/** Operations a run did (for CPU per operation). */
function operations(m: Measured): number {
  const r = m.result;
  switch (m.workload) {
    case 'tunnels':
    case 'get':
      return (r as ClosedLoopResult).completed;
    case 'rate':
      return (r as RateResult).completed;
    case 'bulk':
      return (r as BulkResult).bytes / 1e9;
  }
}

/** The headline figure of a run. */
function figure(m: Measured): number {
  const r = m.result;
  switch (m.workload) {
    case 'tunnels':
    case 'get':
      return (r as ClosedLoopResult).perSecond;
    case 'rate':
      return (r as RateResult).setup.p99;
    case 'bulk':
      return (r as BulkResult).error ? Number.NaN : (r as BulkResult).mbPerSecond;
  }
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const options = parseOptions();
  const log = (line: string) => console.log(line);
  if (options.modes.includes('squid')) {
    ensureSquid(log);
    stopSystemSquid(log);
  }
  await runInScratchFolder('bench:proxy', 'moat-bench-proxy-', options.keep, (dir) =>
    run(options, dir),
  );
}

async function run(options: Options, dir: string): Promise<void> {
  const { rounds, workloads, modes } = options;
  const busy = await machineBusy(1000);
  // Planned time: closed-loop and fixed-rate runs, bulk at ~500 MB/s, gaps and warm-up. The
  // children's hard lifetime below is twice that plus two minutes, so slow runs still finish.
  const runSeconds: Record<Workload, number> = {
    tunnels: options.seconds,
    rate: options.rateSeconds,
    bulk: options.bulkBytes / 500e6,
    get: options.seconds,
  };
  const perRound = workloads.reduce((t, w) => t + modes.length * (runSeconds[w] + 0.6), 0);
  const warmUp = workloads.length * modes.length * 1.6;
  const planned = rounds * perRound + warmUp + 10;
  const lifetime = Math.ceil(2 * planned + 120);

  console.log(`# Egress proxy benchmark: Moat vs squid vs direct (${rounds} rounds, medians)\n`);
  console.log(
    `Machine: ${cpus().length} x ${cpus()[0]?.model.trim() ?? '?'}, Node ${process.version}` +
      `${modes.includes('squid') ? `, squid ${squidVersion()}` : ''}. About ${Math.ceil(planned / 60)} min.`,
  );
  if (busy > 0.15) {
    console.log(
      `WARNING: the machine was ${Math.round(busy * 100)}% busy before the benchmark started ` +
        '(other processes); expect noisy numbers.',
    );
  }

  const origin = await forkReady<OriginAddress>(
    './proxy-origin.js',
    [String(lifetime)],
    [],
    join(dir, 'origin.log'),
    START_TIMEOUT_MS,
  );
  const profileDir = join(dir, 'profile');
  const moatLog = join(dir, 'moat.log');
  const moatFlags = [
    ...options.nodeFlags,
    ...(options.moatImport ? ['--import', options.moatImport] : []),
    ...(options.profile ? ['--cpu-prof', '--cpu-prof-dir', profileDir] : []),
  ];
  const moat = modes.includes('moat')
    ? await forkReady<{ port: number; io: string }>(
        './proxy-moat.js',
        [
          ORIGIN_IP,
          String(lifetime),
          options.proxyIo,
          `${origin.ready.httpPort},${origin.ready.bulkPort}`,
        ],
        moatFlags,
        moatLog,
        START_TIMEOUT_MS,
      )
    : undefined;
  const squid = modes.includes('squid')
    ? await startSquid(dir, ORIGIN_IP, ORIGIN_NAME, lifetime)
    : undefined;
  const client = await forkReady<boolean>(
    './proxy-client.js',
    [
      origin.ready.ip,
      String(origin.ready.httpPort),
      String(origin.ready.bulkPort),
      String(lifetime),
    ],
    [],
    join(dir, 'client.log'),
    START_TIMEOUT_MS,
  );
  const procs: Procs = {
    client: client.child,
    origin: origin.child,
    moat: moat?.child,
    squid,
  };
  const vias: Record<Mode, Via> = {
    moat: { mode: 'moat', proxy: { host: '127.0.0.1', port: moat?.ready.port ?? 0 } },
    squid: { mode: 'squid', proxy: { host: '127.0.0.1', port: squid?.port ?? 0 } },
    direct: { mode: 'direct' },
  };

  console.log(
    [
      '',
      'Setup (all on loopback, each a process of its own):',
      `- origin (bench/proxy-origin.ts, ${origin.ready.ip}): a hand-written HTTP/1.1 responder ` +
        `(port ${origin.ready.httpPort}; every request gets 200 with a ${SMALL_BODY_BYTES}-byte body and ` +
        `Content-Length) and a bulk source (port ${origin.ready.bulkPort}; reads "<bytes>\\n", writes them ` +
        'from a repeated 256 KiB buffer, closes).',
      moat
        ? `- Moat (bench/proxy-moat.ts, 127.0.0.1:${moat.ready.port}): startMoat with loadConfig defaults ` +
          "except --internal-deny 10.0.0.0/8 and --allow-host-ports the origin's two ports " +
          '(the loopback origin reachable), --dns-upstream a fake DNS in ' +
          'the same process (origin.bench.test -> origin, TTL 1 h), --transparent-listen off, ' +
          `--proxy-max-tunnels 100000, --log-level warn, --proxy-io ${options.proxyIo} ` +
          `(carried ${moat.ready.io === 'native' ? 'by the native relay' : "on Node's sockets"}); ` +
          'one sandbox with a default-allow policy, ' +
          'identified by Proxy-Authorization Basic (sandboxID:egress secret).' +
          (moatFlags.length ? ` Node flags: ${moatFlags.join(' ')}.` : '')
        : '',
      squid
        ? `- squid (127.0.0.1:${squid.port}, squid -N, one process): ${squid.config.split('\n').join('; ')}.`
        : '',
      `- direct: the same client straight to the origin (origin-form requests, no CONNECT).`,
      `- load client (bench/proxy-client.ts): raw sockets; the same code and requests for every mode ` +
        '(the proxies get the same Proxy-Authorization header).',
      `- (a) tunnels: ${options.concurrency} concurrent loops of connect, CONNECT ${ORIGIN_NAME}:port, ` +
        `200, one GET (Connection: close), answer, close; ${options.seconds} s per run. ` +
        `(a') the same iteration started at a fixed ${options.rate}/s for ${options.rateSeconds} s ` +
        '(open loop): setup = connect + CONNECT 200 (direct: TCP connect). (b) bulk: one tunnel, ' +
        `${formatInt(options.bulkBytes / 2 ** 20)} MiB from the origin, read into one reused 1 MiB ` +
        `buffer and dropped. (c) GET: ${options.connections} keep-alive connections, one absolute-form ` +
        `GET at a time each, ${options.seconds} s per run.`,
      `- ${rounds} rounds; in each, every workload runs for ${modes.map((m) => LABEL[m]).join(', ')} in turn; ` +
        'medians over rounds.' +
        (options.profile ? ' Moat runs under node --cpu-prof (slower).' : ''),
      '',
    ]
      .filter(Boolean)
      .join('\n'),
  );

  const results: Measured[] = [];
  const measure = async (round: number, workload: Workload, mode: Mode, short: boolean) => {
    const { result, cpu, other, stolen, softirq, origin, loop, wall } = await runJob(
      procs,
      jobFor(workload, vias[mode], options, short),
    );
    const m: Measured = {
      round,
      workload,
      mode,
      result,
      proxyCpu: cpu[0]!,
      originCpu: cpu[1]!,
      clientCpu: cpu[2]!,
      otherCpu: other,
      stolenCpu: stolen,
      softirqCpu: softirq,
      loop,
      originConnections: origin.connections,
      originRequests: origin.requests,
      wallSeconds: wall,
    };
    console.log(
      `  ${round === 0 ? 'warm-up' : `round ${round}`} ${workload.padEnd(7)} ${LABEL[mode].padEnd(6)} ${describe(m)} ` +
        `[CPU: proxy ${pct(m.proxyCpu / wall)}, origin ${pct(m.originCpu / wall)}, ` +
        `client ${pct(m.clientCpu / wall)}, rest of machine ${pct(other / wall)}, ` +
        `machine-wide: stolen by the host ${pct(stolen / wall)}, softirq ${pct(softirq / wall)}]` +
        (loop
          ? ` [Moat event-loop delay p50 ${ms(loop.p50)} ms, p99 ${ms(loop.p99)} ms, max ${ms(loop.max)} ms]`
          : ''),
    );
    // Let closing connections settle between runs.
    await sleep(300);
    return m;
  };

  console.log('Warm-up (not counted):');
  for (const workload of workloads)
    for (const mode of modes) {
      const m = await measure(0, workload, mode, true);
      const errors =
        'errors' in m.result ? m.result.errors : 'error' in m.result && m.result.error ? 1 : 0;
      if (errors > 0 || !(figure(m) > 0))
        throw new Error(`${LABEL[mode]} fails the ${workload} workload: ${describe(m)}`);
    }

  console.log('Measured runs:');
  for (let round = 1; round <= rounds; round++)
    for (const workload of workloads)
      for (const mode of modes) results.push(await measure(round, workload, mode, false));

  const moatCounts = moat
    ? await ask<{
        metrics: Record<string, number>;
        memory: NodeJS.MemoryUsage;
        readBuffers: { inUse: number; pooled: number };
      }>(moat.child, 'metrics', 'metrics', 3000)
    : undefined;

  report(options, results);

  if (moatCounts) {
    const counts = Object.entries(moatCounts.metrics)
      .map(([k, v]) => `${k} ${formatInt(v)}`)
      .join(', ');
    const mib = (n: number) => `${(n / 2 ** 20).toFixed(0)} MiB`;
    const { rss, heapUsed, external } = moatCounts.memory;
    const { inUse, pooled } = moatCounts.readBuffers;
    console.log(
      `\nMoat's proxy counters over the whole run: ${counts}. Moat's memory at the end: ` +
        `RSS ${mib(rss)}, heap used ${mib(heapUsed)}, external ${mib(external)}; tunnel read ` +
        `buffers ${mib(inUse)} in use, ${mib(pooled)} pooled.`,
    );
  }
  const warnings = moat ? readFileSync(moatLog, 'utf8').split('\n').filter(Boolean) : [];
  if (warnings.length > 0)
    console.log(`Moat logged ${warnings.length} lines at warn or above; first: ${warnings[0]}`);

  if (options.profile && moat) {
    await stopChild(moat.child);
    const profiles = readdirSync(profileDir).filter((f) => f.endsWith('.cpuprofile'));
    if (profiles.length === 0) console.log('\nNo CPU profile was written.');
    for (const file of profiles) {
      console.log(`\n## Moat CPU profile (${join(profileDir, file)})\n`);
      console.log(summariseProfile(join(profileDir, file)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Report

function report(options: Options, results: Measured[]): void {
  const { rounds, workloads, modes } = options;
  const byRound = (workload: Workload, mode: Mode, value: (m: Measured) => number) => {
    const values: number[] = [];
    for (let round = 1; round <= rounds; round++) {
      const m = results.find(
        (r) => r.round === round && r.workload === workload && r.mode === mode,
      );
      values.push(m ? value(m) : Number.NaN);
    }
    return values;
  };
  const med = (values: number[]) => median(values.filter(Number.isFinite));
  const medOf = (workload: Workload, mode: Mode, value: (m: Measured) => number) =>
    modes.includes(mode) ? med(byRound(workload, mode, value)) : Number.NaN;
  /** Per-round ratio of Moat to a peer, and its median. */
  const roundRatios = (workload: Workload, peer: Mode, value: (m: Measured) => number) => {
    if (!modes.includes('moat') || !modes.includes(peer)) return { rounds: [], median: Number.NaN };
    const a = byRound(workload, 'moat', value);
    const b = byRound(workload, peer, value);
    const ratios = a.map((x, i) => x / b[i]!);
    return { rounds: ratios, median: med(ratios) };
  };
  const closed = (m: Measured) => m.result as ClosedLoopResult;
  const rate = (m: Measured) => m.result as RateResult;
  const perSecond = (m: Measured) => closed(m).perSecond;
  const p50 = (m: Measured) => closed(m).latency.p50;
  const p99 = (m: Measured) => closed(m).latency.p99;
  const setupP50 = (m: Measured) => rate(m).setup.p50;
  const setupP99 = (m: Measured) => rate(m).setup.p99;
  const bulkMb = (m: Measured) => figure(m);
  const cpuPerOp = (m: Measured) => m.proxyCpu / operations(m);
  const others = results.map((m) => m.otherCpu / m.wallSeconds).filter(Number.isFinite);
  const stolen = results.map((m) => m.stolenCpu / m.wallSeconds).filter(Number.isFinite);
  const softirq = results.map((m) => m.softirqCpu / m.wallSeconds).filter(Number.isFinite);

  const rows: string[][] = [];
  const verdicts: Array<{ pass: boolean; text: string }> = [];
  const verdict = (pass: boolean, text: string) => {
    verdicts.push({ pass, text });
    return pass ? 'PASS' : 'FAIL';
  };
  const row = (
    label: string,
    workload: Workload,
    value: (m: Measured) => number,
    format: (n: number) => string,
    target = '',
    result = '',
    withRatios = true,
  ) => {
    const vs = (peer: Mode) => (withRatios ? ratio(roundRatios(workload, peer, value).median) : '');
    rows.push([
      label,
      format(medOf(workload, 'moat', value)),
      format(medOf(workload, 'squid', value)),
      format(medOf(workload, 'direct', value)),
      vs('squid'),
      vs('direct'),
      target,
      result,
    ]);
  };
  if (workloads.includes('tunnels')) {
    const r = roundRatios('tunnels', 'squid', perSecond).median;
    row(
      `(a) new CONNECT tunnels/s, ${options.concurrency} concurrent, 1 GET each`,
      'tunnels',
      perSecond,
      num,
      '>= squid',
      modes.includes('squid')
        ? verdict(
            r >= TARGETS.tunnelsVsSquid,
            `(a) tunnels/s at least squid's: Moat/squid ${ratio(r)} (median of per-round ratios)`,
          )
        : '',
    );
    row('(a) tunnel iteration p50, ms', 'tunnels', p50, ms);
    row('(a) tunnel iteration p99, ms', 'tunnels', p99, ms);
  }
  if (workloads.includes('rate')) {
    row(`(a') setup p50 at ${options.rate} tunnels/s, ms`, 'rate', setupP50, ms, '', '', false);
    const diffs =
      modes.includes('moat') && modes.includes('direct')
        ? byRound('rate', 'moat', setupP99).map(
            (x, i) => x - byRound('rate', 'direct', setupP99)[i]!,
          )
        : [];
    const diff = med(diffs);
    row(
      `(a') setup p99 at ${options.rate} tunnels/s, ms`,
      'rate',
      setupP99,
      ms,
      `<= direct + ${TARGETS.p99AboveDirectMs} ms`,
      diffs.length
        ? `${verdict(diff <= TARGETS.p99AboveDirectMs, `(a') p99 tunnel setup at ${options.rate}/s at most ${TARGETS.p99AboveDirectMs} ms above direct: Moat - direct = ${signedMs(diff)} ms (median of per-round differences)`)} (${signedMs(diff)} ms)`
        : '',
      false,
    );
  }
  if (workloads.includes('bulk')) {
    const vsSquid = roundRatios('bulk', 'squid', bulkMb).median;
    const vsDirect = roundRatios('bulk', 'direct', bulkMb).median;
    const parts: string[] = [];
    if (modes.includes('squid'))
      parts.push(
        verdict(
          vsSquid >= TARGETS.bulkVsSquid,
          `(b) bulk at least squid's: Moat/squid ${ratio(vsSquid)}`,
        ),
      );
    if (modes.includes('direct'))
      parts.push(
        verdict(
          vsDirect >= TARGETS.bulkVsDirect,
          `(b) bulk at least 50% of direct: Moat/direct ${ratio(vsDirect)}`,
        ),
      );
    row(
      `(b) bulk, one tunnel, ${formatInt(options.bulkBytes / 2 ** 20)} MiB, MB/s`,
      'bulk',
      bulkMb,
      mb,
      '>= squid, >= 0.5x direct',
      parts.join(', '),
    );
  }
  if (workloads.includes('get')) {
    const r = roundRatios('get', 'squid', perSecond).median;
    row(
      `(c) absolute-form GET/s, ${options.connections} keep-alive conns`,
      'get',
      perSecond,
      num,
      '>= squid',
      modes.includes('squid')
        ? verdict(r >= TARGETS.getVsSquid, `(c) GET/s at least squid's: Moat/squid ${ratio(r)}`)
        : '',
    );
    row('(c) GET p50, ms', 'get', p50, ms);
    row('(c) GET p99, ms', 'get', p99, ms);
  }

  console.log(`\n## Results (median of ${rounds} rounds)\n`);
  console.log(
    markdownTable(
      ['workload', 'Moat', 'squid', 'direct', 'Moat/squid', 'Moat/direct', 'target', 'verdict'],
      rows,
      ['left', 'right', 'right', 'right', 'right', 'right', 'left', 'left'],
    ),
  );
  console.log(
    [
      '',
      'Ratios are medians of the per-round ratios (each round measures the three back to back, so ' +
        "a ratio compares runs that saw the same machine). Latency: the load client's clock, from " +
        'connect() to the last byte of the answer (tunnels) or from the request to its answer (GET).',
      "(a') setup: connect() to CONNECT's 200 through a proxy; direct: connect() to the TCP " +
        'connection being established. The verdict takes the median over rounds of Moat p99 - direct p99.',
      `Other load on the machine during the measured runs (CPU not used by the proxy, origin or ` +
        `client; ${cpus().length * 100}% = every CPU): median ${pct(med(others))}, ` +
        `max ${pct(Math.max(...others))}; runs with more than 50%: ${others.filter((o) => o > 0.5).length} ` +
        `of ${others.length}. Machine-wide, CPU stolen by the host (a virtual machine's CPUs serving ` +
        `other guests; process times may include some of it, and latency tails follow it): median ` +
        `${pct(med(stolen))}, max ${pct(Math.max(...stolen))}; softirq (the kernel's network work): ` +
        `median ${pct(med(softirq))}.`,
    ].join('\n'),
  );

  // Every round.
  const detail: string[][] = [];
  const perRound = (
    workload: Workload,
    what: string,
    value: (m: Measured) => number,
    format: (n: number) => string,
  ) => {
    for (const mode of modes) {
      const values = byRound(workload, mode, value);
      detail.push([what, LABEL[mode], ...values.map(format), format(med(values))]);
    }
    for (const peer of ['squid', 'direct'] as const) {
      if (!modes.includes(peer) || !modes.includes('moat')) continue;
      const r = roundRatios(workload, peer, value);
      detail.push([what, `Moat/${peer}`, ...r.rounds.map(ratio), ratio(r.median)]);
    }
  };
  if (workloads.includes('tunnels')) perRound('tunnels', '(a) tunnels/s', perSecond, num);
  if (workloads.includes('rate')) {
    for (const mode of modes) {
      const values = byRound('rate', mode, setupP99);
      detail.push([`(a') setup p99 ms`, LABEL[mode], ...values.map(ms), ms(med(values))]);
    }
    if (modes.includes('moat') && modes.includes('direct')) {
      const d = byRound('rate', 'direct', setupP99);
      const diffs = byRound('rate', 'moat', setupP99).map((x, i) => x - d[i]!);
      detail.push([
        `(a') setup p99 ms`,
        'Moat - direct',
        ...diffs.map(signedMs),
        signedMs(med(diffs)),
      ]);
    }
  }
  if (workloads.includes('bulk')) perRound('bulk', '(b) bulk MB/s', bulkMb, mb);
  if (workloads.includes('get')) perRound('get', '(c) GET/s', perSecond, num);
  console.log('\n## Every round\n');
  console.log(
    markdownTable(
      ['workload', 'mode', ...Array.from({ length: rounds }, (_, i) => `round ${i + 1}`), 'median'],
      detail,
      ['left', 'left', ...Array.from({ length: rounds + 1 }, () => 'right' as const)],
    ),
  );

  // CPU per operation of the proxy process, and the client's and origin's share.
  const cpuRows: string[][] = [];
  const unit: Record<Workload, string> = {
    tunnels: 'per tunnel',
    rate: `per tunnel at ${options.rate}/s`,
    bulk: 'per GB',
    get: 'per GET',
  };
  for (const workload of workloads) {
    const cells = (['moat', 'squid'] as const).map((mode) =>
      modes.includes(mode)
        ? workload === 'bulk'
          ? `${medOf(workload, mode, cpuPerOp).toFixed(2)} s`
          : us(medOf(workload, mode, cpuPerOp))
        : 'n/a',
    );
    const share = (mode: Mode) =>
      modes.includes(mode)
        ? `${(100 * medOf(workload, mode, (m) => m.proxyCpu / m.wallSeconds)).toFixed(0)}%`
        : 'n/a';
    const clientShare = `${(100 * medOf(workload, 'moat', (m) => m.clientCpu / m.wallSeconds)).toFixed(0)}% / ${(100 * medOf(workload, 'direct', (m) => m.clientCpu / m.wallSeconds)).toFixed(0)}%`;
    cpuRows.push([workload, unit[workload], ...cells, share('moat'), share('squid'), clientShare]);
  }
  console.log('\n## CPU of the proxy process (median over rounds, from /proc/<pid>/stat)\n');
  console.log(
    markdownTable(
      [
        'workload',
        'unit',
        'Moat CPU',
        'squid CPU',
        'Moat busy',
        'squid busy',
        'client busy (Moat / direct runs)',
      ],
      cpuRows,
      ['left', 'left', 'right', 'right', 'right', 'right', 'right'],
    ),
  );
  console.log(
    '\nbusy = CPU time / wall time of the run (100% = one core). The machine has ' +
      `${cpus().length} CPUs shared by the proxy, the origin, the load client and anything else running.`,
  );

  const errors = results.filter(
    (m) => ('errors' in m.result && m.result.errors > 0) || ('error' in m.result && m.result.error),
  );
  if (errors.length > 0) {
    console.log(`\nRuns with errors: ${errors.length}.`);
    for (const m of errors.slice(0, 10))
      console.log(`- round ${m.round} ${m.workload} ${LABEL[m.mode]}: ${describe(m)}`);
  }

  console.log('\n## Targets\n');
  for (const v of verdicts) console.log(`${v.pass ? 'PASS' : 'FAIL'}: ${v.text}`);
  if (options.strict && verdicts.some((v) => !v.pass)) process.exitCode = 1;
}

main().catch(async (error: unknown) => {
  console.error(`bench:proxy: ${(error as Error).stack ?? String(error)}`);
  await stopChildren();
  process.exit(1);
});
