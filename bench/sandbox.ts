/**
 * `npm run bench:sandbox`: sandboxes and commands through the real `e2b` SDK. `moat serve` runs
 * as a child process (the built CLI, a scratch data folder, loopback ports, pino at warn) and
 * this script is the client, configured only by E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and
 * E2B_DOMAIN, as a user would. Over 100 sandboxes, one after another:
 *
 * - create to first command: from calling Sandbox.create() to the end of
 *   `await sbx.commands.run('true')`, and its split into the create and the first command;
 * - commands.run('true') round trips on the existing sandbox (10 per sandbox);
 * - the same round trip split at the start event (`background: true`, then `wait()`): request
 *   to "process started", and from there to its end;
 * - sbx.kill();
 * - CPU that Moat and this process (the SDK client) spend per commands.run.
 *
 * Peers, measured in the same run and interleaved with the sandboxes (after each sandbox, 10
 * starts of each in turn), every one spawned the way Moat spawns a command (own process group,
 * stdio pipes, stdin closed; timed from spawn() to 'close'):
 *
 * - bash: `/bin/bash -l -c true` directly (Moat's unconfined launch, HOME an empty folder): the
 *   floor of starting the command at all;
 * - bwrap: the same inside bubblewrap with exactly the arguments Moat uses (its own launch
 *   function in src/runtime/confinement.ts, on a sandbox-like root folder), when bwrap works;
 * - "+ cgroup" variants of both: wrapped as Moat wraps what it starts to join a freezer cgroup
 *   (src/runtime/containment.ts), when this host lets us make one. bwrap + cgroup is what Moat
 *   pays once per sandbox and user, for its launcher; each command is then a fork and exec
 *   inside, so plain bash is the floor a command is compared with.
 *
 * Targets (issue): create to first command p50 under 100 ms; commands.run p50 under 10 ms.
 *
 * Everything is on loopback; no DNS query is made (the DNS upstream names a loopback port
 * where nothing listens). Counts are fixed, every SDK call and every spawn has a time limit,
 * the whole run has one (TIMEOUT_MS), and the children are stopped on exit, error, SIGINT and
 * SIGTERM, and when this process dies. Options: `--help`.
 */
import { type ChildProcess, execFileSync, spawn, type SpawnOptions } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { Sandbox } from 'e2b';
import { cpuSeconds, printHeading, runInScratchFolder, stopChildren, track } from './lib/procs.js';
import { startMoatServe } from './lib/moat-serve.js';
import { flag, readOptions } from './lib/options.js';
import { summariseProfile } from './lib/profile.js';
import { formatBytes, formatInt, formatMs, formatRatio, markdownTable } from './lib/table.js';
import { nowNs } from './lib/timing.js';

const HOST = '127.0.0.1';
const BWRAP = '/usr/bin/bwrap';
const API_KEY = 'bench-sandbox-api-key-0123456789';
const DOMAIN = 'moat.bench.test';
const SANDBOXES = 100;
/** Sandboxes that go through the whole procedure before measuring (JIT, connections, caches). */
const WARMUP = 5;
const RUNS_PER_SANDBOX = 10;
/** Extra round trips per sandbox split at the start event. */
const SPLIT_RUNS_PER_SANDBOX = 3;
/** Starts of each peer after each sandbox (so each peer gets as many as commands.run). */
const PEER_RUNS_PER_SANDBOX = RUNS_PER_SANDBOX;
/** Sandbox lifetime on Moat; each is killed long before. */
const SANDBOX_TIMEOUT_MS = 120_000;
const REQUEST_TIMEOUT_MS = 10_000;
const SPAWN_TIMEOUT_MS = 10_000;
const TIMEOUT_MS = 300_000;
const TARGETS = { createToFirstP50Ms: 100, runP50Ms: 10 };
/** What the SDK runs for commands.run(cmd): `/bin/bash -l -c <cmd>`. */
const COMMAND = ['/bin/bash', '-l', '-c', 'true'];

/** Limits for every SDK call: none may hang the run. */
const CALL = { requestTimeoutMs: REQUEST_TIMEOUT_MS, timeoutMs: REQUEST_TIMEOUT_MS };

