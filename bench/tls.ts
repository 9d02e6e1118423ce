/**
 * `npm run bench:tls`: TLS interception, Moat against squid with ssl_bump, the same origin
 * and the same load client in one run, all on loopback.
 *
 * Workloads (the client: CONNECT <name>, TLS over the tunnel, small GETs; `concurrency`
 * workers or `connections` keep-alive connections):
 * (1) new intercepted TLS connections per second, one GET each: the proxy terminates TLS with
 *     a leaf for the name (cached after the first), opens TLS to the origin, adds the header;
 * (2) intercepted GETs per second on keep-alive connections;
 * (3) the leaf path: `--mint-names` names never seen before, one connection each (every one a
 *     leaf minted: Moat's MoatCa, squid's security_file_certgen helper), then the same names
 *     again (every leaf from the cache);
 * (4) the same as (1) and (2) through an opaque tunnel (Moat: a name without a rule; squid:
 *     ssl_bump splice): the client's TLS goes to the origin itself. Interception's cost is
 *     the ratio of the two.
 * Each round measures every workload for Moat and squid back to back (their order swapped
 * every round); medians over rounds and of per-round ratios are reported.
 *
 * Processes, each with its own event loop: the HTTPS origin (bench/tls-origin.ts, 127.0.0.21,
 * a certificate from a throwaway origin CA), Moat (bench/tls-moat.ts: startInterceptingProxy and
 * Moat's CA on a throwaway proxy CA), squid (Debian's squid-openssl, installed with apt-get when
 * missing; ssl_bump with the same proxy CA, `request_header_add` for the same header) and the
 * load client (bench/tls-client.ts). Before measuring, the origin must see the header from both
 * proxies on intercepted flows and not on opaque ones, or the run stops.
 *
 * Options: `--help`. Every child process is bounded in time and stopped on exit, error, SIGINT
 * and SIGTERM, and when this process dies.
 */
import type { ChildProcess } from 'node:child_process';
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  copyFileSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { TestCa } from './lib/certificate.js';
import {
  ask,
  forkReady,
  machineCpu,
  printHeading,
  runInScratchFolder,
  sleep,
  stopChild,
  stopChildren,
  treeCpuSeconds,
} from './lib/procs.js';
import { flag, list, readOptions, whole } from './lib/options.js';
import { summariseProfile } from './lib/profile.js';
import { formatInt, formatMs, formatRatio, markdownTable } from './lib/table.js';
import { median } from './lib/timing.js';
import type { ClosedLoopResult } from './proxy-common.js';
import {
  ensureSquid,
  type RunningSquid,
  squidUid,
  squidVersion,
  startSquid,
  stopSystemSquid,
} from './proxy-procs.js';
import {
  BUMP_NAME,
  BUMP_SUFFIX,
  type CheckResult,
  INJECTED_HEADER,
  INJECTED_PREFIX,
  INJECTED_SECRET,
  mintNames,
  ORIGIN_IP,
  SEEN_HEADER,
  type TlsJob,
  TUNNEL_NAME,
  TUNNEL_SUFFIX,
} from './tls-common.js';
import type { HostPort } from '../src/net/index.js';

type Mode = 'moat' | 'squid';
const MODES: readonly Mode[] = ['moat', 'squid'];
const LABEL: Record<Mode, string> = { moat: 'Moat', squid: 'squid' };
type Workload =
  'new' | 'keepalive' | 'mint-first' | 'mint-again' | 'opaque-new' | 'opaque-keepalive';
const WORKLOADS: readonly Workload[] = [
  'new',
  'keepalive',
  'mint-first',
  'mint-again',
  'opaque-new',
  'opaque-keepalive',
];
/** The --workloads names: (1) to (4), each the workloads it runs. */
const GROUPS: Readonly<Record<string, readonly Workload[]>> = {
  new: ['new'],
  keepalive: ['keepalive'],
  mint: ['mint-first', 'mint-again'],
  opaque: ['opaque-new', 'opaque-keepalive'],
};
const START_TIMEOUT_MS = 60_000;
/** Where Debian's squid-openssl keeps its certificate helper. */
const CERTGEN = '/usr/lib/squid/security_file_certgen';
/** A timed-by-count run (each mint name once) stops after this long at most. */
const MINT_CAP_SECONDS = 60;

