/**
 * `npm run bench:cluster`: how fast a network change accepted by one node is enforced by the node
 * that hosts the sandbox. Three `moat serve` children share the Redis on 127.0.0.1:6379 (under
 * a key prefix of their own, removed afterwards): A and C are API replicas, B hosts the sandbox
 * (created through A). Sandboxes share the host network here, so this script speaks as the
 * sandbox from its loopback source address.
 *
 * Each change allows one of two names and denies the other. After its 204, B's DNS interceptor
 * is asked for the newly allowed name from the sandbox's address, back to back, until it stops
 * answering NXDOMAIN: "204 to enforced" is the time from the 204 to that answer. 200 changes go
 * through C (stored in Redis, announced on the cluster channel, applied by B); the peer is the
 * same change made through B itself (no propagation), interleaved with them and timed the same
 * way.
 *
 * Target (issue): 204 to enforcement on B p99 under 50 ms. The DNS upstream is the fake one of
 * bench:dns on loopback. Counts are fixed and every wait is bounded. Options: `--help`.
 */
import dgram from 'node:dgram';
import { randomUUID } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { startMoatServe, type MoatServe } from './lib/moat-serve.js';
import { flag, readOptions } from './lib/options.js';
import { forkReady, printHeading, runInScratchFolder } from './lib/procs.js';
import { formatMs, markdownTable, percentileRow } from './lib/table.js';
import { percentile } from './lib/timing.js';

const CHANGES = 200;
const WARMUP = 10;
const API_KEY = 'bench-cluster-api-key-0123456789';
const SOURCE_POOL = '127.80.0.0/24';
const TARGET_P99_MS = 50;
const ENFORCE_TIMEOUT_MS = 5000;
const LIFETIME_S = 600;
const NAMES = ['one.cluster.bench.test', 'two.cluster.bench.test'] as const;

function query(name: string, id: number): Buffer {
  const labels = name
    .split('.')
    .map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l)]));
  const header = Buffer.alloc(12);
  header.writeUInt16BE(id, 0);
  header.writeUInt16BE(0x0100, 2); // recursion desired
  header.writeUInt16BE(1, 4);
  return Buffer.concat([header, ...labels, Buffer.from([0, 0, 1, 0, 1])]);
}

/** Asks B's DNS from the sandbox's address; resolves with the rcode. */
class DnsProbe {
  private readonly socket = dgram.createSocket('udp4');
  private nextID = 1;
  private waiting = new Map<number, (rcode: number) => void>();

  static async open(source: string, port: number): Promise<DnsProbe> {
    const probe = new DnsProbe(port);
    await new Promise<void>((resolve) => probe.socket.bind(0, source, resolve));
    probe.socket.on('message', (reply) => {
      const done = probe.waiting.get(reply.readUInt16BE(0));
      probe.waiting.delete(reply.readUInt16BE(0));
      done?.(reply[3]! & 0x0f);
    });
    return probe;
  }

  private constructor(private readonly port: number) {}

  ask(name: string): Promise<number> {
    const id = (this.nextID = (this.nextID % 65535) + 1);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        reject(new Error(`no DNS answer for ${name}`));
      }, 1000);
      this.waiting.set(id, (rcode) => {
        clearTimeout(timer);
        resolve(rcode);
      });
      this.socket.send(query(name, id), this.port, '127.0.0.1');
    });
  }

  /** Milliseconds from `since` until `name` is answered other than NXDOMAIN. */
  async allowedAfter(name: string, since: number): Promise<number> {
    while ((await this.ask(name)) === 3) {
      if (performance.now() - since > ENFORCE_TIMEOUT_MS)
        throw new Error(`${name} was still denied ${ENFORCE_TIMEOUT_MS} ms after the change`);
    }
    return performance.now() - since;
  }

  close(): void {
    this.socket.close();
  }
}