// ---------------------------------------------------------------------------------------------
// Moat as a child process

interface StartedMoat {
  readonly child: ChildProcess;
  readonly pid: number;
  readonly apiPort: number;
  readonly sandboxPort: number;
  /** Its start-up line "moat: processes ...", without the prefix. */
  readonly processes: string;
}

async function startMoat(
  dir: string,
  lifetimeSeconds: number,
  profileDir: string | undefined,
): Promise<StartedMoat> {
  const moat = await startMoatServe({
    dir,
    apiKey: API_KEY,
    lifetimeSeconds,
    ...(profileDir ? { profileDir } : {}),
  });
  return { ...moat, processes: moat.line('processes') ?? '?' };
}

// ---------------------------------------------------------------------------------------------
// Peers: starting the same command without Moat

interface Peer {
  readonly label: string;
  readonly argv: string[];
  readonly options: SpawnOptions;
}

/** Spawns as Moat does (src/runtime/processes.ts) and resolves with ms from spawn to 'close'. */
function timeSpawn(peer: Peer): Promise<number> {
  return new Promise((resolve, reject) => {
    const started = nowNs();
    const child = track(spawn(peer.argv[0]!, peer.argv.slice(1), peer.options));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${peer.label}: no exit within ${SPAWN_TIMEOUT_MS} ms`));
    }, SPAWN_TIMEOUT_MS);
    let stderr = '';
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    child.stdout?.resume();
    child.stdin?.end();
    child.once('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      const ms = Number(nowNs() - started) / 1e6;
      if (code === 0) resolve(ms);
      else reject(new Error(`${peer.label}: exit ${code ?? signal}; stderr: ${stderr.trim()}`));
    });
  });
}

/** What Moat passes to spawn(): its own process group, stdio pipes. */
const spawnOptions = (cwd: string, env: Record<string, string>): SpawnOptions => ({
  cwd,
  env,
  detached: true,
  stdio: ['pipe', 'pipe', 'pipe'],
});

/** Whether bubblewrap can make its namespaces here (it needs user namespaces). */
function bubblewrapWorks(): string | undefined {
  if (!existsSync(BWRAP)) return `${BWRAP} is not installed (Debian package bubblewrap)`;
  try {
    execFileSync(BWRAP, ['--unshare-user', '--unshare-pid', '--ro-bind', '/', '/', '/bin/true'], {
      stdio: 'ignore',
      timeout: SPAWN_TIMEOUT_MS,
    });
    return undefined;
  } catch (error) {
    return `bwrap cannot make namespaces here: ${(error as Error).message}`;
  }
}

/**
 * The peers: the command directly (HOME an empty folder, so that no host dotfiles are read),
 * the floor of starting it at all; and the same inside a fresh bubblewrap sandbox (own user and
 * PID namespaces, the host's system folders read-only, a home of its own), what a well-known
 * confinement tool pays to start one sandboxed command from nothing.
 */
async function peers(dir: string): Promise<{ list: Peer[]; notes: string[] }> {
  const home = join(dir, 'peer-home');
  await mkdir(home, { recursive: true });
  const env = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: home, USER: 'user' };
  const list: Peer[] = [{ label: 'bash', argv: COMMAND, options: spawnOptions(home, env) }];
  const notes: string[] = [];
  const problem = bubblewrapWorks();
  if (problem === undefined) {
    const binds = ['/usr', '/bin', '/lib', '/lib64', '/etc'].flatMap((folder) =>
      existsSync(folder) ? ['--ro-bind', folder, folder] : [],
    );
    list.push({
      label: 'bwrap',
      argv: [
        BWRAP,
        ...['--unshare-user', '--uid', '1000', '--unshare-pid', '--unshare-ipc', '--unshare-uts'],
        ...binds,
        ...['--bind', home, '/home/user', '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp'],
        ...['--chdir', '/home/user', '--setenv', 'HOME', '/home/user', '--'],
        ...COMMAND,
      ],
      options: spawnOptions('/', env),
    });
  } else notes.push(`the bwrap peer is left out: ${problem}`);
  return { list, notes };
}

const PEER_TEXT: Readonly<Record<string, string>> = {
  bash: `\`${COMMAND.join(' ')}\` directly, own process group, stdio pipes, HOME an empty folder (with HOME=/root the host's own dotfiles would be read)`,
  bwrap:
    'the command in a fresh bubblewrap sandbox: own user, PID, IPC and UTS namespaces, /usr /bin /lib /lib64 /etc read-only, a home and /tmp of its own',
};

// ---------------------------------------------------------------------------------------------
// The run

const percentile = (values: readonly number[], q: number): number => {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!;
};
const ms = (value: number) => `${formatMs(value)} ms`;
const sinceMs = (t0: bigint) => Number(nowNs() - t0) / 1e6;

interface Samples {
  createToFirst: number[];
  create: number[];
  first: number[];
  run: number[];
  /** commands.run split at the start event: request to pid, pid to end. */
  toStart: number[];
  startToEnd: number[];
  kill: number[];
  peers: Map<string, number[]>;
  /** CPU seconds over the measured commands.run blocks: Moat's, and this process's. */
  cpu: { moat: number; client: number; runs: number };
}

/** One sandbox through the whole procedure; adds its figures to `into` when given. */
async function oneSandbox(moatPid: number, into: Samples | undefined): Promise<void> {
  const t0 = nowNs();
  const sbx = await Sandbox.create({
    timeoutMs: SANDBOX_TIMEOUT_MS,
    requestTimeoutMs: REQUEST_TIMEOUT_MS,
  });
  const created = sinceMs(t0);
  try {
    await sbx.commands.run('true', CALL);
    const total = sinceMs(t0);
    into?.createToFirst.push(total);
    into?.create.push(created);
    into?.first.push(total - created);

    const moatCpu = cpuSeconds(moatPid);
    const clientCpu = process.cpuUsage();
    for (let i = 0; i < RUNS_PER_SANDBOX; i++) {
      const r0 = nowNs();
      await sbx.commands.run('true', CALL);
      into?.run.push(sinceMs(r0));
    }
    if (into) {
      const client = process.cpuUsage(clientCpu);
      into.cpu.moat += cpuSeconds(moatPid) - moatCpu;
      into.cpu.client += (client.user + client.system) / 1e6;
      into.cpu.runs += RUNS_PER_SANDBOX;
    }

    for (let i = 0; i < SPLIT_RUNS_PER_SANDBOX; i++) {
      const r0 = nowNs();
      const handle = await sbx.commands.run('true', { ...CALL, background: true });
      const started = sinceMs(r0);
      const result = await handle.wait();
      if (result.exitCode !== 0) throw new Error(`true exited with ${result.exitCode}`);
      into?.toStart.push(started);
      into?.startToEnd.push(sinceMs(r0) - started);
    }
  } finally {
    const k0 = nowNs();
    await sbx.kill(CALL);
    into?.kill.push(sinceMs(k0));
  }
}

/** Each peer in turn, `count` times (interleaved, so interference hits them alike). */
async function runPeers(list: readonly Peer[], count: number, into?: Samples): Promise<void> {
  for (let i = 0; i < count; i++) {
    for (const peer of list) {
      const spent = await timeSpawn(peer);
      if (into) {
        const samples = into.peers.get(peer.label) ?? [];
        samples.push(spent);
        into.peers.set(peer.label, samples);
      }
    }
  }
}

async function run(dir: string, strict: boolean, profile: boolean): Promise<void> {
  const lifetime = TIMEOUT_MS / 1000 + 30;
  await printHeading('Sandbox benchmark: create and commands.run through the e2b SDK', dir);

  const profileDir = profile ? join(dir, 'profile') : undefined;
  const moat = await startMoat(dir, lifetime, profileDir);
  Object.assign(process.env, {
    E2B_API_URL: `http://${HOST}:${moat.apiPort}`,
    E2B_SANDBOX_URL: `http://${HOST}:${moat.sandboxPort}`,
    E2B_API_KEY: API_KEY,
    E2B_DOMAIN: DOMAIN,
  });
  const { list: peerList, notes } = await peers(dir);
  const samples: Samples = {
    createToFirst: [],
    create: [],
    first: [],
    run: [],
    toStart: [],
    startToEnd: [],
    kill: [],
    peers: new Map(),
    cpu: { moat: 0, client: 0, runs: 0 },
  };
  const wall = nowNs();
  for (let i = 0; i < WARMUP; i++) {
    await oneSandbox(moat.pid, undefined);
    await runPeers(peerList, PEER_RUNS_PER_SANDBOX);
  }
  for (let i = 0; i < SANDBOXES; i++) {
    await oneSandbox(moat.pid, samples);
    await runPeers(peerList, PEER_RUNS_PER_SANDBOX, samples);
  }
  const wallSeconds = sinceMs(wall) / 1000;
  const memory = readFileSync(`/proc/${moat.pid}/status`, 'utf8');
  const kb = (field: string) =>
    Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(memory)?.[1]) * 1024;

  // ------------------------------------------------------------------------- report
  const p = percentile;
  console.log(
    [
      '',
      'Setup (all on loopback):',
      `- Moat: \`node dist/src/cli/main.js serve\` (pid ${moat.pid}), a fresh data folder, ` +
        `pino at warn, transparent listener off${profile ? ', under node --cpu-prof (slower)' : ''}.`,
      `- Moat's processes: ${moat.processes}.`,
      '- Client: the `e2b` SDK in this process, with only E2B_API_URL, E2B_SANDBOX_URL (the ' +
        'sandbox listener), E2B_API_KEY and E2B_DOMAIN set; Sandbox.create() with the default ' +
        'template (POST /v2/sandboxes, so the sandbox API wants its access token).',
      `- ${SANDBOXES} sandboxes one after another, each: create, commands.run('true'), ` +
        `${RUNS_PER_SANDBOX} more commands.run('true'), ${SPLIT_RUNS_PER_SANDBOX} split at the ` +
        'start event (background, then wait), kill. Not counted: a warm-up of ' +
        `${WARMUP} sandboxes (and ${PEER_RUNS_PER_SANDBOX} starts of each peer after each).`,
      `- Peers: after each sandbox, ${PEER_RUNS_PER_SANDBOX} starts of each in turn, spawned ` +
        'as Moat spawns (own process group, stdio pipes, stdin closed), timed from spawn() ' +
        `to 'close':`,
      ...peerList.map((peer) => `  - ${peer.label}: ${PEER_TEXT[peer.label] ?? ''}.`),
      ...notes.map((note) => `  - ${note}.`),
      `- Whole measured run: ${wallSeconds.toFixed(1)} s. Moat's resident memory at the end ` +
        `${formatBytes(kb('VmRSS'))} (peak ${formatBytes(kb('VmHWM'))}).`,
    ].join('\n'),
  );

  const row = (label: string, values: number[]) => [
    label,
    formatInt(values.length),
    ms(p(values, 0.5)),
    ms(p(values, 0.99)),
    ms(Math.max(...values)),
  ];
  console.log(`\n## Moat through the SDK (${SANDBOXES} sandboxes)\n`);
  console.log(
    markdownTable(
      ['measure', 'samples', 'p50', 'p99', 'max'],
      [
        row("create to first command (create + run('true'))", samples.createToFirst),
        row('  of which Sandbox.create()', samples.create),
        row("  of which the first commands.run('true')", samples.first),
        row("commands.run('true') on an existing sandbox", samples.run),
        row('  split: request to start event (pid)', samples.toStart),
        row('  split: start event to end event', samples.startToEnd),
        row('sbx.kill()', samples.kill),
      ],
    ),
  );
  const perRun = (seconds: number) => ms((seconds * 1000) / Math.max(1, samples.cpu.runs));
  console.log(
    `\nCPU per commands.run (user + system over the ${formatInt(samples.cpu.runs)} measured ` +
      `round trips): Moat ${perRun(samples.cpu.moat)}, this process (SDK client) ` +
      `${perRun(samples.cpu.client)}; the started processes' own CPU is in neither.`,
  );

  const runP50 = p(samples.run, 0.5);
  console.log('\n## Starting a process: Moat vs starting it directly (same run)\n');
  console.log(
    markdownTable(
      ['what', 'samples', 'p50', 'p99', 'Moat commands.run p50 / this p50'],
      [
        [
          "Moat: commands.run('true') through the SDK",
          formatInt(samples.run.length),
          ms(runP50),
          ms(p(samples.run, 0.99)),
          formatRatio(1),
        ],
        ...peerList.map((peer) => {
          const values = samples.peers.get(peer.label) ?? [];
          return [
            `peer ${peer.label}`,
            formatInt(values.length),
            ms(p(values, 0.5)),
            ms(p(values, 0.99)),
            formatRatio(runP50 / p(values, 0.5)),
          ];
        }),
      ],
    ),
  );
  // Moat pays bwrap and the cgroup join once per sandbox and user (its launcher, at the first
  // command); every later command is a fork and exec inside. The fair floor is plain bash.
  const floor = samples.peers.get('bash');
  if (floor) {
    console.log(
      '\nMoat starts commands through a launcher already inside the sandbox (its namespaces and ' +
        'cgroup), so a command costs a fork and an exec there; the first command of a sandbox ' +
        'also starts the launcher. What the rest of a round trip adds (SDK client, HTTP, ' +
        `Moat's own work), commands.run p50 - bash p50: ${ms(runP50 - p(floor, 0.5))}.`,
    );
  }

  console.log('\n## Targets\n');
  const createToFirstP50 = p(samples.createToFirst, 0.5);
  const verdicts = [
    {
      pass: createToFirstP50 < TARGETS.createToFirstP50Ms,
      text: `create to first command p50 under ${TARGETS.createToFirstP50Ms} ms: ${ms(createToFirstP50)}`,
    },
    {
      pass: runP50 < TARGETS.runP50Ms,
      text: `commands.run round trip p50 under ${TARGETS.runP50Ms} ms: ${ms(runP50)}`,
    },
  ];
  for (const v of verdicts) console.log(`${v.pass ? 'PASS' : 'FAIL'}: ${v.text}`);
  const warnings = readFileSync(join(dir, 'moat.log'), 'utf8').split('\n').filter(Boolean);
  if (warnings.length > 0) {
    console.log(`\nMoat logged ${warnings.length} lines at warn or above; first: ${warnings[0]}`);
  }

  if (profileDir) {
    await stopChildren();
    const profiles = existsSync(profileDir)
      ? readdirSync(profileDir).filter((f) => f.endsWith('.cpuprofile'))
      : [];
    if (profiles.length === 0) console.log('\nNo CPU profile was written.');
    for (const file of profiles) {
      console.log(`\n## Moat CPU profile (${join(profileDir, file)})\n`);
      console.log(summariseProfile(join(profileDir, file)));
    }
  }
  if (strict && verdicts.some((v) => !v.pass)) process.exitCode = 1;
}

const SUMMARY = `Sandboxes and commands through the real e2b SDK against \`moat serve\` on loopback: over 100
sandboxes, create to first command, commands.run('true') round trips and kill, with CPU per
command. The peers start the same command the way Moat does: bash directly, and inside
bubblewrap and a freezer cgroup where this host allows. Needs root on Linux.`;

const OPTIONS = {
  keep: flag('keep the scratch folder'),
  strict: flag('exit 1 when a target fails'),
  profile: flag('run Moat under node --cpu-prof and summarise it'),
};

async function main(): Promise<void> {
  const values = readOptions('bench:sandbox', SUMMARY, OPTIONS);
  const timer = setTimeout(() => {
    writeSync(2, `bench:sandbox: still running after ${TIMEOUT_MS / 1000} s; stopping\n`);
    void stopChildren().finally(() => process.exit(1));
  }, TIMEOUT_MS);
  timer.unref();
  await runInScratchFolder('bench:sandbox', 'moat-bench-sandbox-', values.keep, (dir) =>
    run(dir, values.strict, values.profile),
  );
}

main().catch(async (error: unknown) => {
  console.error(`bench:sandbox: ${(error as Error).stack ?? String(error)}`);
  await stopChildren();
  process.exit(1);
});