interface Options {
  readonly rounds: number;
  readonly seconds: number;
  readonly concurrency: number;
  readonly connections: number;
  readonly mintNames: number;
  readonly modes: readonly Mode[];
  readonly workloads: readonly Workload[];
  readonly keep: boolean;
  readonly strict: boolean;
  readonly profile: boolean;
  readonly requestRules: boolean;
}

const SUMMARY = `TLS interception, Moat against squid with ssl_bump, with the same loopback HTTPS origin and
load client in one run: new intercepted connections per second, intercepted GETs on keep-alive
connections, leaves minted for new names and served from the cache, and the same through an
opaque tunnel (interception's cost is the ratio). Needs squid-openssl (installed with apt-get
when missing).`;

const OPTIONS = {
  rounds: whole({ default: 3, min: 1, max: 10, help: 'rounds, each measuring every workload' }),
  seconds: whole({ default: 5, min: 1, max: 30, help: 'seconds of each timed run' }),
  concurrency: whole({ default: 16, min: 1, max: 256, help: 'workers opening connections' }),
  connections: whole({ default: 16, min: 1, max: 256, help: 'keep-alive connections' }),
  'mint-names': whole({ default: 300, min: 10, max: 5000, help: 'new names per round (mint)' }),
  modes: list({ known: MODES, default: MODES, help: 'what is measured' }),
  workloads: list({
    known: Object.keys(GROUPS),
    default: Object.keys(GROUPS),
    help: 'which of the four workload groups run',
  }),
  strict: flag('exit 1 when a target fails'),
  keep: flag('keep the scratch folder with logs'),
  profile: flag('run Moat under node --cpu-prof and summarise it at the end (implies --keep)'),
  'request-rules': flag(
    "give Moat's intercepted names method and path rules (GET and HEAD of /* allowed, the rest denied): what deciding each request costs is the ratio to a run without",
  ),
};

function parseOptions(): Options {
  const values = readOptions('bench:tls', SUMMARY, OPTIONS);
  const workloads = values.workloads.flatMap((w) => GROUPS[w] ?? []);
  return {
    rounds: values.rounds,
    seconds: values.seconds,
    concurrency: values.concurrency,
    connections: values.connections,
    mintNames: values['mint-names'],
    modes: MODES.filter((m) => values.modes.includes(m)),
    workloads: WORKLOADS.filter((w) => workloads.includes(w)),
    keep: values.keep || values.profile,
    strict: values.strict,
    profile: values.profile,
    requestRules: values['request-rules'],
  };
}

// ---------------------------------------------------------------------------------------------
// squid with ssl_bump

/**
 * squid bumping what Moat intercepts and splicing what Moat tunnels: peek at the client's
 * hello (step 1, for its SNI), splice names below `tunnel.`, bump the rest with leaves
 * generated from `proxyCa` (the certificate helper with its own database, an in-memory cache
 * in squid), verify the origin against `originCa`, and add the header Moat adds.
 */
async function startBumpingSquid(
  dir: string,
  proxyCa: TestCa,
  originCa: TestCa,
  names: readonly string[],
  lifetime: number,
): Promise<RunningSquid> {
  const uid = squidUid();
  const bundle = join(dir, 'squid-ca.pem');
  writeFileSync(
    bundle,
    readFileSync(proxyCa.certFile(), 'utf8') + readFileSync(proxyCa.keyFile(), 'utf8'),
    { mode: 0o600 },
  );
  // The CA folders are the test user's alone; squid reads copies.
  const originCaFile = join(dir, 'origin-ca.pem');
  copyFileSync(originCa.certFile(), originCaFile);
  chmodSync(originCaFile, 0o644);
  const db = join(dir, 'ssl_db');
  const init = spawnSync(CERTGEN, ['-c', '-s', db, '-M', '16MB'], {
    encoding: 'utf8',
    timeout: 20_000,
  });
  if (init.status !== 0) throw new Error(`${CERTGEN} -c -s ${db} failed: ${init.stderr}`);
  if (uid !== undefined) {
    chownSync(bundle, uid, -1);
    spawnSync('chown', ['-R', String(uid), db], { timeout: 20_000 });
  }
  return startSquid(dir, ORIGIN_IP, names, lifetime, {
    portOptions:
      'ssl-bump generate-host-certificates=on dynamic_cert_mem_cache_size=16MB ' +
      `tls-cert=${bundle}`,
    config: [
      `sslcrtd_program ${CERTGEN} -s ${db} -M 16MB`,
      'acl step1 at_step SslBump1',
      `acl opaque ssl::server_name ${TUNNEL_SUFFIX}`,
      'ssl_bump peek step1',
      'ssl_bump splice opaque',
      'ssl_bump bump all',
      `tls_outgoing_options cafile=${originCaFile}`,
      `request_header_add ${INJECTED_HEADER} "${INJECTED_PREFIX}${INJECTED_SECRET}" all`,
    ],
  });
}