async function call(node: MoatServe, method: string, path: string, body?: unknown) {
  const response = await fetch(`http://127.0.0.1:${node.apiPort}${path}`, {
    method,
    headers: { 'X-API-Key': API_KEY, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(10_000),
  });
  const text = await response.text();
  return { status: response.status, text };
}

async function redisAnswers(): Promise<string | undefined> {
  const client = new Redis(6379, '127.0.0.1', {
    lazyConnect: true,
    connectTimeout: 1000,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
  });
  try {
    await client.connect();
    await client.ping();
    return undefined;
  } catch (error) {
    return (error as Error).message;
  } finally {
    client.disconnect();
  }
}

async function run(dir: string, strict: boolean): Promise<void> {
  await printHeading(
    'Cluster benchmark: a network change through one node, enforced by another',
    dir,
  );
  const prefix = `moat-bench:${randomUUID()}:`;
  const admin = new Redis(6379, '127.0.0.1');
  const { ready: upstreamPort } = await forkReady<number>(
    './dns-upstream.js',
    ['0', String(LIFETIME_S)],
    [],
    join(dir, 'upstream.log'),
    10_000,
  );
  const node = async (id: string, extra: string[]) => {
    await mkdir(join(dir, id), { recursive: true });
    return startMoatServe({
      dir: join(dir, id),
      apiKey: API_KEY,
      lifetimeSeconds: LIFETIME_S,
      dnsUpstream: `127.0.0.1:${upstreamPort}`,
      extraArgs: [
        ...['--store', 'redis://127.0.0.1:6379', '--store-prefix', prefix, '--node-id', id],
        ...extra,
      ],
    });
  };
  let probe: DnsProbe | undefined;
  try {
    const b = await node('node-b', ['--source-pool', SOURCE_POOL]);
    const a = await node('node-a', ['--hosts-sandboxes', 'false']);
    const c = await node('node-c', ['--hosts-sandboxes', 'false']);
    const created = await call(a, 'POST', '/sandboxes', {
      templateID: 'base',
      timeout: 3600,
      network: { allowOut: [NAMES[0]], denyOut: ['0.0.0.0/0'] },
    });
    if (created.status !== 201) throw new Error(`create: ${created.status} ${created.text}`);
    const { sandboxID } = JSON.parse(created.text) as { sandboxID: string };
    const detail = JSON.parse((await call(a, 'GET', `/sandboxes/${sandboxID}`)).text) as {
      egress: { address: string; node: string };
    };
    if (detail.egress.node !== 'node-b')
      throw new Error(`placed on ${detail.egress.node}, not node-b`);
    const dnsPort = Number(/:(\d+)/.exec(b.line('DNS interceptor') ?? '')?.[1]);
    probe = await DnsProbe.open(detail.egress.address, dnsPort);

    const delays = { cluster: [] as number[], owner: [] as number[] };
    const putMs = { cluster: [] as number[], owner: [] as number[] };
    let allowed = 0;
    for (let i = 0; i < WARMUP + CHANGES; i++) {
      for (const [via, key] of [
        [c, 'cluster'],
        [b, 'owner'],
      ] as const) {
        allowed = 1 - allowed;
        const sent = performance.now();
        const put = await call(via, 'PUT', `/sandboxes/${sandboxID}/network`, {
          allowOut: [NAMES[allowed]],
          denyOut: ['0.0.0.0/0'],
        });
        const acknowledged = performance.now();
        if (put.status !== 204) throw new Error(`PUT network: ${put.status} ${put.text}`);
        const delay = await probe.allowedAfter(NAMES[allowed]!, acknowledged);
        if (i >= WARMUP) {
          delays[key].push(delay);
          putMs[key].push(acknowledged - sent);
        }
      }
    }
    console.log(`${CHANGES} changes through C and ${CHANGES} through B done\n`);
    console.log(
      markdownTable(
        ['measure', 'through C (replica)', 'peer: through B (owner)', 'ratio'],
        [
          percentileRow('204 to enforced on B, p50', delays.cluster, delays.owner, 0.5),
          percentileRow('204 to enforced on B, p99', delays.cluster, delays.owner, 0.99),
          percentileRow('PUT round trip, p50', putMs.cluster, putMs.owner, 0.5),
          percentileRow('PUT round trip, p99', putMs.cluster, putMs.owner, 0.99),
        ],
      ),
    );
    const p99 = percentile(delays.cluster, 0.99);
    const ok = p99 < TARGET_P99_MS;
    console.log(
      `\n${ok ? 'PASS' : 'FAIL'} 204 to enforcement on the hosting node p99 under ${TARGET_P99_MS} ms: ${formatMs(p99)} ms`,
    );
    await call(a, 'DELETE', `/sandboxes/${sandboxID}`);
    if (strict && !ok) process.exitCode = 1;
  } finally {
    probe?.close();
    const keys = await admin.keys(`${prefix}*`);
    if (keys.length > 0) await admin.del(...keys);
    admin.disconnect();
  }
}

const SUMMARY = `How fast a network change accepted by one node is enforced by the node that hosts the
sandbox: three \`moat serve\` children share the Redis on 127.0.0.1:6379; 200 changes go through
another node, and "204 to enforced" is the time until the hosting node's DNS interceptor answers
by the new policy. The peer is the same change made on the hosting node itself.`;

const OPTIONS = {
  keep: flag('keep the scratch folder'),
  strict: flag('exit 1 when a target fails'),
};

const values = readOptions('bench:cluster', SUMMARY, OPTIONS);
const problem = await redisAnswers();
if (problem !== undefined) {
  console.log(`bench:cluster needs the Redis on 127.0.0.1:6379: ${problem}`);
} else {
  await runInScratchFolder('bench:cluster', 'moat-bench-cluster-', values.keep, (dir) =>
    run(dir, values.strict),
  );
}
