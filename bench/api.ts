/**
 * `npm run bench:api`: the platform API at scale. `moat serve` runs as a child process (the
 * built CLI, a scratch data folder, loopback ports, pino at warn) and is driven over HTTP:
 *
 * - 1,000 creates, each with a distinct 100-entry network config, sequential over one
 *   keep-alive connection;
 * - PUT /sandboxes/{id}/network on all 1,000 with another distinct 100-entry config,
 *   sequential over one keep-alive connection (each reply comes after the durable write);
 * - the same PUTs with 16 in flight over 16 connections (throughput), several trials;
 * - GET /v2/sandboxes through every page (limit 100), several times;
 * - Moat's resident memory (VmRSS from /proc/<pid>/status) once all sandboxes exist, and the
 *   size of its store folder.
 *
 * The peer, measured in the same run and on the same bodies: a minimal node:http server in a
 * child process (this script with the argument `peer`) that parses each PUT's JSON body,
 * appends it to a file and calls fdatasync before replying 204: the floor of a durable write
 * over HTTP in Node on this disk. Sequential PUTs alternate between Moat and the peer in chunks
 * of 100, and the concurrent trials alternate too, so that interference hits both alike.
 *
 * Targets (issue): PUT network p99 under 10 ms, resident memory under 500 MB.
 *
 * Configs are generated from a seeded PRNG, so every run sends the same bodies. Everything is
 * on loopback; no DNS query is made (the DNS upstream names a loopback port where nothing
 * listens). Counts are fixed, every request has a time limit, the whole run has one
 * (TIMEOUT_MS), and the children are stopped on exit, error, SIGINT and SIGTERM, and when this
 * process dies. Options: `--help`.
 */
import type { ChildProcess } from 'node:child_process';
import { writeSync } from 'node:fs';
import { open, readdir, readFile, stat } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import {
  cpuSeconds,
  forkReady,
  printHeading,
  runInScratchFolder,
  stopChildren,
} from './lib/procs.js';
import { startMoatServe } from './lib/moat-serve.js';
import { flag, readOptions } from './lib/options.js';
import { Prng } from './lib/prng.js';
import {
  formatBytes,
  formatInt,
  formatMs,
  formatRatio,
  formatSi,
  markdownTable,
} from './lib/table.js';
import { median, nowNs, percentile } from './lib/timing.js';

const HOST = '127.0.0.1';
const API_KEY = 'bench-api-key-0123456789abcdef';
const SANDBOXES = 1_000;
const ENTRIES = 100;
const PAGE_LIMIT = 100;
/** Sequential PUTs alternate between Moat and the peer in chunks of this many. */
const CHUNK = 100;
const CONCURRENCY = 16;
const CONCURRENT_TRIALS = 5;
const LIST_RUNS = 5;
/** Sandboxes created, updated and deleted before measuring (JIT, connections, disk). */
const WARMUP = 50;
const REQUEST_TIMEOUT_MS = 10_000;
const TIMEOUT_MS = 300_000;
const ALL_TRAFFIC = '0.0.0.0/0';
const SEED = 0xa91;
const TARGETS = { putP99Ms: 10, rssBytes: 500e6 };

// ---------------------------------------------------------------------------------------------
// Workload: a distinct 100-entry config per sandbox and round

interface NetworkBody {
  readonly allowOut: string[];
  readonly denyOut: string[];
}

const hex = (n: number) => n.toString(16);

/**
 * Round 0 is the create's config, round 1 the sequential PUT's, rounds 2.. the concurrent
 * trials'. 70 names (wildcards `*.s<i>-<j>.bench.test` and hosts `h<j>.s<i>.bench.test`), 12
 * IPv4 and 6 IPv6 CIDRs allowed; ALL_TRAFFIC plus 8 IPv4 and 3 IPv6 CIDRs denied.
 */