// ---------------------------------------------------------------------------------------------
// Running jobs

interface OriginStats {
  readonly connections: number;
  readonly resumed: number;
  readonly requests: number;
  readonly injected: number;
}

interface Measured {
  readonly round: number;
  readonly workload: Workload;
  readonly mode: Mode;
  readonly result: ClosedLoopResult;
  /** CPU seconds of the proxy (squid: with its helpers), the origin and the client. */
  readonly proxyCpu: number;
  readonly originCpu: number;
  readonly clientCpu: number;
  readonly otherCpu: number;
  readonly origin: OriginStats;
  readonly wallSeconds: number;
}

interface Procs {
  readonly client: ChildProcess;
  readonly origin: ChildProcess;
  readonly moat: ChildProcess | undefined;
  readonly squid: RunningSquid | undefined;
}

async function originStats(origin: ChildProcess): Promise<OriginStats> {
  const reply = await ask<{ stats: OriginStats }>(origin, 'stats', 'stats', 5000);
  const nan = Number.NaN;
  return reply?.stats ?? { connections: nan, resumed: nan, requests: nan, injected: nan };
}

function jobFor(
  workload: Workload,
  proxy: HostPort,
  round: number,
  options: Options,
  short: boolean,
): TlsJob {
  const seconds = short ? 1 : options.seconds;
  const { concurrency, connections } = options;
  switch (workload) {
    case 'new':
      return {
        type: 'connections',
        proxy,
        names: [BUMP_NAME],
        once: false,
        trust: 'proxy',
        concurrency,
        seconds,
      };
    case 'keepalive':
      return { type: 'keepalive', proxy, name: BUMP_NAME, trust: 'proxy', connections, seconds };
    case 'mint-first':
    case 'mint-again': {
      const names = mintNames(round, options.mintNames).slice(0, short ? 50 : undefined);
      return {
        type: 'connections',
        proxy,
        names,
        once: true,
        trust: 'proxy',
        concurrency,
        seconds: MINT_CAP_SECONDS,
      };
    }
    case 'opaque-new':
      return {
        type: 'connections',
        proxy,
        names: [TUNNEL_NAME],
        once: false,
        trust: 'origin',
        concurrency,
        seconds,
      };
    case 'opaque-keepalive':
      return { type: 'keepalive', proxy, name: TUNNEL_NAME, trust: 'origin', connections, seconds };
  }
}

/** The correctness check: the header reaches the origin when intercepted, and only then. */
async function checkInjection(client: ChildProcess, mode: Mode, port: number): Promise<void> {
  const proxy = { host: '127.0.0.1', port };
  for (const [name, trust, expected] of [
    [BUMP_NAME, 'proxy', 'yes'],
    [TUNNEL_NAME, 'origin', 'no'],
  ] as const) {
    const reply = await ask<{ result: CheckResult }>(
      client,
      { job: { type: 'check', proxy, name, trust } satisfies TlsJob },
      'result',
      20_000,
    );
    const head = reply?.result.head;
    const seen =
      head === undefined
        ? undefined
        : new RegExp(`\\r\\n${SEEN_HEADER}: (\\w+)`, 'i').exec(head)?.[1];
    if (seen !== expected)
      throw new Error(
        `correctness check failed: through ${LABEL[mode]}, a GET to https://${name} ` +
          `${expected === 'yes' ? 'should reach the origin with' : 'should reach the origin without'} ` +
          `the injected ${INJECTED_HEADER} header; the origin said ${SEEN_HEADER}: ${seen ?? '(no answer)'}` +
          `${reply?.result.error ? ` (error: ${reply.result.error})` : ''}`,
      );
  }
}

// ---------------------------------------------------------------------------------------------
// Formatting

const num = (n: number) => (Number.isFinite(n) ? formatInt(n) : 'n/a');
const ms = (n: number) => (Number.isFinite(n) ? formatMs(n) : 'n/a');
const ratio = (n: number) => (Number.isFinite(n) ? formatRatio(n) : 'n/a');
const pct = (n: number) => (Number.isFinite(n) ? `${Math.round(n * 100)}%` : 'n/a');
const us = (seconds: number) =>
  Number.isFinite(seconds) ? `${(seconds * 1e6).toFixed(0)} µs` : 'n/a';

function describe(m: Measured): string {
  const r = m.result;
  const errors = r.errors > 0 ? `, ${r.errors} errors (first: ${r.firstError})` : '';
  const unit = m.workload.endsWith('keepalive') ? 'GET/s' : 'conn/s';
  const o = m.origin;
  return (
    `${num(r.perSecond)} ${unit} (${formatInt(r.completed)}), p50 ${ms(r.latency.p50)} ms, ` +
    `p99 ${ms(r.latency.p99)} ms${errors}; origin: ${formatInt(o.requests)} requests, ` +
    `${formatInt(o.injected)} with the header, ${formatInt(o.connections)} TLS connections ` +
    `(${formatInt(o.resumed)} resumed)`
  );
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const options = parseOptions();
  const log = (line: string) => console.log(`bench:tls: ${line}`);
  let modes = options.modes;
  let squidMissing: string | undefined;
  if (modes.includes('squid')) {
    try {
      ensureSquid(log, { openssl: true });
      stopSystemSquid(log);
    } catch (error) {
      squidMissing = (error as Error).message;
      modes = modes.filter((m) => m !== 'squid');
    }
  }
  if (modes.length === 0) throw new Error(`nothing to measure: ${squidMissing}`);
  await runInScratchFolder('bench:tls', 'moat-bench-tls-', options.keep, (dir) =>
    run({ ...options, modes }, dir, squidMissing),
  );
}

async function run(options: Options, dir: string, squidMissing: string | undefined): Promise<void> {
  const proxyCa = new TestCa('bench:tls proxy CA');
  const originCa = new TestCa('bench:tls origin CA');
  try {
    await measureAll(options, dir, squidMissing, proxyCa, originCa);
  } finally {
    proxyCa.remove();
    originCa.remove();
  }
}