function networkFor(sandbox: number, round: number): NetworkBody {
  const rng = new Prng(SEED + sandbox * 64 + round);
  const base = round * ENTRIES;
  const allowOut: string[] = [];
  for (let j = base; j < base + 70; j++) {
    allowOut.push(j % 2 === 0 ? `*.s${sandbox}-${j}.bench.test` : `h${j}.s${sandbox}.bench.test`);
  }
  // The last octet or group is the index, so entries never repeat within a list.
  for (let j = 0; j < 12; j++) allowOut.push(`${rng.range(1, 223)}.${rng.int(256)}.${j}.0/24`);
  for (let j = 0; j < 6; j++) allowOut.push(`2001:db8:${hex(rng.int(65536))}:${hex(j)}::/64`);
  const denyOut = [ALL_TRAFFIC];
  for (let j = 0; j < 8; j++) denyOut.push(`${rng.range(1, 223)}.${j}.0.0/16`);
  for (let j = 0; j < 3; j++) denyOut.push(`2001:db8:${hex(rng.int(65536))}:${j}00::/56`);
  return { allowOut, denyOut };
}

// ---------------------------------------------------------------------------------------------
// HTTP client

interface Reply {
  readonly status: number;
  readonly text: string;
  readonly headers: http.IncomingHttpHeaders;
  /** From sending the request to the end of the reply. */
  readonly ms: number;
}

interface Target {
  readonly label: string;
  readonly port: number;
  /** One keep-alive connection: sequential requests. */
  readonly one: http.Agent;
  /** CONCURRENCY keep-alive connections. */
  readonly many: http.Agent;
}

function target(label: string, port: number): Target {
  return {
    label,
    port,
    one: new http.Agent({ keepAlive: true, maxSockets: 1 }),
    many: new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY }),
  };
}

function send(
  to: Target,
  agent: http.Agent,
  method: string,
  path: string,
  body?: object,
): Promise<Reply> {
  const payload = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const started = nowNs();
    const request = http.request(
      {
        host: HOST,
        port: to.port,
        method,
        path,
        agent,
        headers: {
          'x-api-key': API_KEY,
          ...(payload === undefined
            ? {}
            : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) }),
        },
      },
      (response) => {
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.on('error', reject);
        response.on('end', () =>
          resolve({
            status: response.statusCode ?? 0,
            text: Buffer.concat(chunks).toString('utf8'),
            headers: response.headers,
            ms: Number(nowNs() - started) / 1e6,
          }),
        );
      },
    );
    request.setTimeout(REQUEST_TIMEOUT_MS, () =>
      request.destroy(
        new Error(`${to.label} ${method} ${path}: no reply in ${REQUEST_TIMEOUT_MS} ms`),
      ),
    );
    request.on('error', reject);
    request.end(payload);
  });
}

/** Sends, and fails the run on any status but `expected`. */
async function expectStatus(
  to: Target,
  agent: http.Agent,
  expected: number,
  method: string,
  path: string,
  body?: object,
): Promise<Reply> {
  const reply = await send(to, agent, method, path, body);
  if (reply.status !== expected) {
    throw new Error(
      `${to.label} ${method} ${path}: ${reply.status} (expected ${expected}) ${reply.text.slice(0, 300)}`,
    );
  }
  return reply;
}

const putNetwork = (to: Target, agent: http.Agent, id: string, body: NetworkBody) =>
  expectStatus(to, agent, 204, 'PUT', `/sandboxes/${id}/network`, body).then((r) => r.ms);