async function measureAll(
  options: Options,
  dir: string,
  squidMissing: string | undefined,
  proxyCa: TestCa,
  originCa: TestCa,
): Promise<void> {
  const { rounds, modes } = options;
  // Planned: timed runs, mint runs (~2 x names at a few hundred per second), gaps, warm-up.
  const perMode = 4 * (options.seconds + 0.5) + 2 * (options.mintNames / 200 + 0.5);
  const planned = (rounds + 0.5) * modes.length * perMode + 20;
  const lifetime = Math.ceil(2 * planned + 120);
  await printHeading('TLS interception benchmark: Moat vs squid with ssl_bump', dir);
  console.log(
    `${modes.includes('squid') ? `squid ${squidVersion()} (OpenSSL build). ` : ''}` +
      `${rounds} rounds, medians. About ${Math.ceil(planned / 60)} min.`,
  );
  if (squidMissing)
    console.log(`squid with OpenSSL is missing (${squidMissing}): Moat's figures only.`);

  const originLeaf = originCa.issue([`*${BUMP_SUFFIX}`, `*${TUNNEL_SUFFIX}`]);
  const originKey = join(dir, 'origin-key.pem');
  const originCert = join(dir, 'origin-cert.pem');
  writeFileSync(originKey, originLeaf.key, { mode: 0o600 });
  writeFileSync(originCert, originLeaf.cert);
  const origin = await forkReady<{ port: number }>(
    './tls-origin.js',
    [originKey, originCert, String(lifetime)],
    [],
    join(dir, 'origin.log'),
    START_TIMEOUT_MS,
  );
  const originPort = origin.ready.port;
  const profileDir = join(dir, 'profile');
  const moat = modes.includes('moat')
    ? await forkReady<{ port: number; io: string }>(
        './tls-moat.js',
        [
          proxyCa.certFile(),
          proxyCa.keyFile(),
          originCa.certFile(),
          String(originPort),
          String(rounds),
          String(options.mintNames),
          String(lifetime),
          options.requestRules ? 'on' : 'off',
        ],
        options.profile ? ['--cpu-prof', '--cpu-prof-dir', profileDir] : [],
        join(dir, 'moat.log'),
        START_TIMEOUT_MS,
      )
    : undefined;
  const allNames = [BUMP_NAME, TUNNEL_NAME];
  for (let round = 0; round <= rounds; round++)
    allNames.push(...mintNames(round, options.mintNames));
  const squid = modes.includes('squid')
    ? await startBumpingSquid(dir, proxyCa, originCa, allNames, lifetime)
    : undefined;
  const client = await forkReady<boolean>(
    './tls-client.js',
    [proxyCa.certFile(), originCa.certFile(), String(originPort), String(lifetime)],
    [],
    join(dir, 'client.log'),
    START_TIMEOUT_MS,
  );
  const procs: Procs = { client: client.child, origin: origin.child, moat: moat?.child, squid };
  const ports: Record<Mode, number> = { moat: moat?.ready.port ?? 0, squid: squid?.port ?? 0 };

  console.log(
    [
      '',
      'Setup (all on loopback, each a process of its own):',
      `- origin (bench/tls-origin.ts, ${ORIGIN_IP}:${originPort}): Node's TLS server with a leaf ` +
        `for *${BUMP_SUFFIX} and *${TUNNEL_SUFFIX} from a throwaway origin CA (ECDSA P-256), a ` +
        'hand-written HTTP/1.1 responder: 200, 64-byte body, whether the request carried ' +
        `"${INJECTED_HEADER}: ${INJECTED_PREFIX}${INJECTED_SECRET}".`,
      moat
        ? `- Moat (bench/tls-moat.ts, 127.0.0.1:${moat.ready.port}): startInterceptingProxy ` +
          "(the egress proxy from Moat's own parts) with MoatCa on a throwaway proxy CA " +
          '(--ca-cert/--ca-key; leaves ECDSA P-256, cached), --upstream-ca the origin CA; one ' +
          `sandbox allowed *${BUMP_SUFFIX} and *${TUNNEL_SUFFIX}, a header rule for ` +
          `*${BUMP_SUFFIX} (${INJECTED_HEADER}: ${INJECTED_PREFIX}\${secret}), none for the other; ` +
          `CONNECT arrives on ${moat.ready.io}.`
        : '',
      squid
        ? `- squid (127.0.0.1:${squid.port}, squid -N): ${squid.config.split('\n').join('; ')}.`
        : '',
      `- load client (bench/tls-client.ts): Node's TLS client through CONNECT, no session ` +
        'resumption, verifying against the proxy CA (intercepted) or the origin CA (opaque).',
      `- new connections: ${options.concurrency} concurrent loops of connect, CONNECT, TLS, one GET ` +
        `(Connection: close), close; keep-alive: ${options.connections} connections, one GET at a ` +
        `time each; ${options.seconds} s per run. Leaves: ${options.mintNames} names never seen ` +
        'before, one connection each, then the same names again.',
      `- ${rounds} rounds; in each, every workload runs for ${modes.map((m) => LABEL[m]).join(' and ')} ` +
        'back to back (order swapped every round); medians over rounds.',
      '',
    ]
      .filter(Boolean)
      .join('\n'),
  );

  for (const mode of modes) await checkInjection(client.child, mode, ports[mode]);
  console.log(
    `Correctness check passed: the origin saw ${INJECTED_HEADER} on intercepted GETs through ` +
      `${modes.map((m) => LABEL[m]).join(' and ')}, and not on opaque ones.\n`,
  );

  const measure = async (round: number, workload: Workload, mode: Mode, short: boolean) => {
    const proxyPid = () => (mode === 'moat' ? procs.moat?.pid : procs.squid?.pid());
    const pids = [proxyPid(), procs.origin.pid, procs.client.pid];
    const statsBefore = await originStats(procs.origin);
    const before = pids.map(treeCpuSeconds);
    const machineBefore = machineCpu();
    const started = performance.now();
    const job = jobFor(workload, { host: '127.0.0.1', port: ports[mode] }, round, options, short);
    const reply = await ask<{ result: ClosedLoopResult & { error?: string } }>(
      procs.client,
      { job },
      'result',
      (MINT_CAP_SECONDS + 60) * 1000,
    );
    const wall = (performance.now() - started) / 1000;
    const after = pids.map(treeCpuSeconds);
    const machine = machineCpu().busy - machineBefore.busy;
    const statsAfter = await originStats(procs.origin);
    if (reply === undefined || reply.result.error !== undefined)
      throw new Error(
        `the load client failed ${workload} through ${LABEL[mode]}: ${reply?.result.error ?? 'no answer'}`,
      );
    const cpu = after.map((a, i) => a - before[i]!);
    const ours = cpu.reduce((sum, c) => sum + (Number.isFinite(c) ? c : 0), 0);
    const m: Measured = {
      round,
      workload,
      mode,
      result: reply.result,
      proxyCpu: cpu[0]!,
      originCpu: cpu[1]!,
      clientCpu: cpu[2]!,
      otherCpu: Math.max(0, machine - ours),
      origin: {
        connections: statsAfter.connections - statsBefore.connections,
        resumed: statsAfter.resumed - statsBefore.resumed,
        requests: statsAfter.requests - statsBefore.requests,
        injected: statsAfter.injected - statsBefore.injected,
      },
      wallSeconds: wall,
    };
    console.log(
      `  ${round === 0 ? 'warm-up' : `round ${round}`} ${workload.padEnd(16)} ${LABEL[mode].padEnd(5)} ` +
        `${describe(m)} [CPU: proxy ${pct(m.proxyCpu / wall)}, origin ${pct(m.originCpu / wall)}, ` +
        `client ${pct(m.clientCpu / wall)}, rest of machine ${pct(m.otherCpu / wall)}]`,
    );
    await sleep(300);
    return m;
  };

  const runs = (list: readonly Workload[]) => list.filter((w) => options.workloads.includes(w));
  console.log('Warm-up (not counted):');
  for (const workload of options.workloads)
    for (const mode of modes) {
      const m = await measure(0, workload, mode, true);
      if (m.result.errors > 0 || !(m.result.perSecond > 0))
        throw new Error(`${LABEL[mode]} fails the ${workload} workload: ${describe(m)}`);
    }

  console.log('Measured runs:');
  const results: Measured[] = [];
  for (let round = 1; round <= rounds; round++) {
    const order = round % 2 === 1 ? modes : [...modes].reverse();
    for (const workload of runs(['new', 'keepalive', 'opaque-new', 'opaque-keepalive']))
      for (const mode of order) results.push(await measure(round, workload, mode, false));
    // A proxy's first sight of the round's names, then the same names again at once.
    for (const mode of order)
      for (const workload of runs(['mint-first', 'mint-again']))
        results.push(await measure(round, workload, mode, false));
  }

  const leaves = moat
    ? (
        await ask<{ leaves: { minted: number; hits: number; cached: number } }>(
          moat.child,
          'leaves',
          'leaves',
          3000,
        )
      )?.leaves
    : undefined;

  report(options, results);
  if (leaves)
    console.log(
      `\nMoat's CA over the whole run (warm-up and checks included): ${formatInt(leaves.minted)} ` +
        `leaves minted, ${formatInt(leaves.hits)} answered from the cache, ${formatInt(leaves.cached)} held.`,
    );
  if (squidMissing) console.log(`\nsquid is missing (${squidMissing}); only Moat was measured.`);
  if (options.profile && moat) {
    await stopChild(moat.child);
    for (const file of readdirSync(profileDir).filter((f) => f.endsWith('.cpuprofile'))) {
      console.log(`\n## Moat CPU profile (${join(profileDir, file)})\n`);
      console.log(summariseProfile(join(profileDir, file)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Report

function report(options: Options, results: Measured[]): void {
  const { rounds, modes } = options;
  const byRound = (workload: Workload, mode: Mode, value: (m: Measured) => number) =>
    Array.from({ length: rounds }, (_, i) => {
      const m = results.find(
        (r) => r.round === i + 1 && r.workload === workload && r.mode === mode,
      );
      return m ? value(m) : Number.NaN;
    });
  const med = (values: number[]) => median(values.filter(Number.isFinite));
  const medOf = (workload: Workload, mode: Mode, value: (m: Measured) => number) =>
    modes.includes(mode) ? med(byRound(workload, mode, value)) : Number.NaN;
  /** Median of per-round ratios a/b. */
  const ratioOf = (a: number[], b: number[]) => med(a.map((x, i) => x / b[i]!));
  const perSecond = (m: Measured) => m.result.perSecond;
  const p50 = (m: Measured) => m.result.latency.p50;
  const p99 = (m: Measured) => m.result.latency.p99;
  const vsSquid = (workload: Workload, value: (m: Measured) => number) =>
    modes.includes('squid') && modes.includes('moat')
      ? ratioOf(byRound(workload, 'moat', value), byRound(workload, 'squid', value))
      : Number.NaN;
  const within = (a: Workload, b: Workload, mode: Mode) =>
    modes.includes(mode)
      ? ratioOf(byRound(a, mode, perSecond), byRound(b, mode, perSecond))
      : Number.NaN;

  const verdicts: Array<{ pass: boolean; text: string }> = [];
  const rows: string[][] = [];
  const row = (
    label: string,
    workload: Workload,
    value: (m: Measured) => number,
    format: (n: number) => string,
    target = '',
  ) => {
    const r = vsSquid(workload, value);
    let verdict = '';
    if (target && Number.isFinite(r)) {
      const pass = r >= 1;
      verdicts.push({ pass, text: `${label} at least squid's: Moat/squid ${ratio(r)}` });
      verdict = pass ? 'PASS' : 'FAIL';
    }
    rows.push([
      label,
      format(medOf(workload, 'moat', value)),
      format(medOf(workload, 'squid', value)),
      ratio(r),
      target,
      verdict,
    ]);
  };
  const c = options.concurrency;
  row(
    `(1) new intercepted TLS connections/s, ${c} concurrent, 1 GET each`,
    'new',
    perSecond,
    num,
    '>= squid',
  );
  row('(1) connection p50, ms', 'new', p50, ms);
  row('(1) connection p99, ms', 'new', p99, ms);
  row(
    `(2) intercepted GET/s, ${options.connections} keep-alive connections`,
    'keepalive',
    perSecond,
    num,
    '>= squid',
  );
  row('(2) GET p50, ms', 'keepalive', p50, ms);
  row('(2) GET p99, ms', 'keepalive', p99, ms);
  row(
    `(3) new connections/s, ${options.mintNames} names seen first (leaf minted)`,
    'mint-first',
    perSecond,
    num,
  );
  row('(3) the same names again (leaf from the cache)', 'mint-again', perSecond, num);
  rows.push([
    '(3) cache / first sight, connections/s',
    ratio(within('mint-again', 'mint-first', 'moat')),
    ratio(within('mint-again', 'mint-first', 'squid')),
    '',
    '',
    '',
  ]);
  row(`(4) new opaque-tunnel TLS connections/s (no rule / splice)`, 'opaque-new', perSecond, num);
  row(
    `(4) opaque-tunnel GET/s, ${options.connections} keep-alive connections`,
    'opaque-keepalive',
    perSecond,
    num,
  );
  rows.push([
    '(4) intercepted / opaque, new connections/s',
    ratio(within('new', 'opaque-new', 'moat')),
    ratio(within('new', 'opaque-new', 'squid')),
    '',
    '',
    '',
  ]);
  rows.push([
    '(4) intercepted / opaque, keep-alive GET/s',
    ratio(within('keepalive', 'opaque-keepalive', 'moat')),
    ratio(within('keepalive', 'opaque-keepalive', 'squid')),
    '',
    '',
    '',
  ]);

  console.log(`\n## Results (median of ${rounds} rounds)\n`);
  console.log(
    markdownTable(['workload', 'Moat', 'squid', 'Moat/squid', 'target', 'verdict'], rows, [
      'left',
      'right',
      'right',
      'right',
      'left',
      'left',
    ]),
  );
  console.log(
    '\nRatios are medians of per-round ratios (each round runs Moat and squid back to back). ' +
      "Latency: the load client's clock, connect() to the last byte of the answer (new " +
      'connections) or request to answer (keep-alive).',
  );

  const detail: string[][] = [];
  for (const workload of options.workloads) {
    for (const mode of modes) {
      const values = byRound(workload, mode, perSecond);
      detail.push([workload, LABEL[mode], ...values.map(num), num(med(values))]);
    }
    if (modes.length === 2) {
      const a = byRound(workload, 'moat', perSecond);
      const b = byRound(workload, 'squid', perSecond);
      detail.push([
        workload,
        'Moat/squid',
        ...a.map((x, i) => ratio(x / b[i]!)),
        ratio(ratioOf(a, b)),
      ]);
    }
  }
  console.log('\n## Every round (connections/s or GET/s)\n');
  console.log(
    markdownTable(
      [
        'workload',
        'proxy',
        ...Array.from({ length: rounds }, (_, i) => `round ${i + 1}`),
        'median',
      ],
      detail,
      ['left', 'left', ...Array.from({ length: rounds + 1 }, () => 'right' as const)],
    ),
  );

  const cpuRows: string[][] = options.workloads.map((workload) => [
    workload,
    ...modes.map((mode) =>
      us(medOf(workload, mode, (m) => m.proxyCpu / Math.max(1, m.result.completed))),
    ),
    ...modes.map((mode) => pct(medOf(workload, mode, (m) => m.proxyCpu / m.wallSeconds))),
    ...modes.map((mode) =>
      num(
        medOf(
          workload,
          mode,
          (m) => (1000 * m.origin.connections) / Math.max(1, m.origin.requests),
        ),
      ),
    ),
  ]);
  console.log('\n## CPU of the proxy (squid with its helpers) and origin connections\n');
  console.log(
    markdownTable(
      [
        'workload',
        ...modes.map((m) => `${LABEL[m]} CPU per op`),
        ...modes.map((m) => `${LABEL[m]} busy`),
        ...modes.map((m) => `${LABEL[m]} origin TLS conns per 1,000 GETs`),
      ],
      cpuRows,
      ['left', ...cpuRows[0]!.slice(1).map(() => 'right' as const)],
    ),
  );
  const others = results.map((m) => m.otherCpu / m.wallSeconds).filter(Number.isFinite);
  console.log(
    `\nbusy = CPU time / wall time (100% = one core). The machine has ${cpus().length} CPUs shared ` +
      'by the proxy, the origin, the load client and anything else; other load during the ' +
      `measured runs: median ${pct(med(others))}, max ${pct(Math.max(...others))}.`,
  );

  const errors = results.filter((m) => m.result.errors > 0);
  if (errors.length > 0) {
    console.log(`\nRuns with errors: ${errors.length}.`);
    for (const m of errors.slice(0, 10))
      console.log(`- round ${m.round} ${m.workload} ${LABEL[m.mode]}: ${describe(m)}`);
  }
  const missing = results.filter(
    (m) =>
      m.workload !== 'opaque-new' &&
      m.workload !== 'opaque-keepalive' &&
      m.origin.injected !== m.origin.requests,
  );
  if (missing.length > 0)
    console.log(
      `\nWARNING: ${missing.length} intercepted runs had requests without the header at the origin.`,
    );

  if (verdicts.length > 0) {
    console.log('\n## Targets\n');
    for (const v of verdicts) console.log(`${v.pass ? 'PASS' : 'FAIL'}: ${v.text}`);
    if (options.strict && verdicts.some((v) => !v.pass)) process.exitCode = 1;
  }
}

main().catch(async (error: unknown) => {
  console.error(`bench:tls: ${(error as Error).stack ?? String(error)}`);
  await stopChildren();
  process.exit(1);
});