/** Runs `count` requests with `CONCURRENCY` in flight; returns latencies and requests/s. */
async function concurrently(
  count: number,
  request: (i: number) => Promise<number>,
): Promise<{ latencies: number[]; perSecond: number }> {
  const latencies: number[] = [];
  let next = 0;
  const started = nowNs();
  const worker = async () => {
    while (next < count) latencies.push(await request(next++));
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  return { latencies, perSecond: count / (Number(nowNs() - started) / 1e9) };
}

// ---------------------------------------------------------------------------------------------
// The peer: node:http, JSON.parse, append, fdatasync, 204

async function runPeer(file: string, lifetimeSeconds: number): Promise<void> {
  const log = await open(file, 'a');
  // Bounded: it ends with its lifetime, with its parent, and on SIGTERM.
  setTimeout(() => process.exit(0), lifetimeSeconds * 1000);
  process.on('disconnect', () => process.exit(0));
  process.on('SIGTERM', () => process.exit(0));
  const server = http.createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      void (async () => {
        try {
          const network = JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown;
          await log.write(`${JSON.stringify({ path: request.url, network })}\n`);
          await log.datasync();
          response.writeHead(204).end();
        } catch (error) {
          response.writeHead(500).end((error as Error).message);
        }
      })();
    });
  });
  server.keepAliveTimeout = 60_000;
  server.listen(0, HOST, () => {
    process.send?.({ ready: (server.address() as AddressInfo).port });
  });
}

// ---------------------------------------------------------------------------------------------
// Moat as a child process

async function startMoat(
  dir: string,
  lifetimeSeconds: number,
): Promise<{ child: ChildProcess; pid: number; port: number }> {
  const moat = await startMoatServe({ dir, apiKey: API_KEY, lifetimeSeconds });
  return { child: moat.child, pid: moat.pid, port: moat.apiPort };
}

/** VmRSS and VmHWM (peak) of a process, in bytes. */
async function memory(pid: number): Promise<{ rss: number; peak: number }> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string) =>
    Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1]);
  return { rss: kb('VmRSS') * 1024, peak: kb('VmHWM') * 1024 };
}

async function folderBytes(dir: string): Promise<number> {
  let total = 0;
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const full = join(dir, entry.name);
    total += entry.isDirectory() ? await folderBytes(full) : (await stat(full)).size;
  }
  return total;
}

// ---------------------------------------------------------------------------------------------
// The run

const ms = (value: number) => `${formatMs(value)} ms`;

interface Latencies {
  readonly moat: number[];
  readonly peer: number[];
}

async function run(dir: string, strict: boolean): Promise<void> {
  const lifetime = TIMEOUT_MS / 1000 + 30;
  await printHeading('Platform API benchmark: Moat vs a minimal durable node:http server', dir);

  const started = await startMoat(dir, lifetime);
  const moat = target('Moat', started.port);
  const { child: peerChild, ready: peerPort } = await forkReady<number>(
    './api.js',
    ['peer', join(dir, 'peer-log.jsonl'), String(lifetime)],
    [],
    join(dir, 'peer.log'),
    10_000,
  );
  const peer = target('peer', peerPort);
  const pids = { moat: started.pid, peer: peerChild.pid };
  /** CPU seconds (user + system, all threads) each server spent in measured PUTs. */
  const cpu = { sequential: { moat: 0, peer: 0 }, concurrent: { moat: 0, peer: 0 } };
  const timedCpu = async (
    phase: keyof typeof cpu,
    key: 'moat' | 'peer',
    work: () => Promise<unknown>,
  ) => {
    const before = cpuSeconds(pids[key]);
    await work();
    cpu[phase][key] += cpuSeconds(pids[key]) - before;
  };

  const create = async (i: number, agent: http.Agent) => {
    const reply = await expectStatus(moat, agent, 201, 'POST', '/sandboxes', {
      templateID: 'base',
      timeout: 3600,
      network: networkFor(i, 0),
    });
    return { id: (JSON.parse(reply.text) as { sandboxID: string }).sandboxID, ms: reply.ms };
  };

  // Warm-up, not counted: sandboxes outside the measured range, then deleted.
  for (let i = 0; i < WARMUP; i++) {
    const { id } = await create(SANDBOXES + i, moat.one);
    await putNetwork(moat, moat.one, id, networkFor(SANDBOXES + i, 1));
    await putNetwork(peer, peer.one, id, networkFor(SANDBOXES + i, 1));
    await expectStatus(moat, moat.one, 204, 'DELETE', `/sandboxes/${id}`);
  }

  // Creates, sequential.
  const ids: string[] = [];
  const createMs: number[] = [];
  for (let i = 0; i < SANDBOXES; i++) {
    const { id, ms: took } = await create(i, moat.one);
    ids.push(id);
    createMs.push(took);
  }
  const afterCreates = await memory(started.pid);

  // PUT network, sequential, alternating chunks: Moat first in even chunks, the peer in odd.
  const sequential: Latencies = { moat: [], peer: [] };
  const putChunk = async (to: Target, from: number, into: number[]) => {
    for (let i = from; i < from + CHUNK; i++) {
      into.push(await putNetwork(to, to.one, ids[i]!, networkFor(i, 1)));
    }
  };
  for (let from = 0; from < SANDBOXES; from += CHUNK) {
    const pair = [
      () => timedCpu('sequential', 'moat', () => putChunk(moat, from, sequential.moat)),
      () => timedCpu('sequential', 'peer', () => putChunk(peer, from, sequential.peer)),
    ];
    if ((from / CHUNK) % 2 === 1) pair.reverse();
    for (const step of pair) await step();
  }
  const afterPuts = await memory(started.pid);
  const storeBytes = await folderBytes(join(dir, 'data', 'store'));

  // PUT network, CONCURRENCY in flight; trials alternate which server goes first.
  const rates = { moat: [] as number[], peer: [] as number[] };
  const concurrent: Latencies = { moat: [], peer: [] };
  for (let trial = 0; trial < CONCURRENT_TRIALS; trial++) {
    const round = 2 + trial;
    const bodies = ids.map((_, i) => networkFor(i, round));
    const measure = async (to: Target, key: 'moat' | 'peer') => {
      const result = await concurrently(SANDBOXES, (i) =>
        putNetwork(to, to.many, ids[i]!, bodies[i]!),
      );
      rates[key].push(result.perSecond);
      concurrent[key].push(...result.latencies);
    };
    const pair = [
      () => timedCpu('concurrent', 'moat', () => measure(moat, 'moat')),
      () => timedCpu('concurrent', 'peer', () => measure(peer, 'peer')),
    ];
    if (trial % 2 === 1) pair.reverse();
    for (const step of pair) await step();
  }

  // The list, every page.
  const listMs: number[] = [];
  let pages = 0;
  for (let runIndex = 0; runIndex < LIST_RUNS; runIndex++) {
    const seen = new Set<string>();
    let token: string | undefined;
    pages = 0;
    const t0 = nowNs();
    do {
      const query = token === undefined ? '' : `&nextToken=${encodeURIComponent(token)}`;
      const reply = await expectStatus(
        moat,
        moat.one,
        200,
        'GET',
        `/v2/sandboxes?limit=${PAGE_LIMIT}${query}`,
      );
      for (const s of JSON.parse(reply.text) as Array<{ sandboxID: string }>) seen.add(s.sandboxID);
      token = reply.headers['x-next-token'] as string | undefined;
      pages++;
    } while (token !== undefined && pages <= SANDBOXES / PAGE_LIMIT + 1);
    listMs.push(Number(nowNs() - t0) / 1e6);
    if (seen.size !== SANDBOXES || !ids.every((id) => seen.has(id))) {
      throw new Error(
        `the list returned ${seen.size} sandboxes in ${pages} pages, not the ${SANDBOXES} created`,
      );
    }
  }

  // Sanity: what Moat stores is the last config sent.
  const last = 2 + CONCURRENT_TRIALS - 1;
  for (const i of [0, SANDBOXES >> 1, SANDBOXES - 1]) {
    const reply = await expectStatus(moat, moat.one, 200, 'GET', `/sandboxes/${ids[i]}`);
    const { network } = JSON.parse(reply.text) as { network: NetworkBody };
    const sent = networkFor(i, last);
    if (
      JSON.stringify([network.allowOut, network.denyOut]) !==
      JSON.stringify([sent.allowOut, sent.denyOut])
    ) {
      throw new Error(`sandbox ${ids[i]} does not hold the last config sent to it`);
    }
  }
  const atEnd = await memory(started.pid);
  for (const t of [moat, peer]) for (const agent of [t.one, t.many]) agent.destroy();

  // ------------------------------------------------------------------------- report
  const bodyBytes = Buffer.byteLength(JSON.stringify(networkFor(0, 1)));
  console.log(
    [
      '',
      'Setup (all on loopback):',
      `- Moat: \`node dist/src/cli/main.js serve\` (pid ${started.pid}), a fresh data folder, ` +
        'pino at warn, every other setting at its default (the store fdatasyncs each batch ' +
        'of commits before replying).',
      '- peer: this script with `peer`, a node:http server that per PUT parses the JSON body, ' +
        'appends it to a file and calls fdatasync, then replies 204: the floor of a durable ' +
        'write over HTTP. It validates, compiles and publishes nothing.',
      `- Bodies: ${formatInt(ENTRIES)} entries per config (70 names, 18 CIDRs allowed; ` +
        `ALL_TRAFFIC + 11 CIDRs denied), about ${formatBytes(bodyBytes)}, distinct for every ` +
        'sandbox and round, from a seeded PRNG.',
      `- Sequential: one keep-alive connection, one request at a time; latency from sending to ` +
        `the end of the reply. PUTs alternate Moat/peer in chunks of ${CHUNK}.`,
      `- Concurrent: ${CONCURRENCY} keep-alive connections, ${CONCURRENCY} in flight, ` +
        `${formatInt(SANDBOXES)} PUTs per trial, ${CONCURRENT_TRIALS} trials alternating ` +
        'which server goes first; the median trial is reported.',
      `- Not counted: a warm-up of ${WARMUP} sandboxes created, updated and deleted.`,
    ].join('\n'),
  );

  const row = (label: string, moatValue: string, peerValue = 'n/a', ratio = '') => [
    label,
    moatValue,
    peerValue,
    ratio,
  ];
  const compare = (label: string, a: number, b: number, text: (v: number) => string) =>
    row(label, text(a), text(b), formatRatio(a / b));
  const p = (values: number[], q: number) => percentile(values, q);
  const latencyRow = (label: string, l: Latencies, q: number) =>
    compare(label, p(l.moat, q), p(l.peer, q), ms);
  const cpuRow = (label: string, seconds: { moat: number; peer: number }, requests: number) =>
    compare(label, (seconds.moat * 1000) / requests, (seconds.peer * 1000) / requests, ms);
  console.log(`\n## Results (${formatInt(SANDBOXES)} sandboxes)\n`);
  console.log(
    markdownTable(
      ['measure', 'Moat', 'peer (node:http + fdatasync)', 'Moat/peer'],
      [
        row('create p50 (sequential)', ms(p(createMs, 0.5))),
        row('create p99 (sequential)', ms(p(createMs, 0.99))),
        latencyRow('PUT network p50 (sequential)', sequential, 0.5),
        latencyRow('PUT network p99 (sequential)', sequential, 0.99),
        latencyRow('PUT network max (sequential)', sequential, 1),
        cpuRow('CPU per PUT (sequential)', cpu.sequential, SANDBOXES),
        compare(
          `PUT network, ${CONCURRENCY} in flight: req/s (median of ${CONCURRENT_TRIALS})`,
          median(rates.moat),
          median(rates.peer),
          formatSi,
        ),
        latencyRow(`PUT network, ${CONCURRENCY} in flight: p50`, concurrent, 0.5),
        latencyRow(`PUT network, ${CONCURRENCY} in flight: p99`, concurrent, 0.99),
        cpuRow(
          `CPU per PUT (${CONCURRENCY} in flight)`,
          cpu.concurrent,
          SANDBOXES * CONCURRENT_TRIALS,
        ),
        row(
          `list all (${pages} pages of ${PAGE_LIMIT}), median of ${LIST_RUNS}`,
          `${ms(median(listMs))} (${ms(median(listMs) / pages)}/page)`,
        ),
        row('resident memory, all sandboxes created', formatBytes(afterCreates.rss)),
        row('resident memory, after the sequential PUTs', formatBytes(afterPuts.rss)),
        row(
          'resident memory at the end / peak (VmHWM)',
          `${formatBytes(atEnd.rss)} / ${formatBytes(atEnd.peak)}`,
        ),
        row('store folder (data/store), after the sequential PUTs', formatBytes(storeBytes)),
      ],
    ),
  );
  console.log(
    '\nMoat/peer: for latencies lower is better, for req/s higher. The peer does only the ' +
      'durable append; the difference is what Moat adds (routing, auth, schema validation, ' +
      'policy parse and compile, the store, publishing to the enforcement table). CPU per ' +
      'PUT: user + system time of the server process (all threads, /proc/<pid>/stat) over ' +
      'the measured PUTs, which contention on the machine hardly moves.',
  );
  console.log(
    `Per-trial req/s, Moat: ${rates.moat.map(formatInt).join(' / ')}; peer: ` +
      `${rates.peer.map(formatInt).join(' / ')}.`,
  );

  console.log('\n## Targets\n');
  const rss = Math.max(afterCreates.rss, afterPuts.rss);
  const verdicts = [
    {
      pass: p(sequential.moat, 0.99) < TARGETS.putP99Ms,
      text: `PUT network p99 under ${TARGETS.putP99Ms} ms: ${ms(p(sequential.moat, 0.99))} (sequential, durable write included)`,
    },
    {
      pass: rss < TARGETS.rssBytes,
      text: `resident memory under ${formatBytes(TARGETS.rssBytes)} with ${formatInt(SANDBOXES)} sandboxes of ${ENTRIES}-entry policies: ${formatBytes(rss)}`,
    },
  ];
  for (const v of verdicts) console.log(`${v.pass ? 'PASS' : 'FAIL'}: ${v.text}`);
  const floor = p(sequential.peer, 0.99);
  if (floor >= TARGETS.putP99Ms) {
    console.log(
      `INFO: the peer's own sequential PUT p99 is ${ms(floor)}: on this machine a durable ` +
        'append over HTTP alone does not meet the latency target.',
    );
  }
  if (strict && verdicts.some((v) => !v.pass)) process.exitCode = 1;
}

const SUMMARY = `The platform API at scale: \`moat serve\` as a child process, driven over loopback HTTP with
1,000 creates, then PUT /sandboxes/{id}/network on each (one at a time, then 16 in flight), every
page of GET /v2/sandboxes, and Moat's resident memory. The peer is a minimal node:http server
that appends each PUT's body to a file and calls fdatasync: the floor of a durable write.`;

const OPTIONS = {
  keep: flag('keep the scratch folder'),
  strict: flag('exit 1 when a target fails'),
};

async function main(): Promise<void> {
  if (process.argv[2] === 'peer') {
    await runPeer(process.argv[3]!, Number(process.argv[4]));
    return;
  }
  const values = readOptions('bench:api', SUMMARY, OPTIONS);
  const timer = setTimeout(() => {
    writeSync(2, `bench:api: still running after ${TIMEOUT_MS / 1000} s; stopping\n`);
    void stopChildren().finally(() => process.exit(1));
  }, TIMEOUT_MS);
  timer.unref();
  await runInScratchFolder('bench:api', 'moat-bench-api-', values.keep, (dir) =>
    run(dir, values.strict),
  );
}

main().catch(async (error: unknown) => {
  console.error(`bench:api: ${(error as Error).stack ?? String(error)}`);
  await stopChildren();
  process.exit(1);
});
