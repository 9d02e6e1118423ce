/**
 * Three `moat serve` nodes sharing the Redis on 127.0.0.1:6379 (under a key prefix of their
 * own): A and C are API replicas, B hosts sandboxes. B reaches Redis through a relay the test
 * can cut, so B alone can lose the store while A and C keep it. Sandboxes share the host
 * network here: the test speaks as one from its loopback source address, to B's DNS and proxy.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import http from 'node:http';
import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Sandbox } from 'e2b';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { API_KEY, ApiClient } from '../support/api-client.js';
import { udpQuery } from '../support/dns-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { connectThrough, httpEchoOrigin, type Origin } from '../support/origins.js';
import { REDIS_PORT, RedisRelay, redisProblem } from '../support/redis.js';
import { ServeChild, type Started } from '../support/serve-child.js';
import { removeMoatFolder } from '../../bench/lib/scratch.js';

const problem = await redisProblem();
if (problem !== undefined)
  console.warn(`cluster tests skipped: no Redis on 127.0.0.1:${REDIS_PORT} (${problem})`);

/**
 * Long enough that a node killed and started again comes back before the others count it gone
 * and remove its sandboxes: a restart took over 6 s on a machine at load 7 (its last heartbeat
 * may also be seconds old, from the test that cut it off Redis).
 */
const TTL_MS = 10_000;
const SOURCE_POOL = '127.79.0.0/24';
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Polls `check` every 10 ms until it holds; resolves with the milliseconds it took. */
async function within(ms: number, what: string, check: () => Promise<boolean>): Promise<number> {
  const started = performance.now();
  while (!(await check())) {
    if (performance.now() - started > ms) throw new Error(`${what}: not within ${ms} ms`);
    await sleep(10);
  }
  return performance.now() - started;
}

describe.skipIf(problem !== undefined)('many nodes sharing one Redis', () => {
  const prefix = `moat-test:${randomUUID()}:`;
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-cluster-'));
  // Nodes sharing a store share the key their secrets are sealed with.
  const secretsKeyFile = path.join(scratch, 'secrets-key');
  writeFileSync(secretsKeyFile, randomBytes(32).toString('hex'), { mode: 0o600 });
  const zone = new FakeDns(
    new Map([
      ['first.cluster.test', { A: ['127.0.0.1'] }],
      ['second.cluster.test', { A: ['127.0.0.1'] }],
    ]),
  );
  let origin: Origin;
  let relay: RedisRelay;
  let admin: Redis;
  const nodes: Record<'a' | 'b' | 'c', { child: ServeChild; at: Started; api: ApiClient }> =
    {} as never;

  const args = (id: string, store: string, extra: string[]) => [
    ...['--data-dir', path.join(scratch, id), '--node-id', id, '--store', store],
    ...['--store-prefix', prefix, '--node-ttl-ms', String(TTL_MS), '--api-keys', API_KEY],
    ...['--api-listen', '127.0.0.1:0', '--sandbox-listen', '127.0.0.1:0'],
    ...['--dns-listen', '127.0.0.1:0', '--proxy-listen', '127.0.0.1:0'],
    ...['--transparent-listen', 'off', '--dns-upstream', `127.0.0.1:${zone.port}`],
    // The origin is this host's: its port is opened as an operator would.
    ...['--enforcement', 'proxy', '--internal-deny', 'none'],
    ...['--allow-host-ports', String(origin.port), '--secrets-key-file', secretsKeyFile],
    ...extra,
  ];
  const start = async (id: 'a' | 'b' | 'c') => {
    const direct = `redis://127.0.0.1:${REDIS_PORT}`;
    const child = new ServeChild(
      id === 'b'
        ? args('node-b', relay.url, ['--source-pool', SOURCE_POOL])
        : args(`node-${id}`, direct, ['--hosts-sandboxes', 'false']),
    );
    const at = await child.started();
    // Start-up names the store (password-free here) and the node.
    expect(child.stderr).toMatch(
      new RegExp(`^moat: store +redis://127\\.0\\.0\\.1:\\d+ \\(node node-${id}\\)$`, 'm'),
    );
    nodes[id] = { child, at, api: new ApiClient(`http://${at.api}`) };
  };

  beforeAll(async () => {
    await zone.start();
    origin = await httpEchoOrigin('127.0.0.1');
    relay = await RedisRelay.start();
    admin = new Redis(REDIS_PORT, '127.0.0.1');
    for (const id of ['b', 'a', 'c'] as const) await start(id);
  }, 60_000);

  afterAll(async () => {
    await ServeChild.killAll();
    await RedisRelay.closeAll();
    const keys = await admin.keys(`${prefix}*`);
    if (keys.length > 0) await admin.del(...keys);
    admin.disconnect();
    await origin?.close();
    await zone.stop();
    removeMoatFolder(scratch);
  });

  /** What B's DNS answers a sandbox for `name`: its rcode. */
  const dnsAtB = async (source: string, name: string) =>
    (await udpQuery(Number(nodes.b.at.dns.split(':')[1]), source, name)).rcode;
  /** What B's proxy answers a sandbox asking for `name` (CONNECT status). */
  const proxyAtB = async (source: string, name: string) => {
    const [host, port] = nodes.b.at.proxy.split(':') as [string, string];
    const tunnel = await connectThrough({ host, port: Number(port) }, `${name}:${origin.port}`, {
      localAddress: source,
    });
    tunnel.socket.destroy();
    return tunnel.status;
  };
  const allowOnly = (name: string) => ({ allowOut: [name], denyOut: ['0.0.0.0/0'] });

  let sandboxID: string;
  let source: string;

  it('places a sandbox created through an API replica on the node that hosts sandboxes', async () => {
    const created = await nodes.a.api.call('POST', '/sandboxes', {
      body: { templateID: 'base', timeout: 600, network: allowOnly('first.cluster.test') },
    });
    expect(created.status, created.text).toBe(201);
    sandboxID = (created.body as { sandboxID: string }).sandboxID;
    for (const node of [nodes.a, nodes.b, nodes.c]) {
      const detail = await node.api.call('GET', `/sandboxes/${sandboxID}`);
      expect(detail.status).toBe(200);
      const egress = (detail.body as { egress: { node: string; address: string; dns: string } })
        .egress;
      expect(egress).toMatchObject({ node: 'node-b', dns: nodes.b.at.dns });
      source = egress.address;
    }
    expect(source).toMatch(/^127\.79\.0\.\d+$/);
    expect(await dnsAtB(source, 'first.cluster.test')).toBe('NOERROR');
    expect(await dnsAtB(source, 'second.cluster.test')).toBe('NXDOMAIN');
  });

  it('answers GET /flows with its own records, and with nodes=all every live node’s, merged', async () => {
    const query = `sandboxID=${sandboxID}&kind=dns&limit=1000`;
    // A replica decided nothing for the sandbox; B decided both lookups above.
    expect((await nodes.a.api.call('GET', `/flows?${query}`)).body).toEqual([]);
    const own = (await nodes.b.api.call('GET', `/flows?${query}`)).body as Array<{
      node: string;
      destination: { name: string };
    }>;
    const merged = await nodes.a.api.call('GET', `/flows?${query}&nodes=all`);
    expect(merged.status).toBe(200);
    expect(merged.headers.get('x-moat-unreached-nodes')).toBeNull();
    expect(merged.body).toEqual(own);
    expect(own.map((r) => [r.node, r.destination.name]).sort()).toEqual([
      ['node-b', 'first.cluster.test'],
      ['node-b', 'second.cluster.test'],
    ]);
    const followed = await nodes.a.api.call('GET', `/flows?nodes=all&follow=true`);
    expect(followed.status).toBe(400);
    expect((followed.body as { message: string }).message).toContain('query.nodes');
  });

  it('serves the sandbox API of a sandbox on B through a replica (the E2B SDK, pointed at A)', async () => {
    const sandbox = await Sandbox.connect(sandboxID, {
      apiUrl: `http://${nodes.a.at.api}`,
      sandboxUrl: `http://${nodes.a.at.sandbox}`,
      apiKey: API_KEY,
    });
    const run = await sandbox.commands.run('echo "$E2B_SANDBOX_ID"', { timeoutMs: 10_000 });
    expect(run.stdout).toBe(`${sandboxID}\n`);
  });

  it('enforces on B, within milliseconds, a network change accepted by C', async () => {
    const put = await nodes.c.api.call('PUT', `/sandboxes/${sandboxID}/network`, {
      body: allowOnly('second.cluster.test'),
    });
    expect(put.status, put.text).toBe(204);
    const ms = await within(1000, 'B enforcing the change made through C', async () => {
      return (await dnsAtB(source, 'second.cluster.test')) === 'NOERROR';
    });
    expect(ms).toBeLessThan(1000);
    expect(await dnsAtB(source, 'first.cluster.test')).toBe('NXDOMAIN');
    expect(await proxyAtB(source, 'second.cluster.test')).toBe(200);
    expect(await proxyAtB(source, 'first.cluster.test')).toBe(403);
  });

  it('guards on B, within milliseconds, a secret created through A', async () => {
    const [host, port] = nodes.b.at.proxy.split(':') as [string, string];
    const value = `sk-cluster-${randomUUID()}`;
    /** An absolute-form GET through B's proxy whose query carries the value: its status. */
    const carryThroughB = () =>
      new Promise<number>((resolve, reject) => {
        const request = http.request(
          {
            host,
            port: Number(port),
            agent: false,
            localAddress: source,
            path: `http://second.cluster.test:${origin.port}/?token=${value}`,
            headers: { host: `second.cluster.test:${origin.port}` },
          },
          (response) => {
            response.resume();
            resolve(response.statusCode ?? 0);
          },
        );
        request.on('error', reject);
        request.end();
      });
    // B has read the (empty) secrets once: what it keeps must not outlive A's change.
    expect(await carryThroughB()).toBe(200);
    const created = await nodes.a.api.call('POST', '/secrets', {
      body: { name: 'cluster-token', value },
    });
    expect(created.status, created.text).toBe(201);
    const ms = await within(1000, 'B refusing the new secret', async () => {
      return (await carryThroughB()) === 403;
    });
    expect(ms).toBeLessThan(1000);
    const deleted = await nodes.c.api.call('DELETE', '/secrets/cluster-token');
    expect(deleted.status, deleted.text).toBe(204);
    await within(1000, 'B forgetting the deleted secret', async () => {
      return (await carryThroughB()) === 200;
    });
  });

  it('kill, pause and other owner-only requests through a replica are carried out by B', async () => {
    const timeout = await nodes.c.api.call('POST', `/sandboxes/${sandboxID}/timeout`, {
      body: { timeout: 900 },
    });
    expect(timeout.status, timeout.text).toBe(204);
    const detail = await nodes.a.api.call('GET', `/sandboxes/${sandboxID}`);
    const endAt = Date.parse((detail.body as { endAt: string }).endAt);
    expect(endAt - Date.now()).toBeGreaterThan(800_000);
  });

  it('keeps enforcing the last policy while B cannot reach Redis, refuses changes there, and converges after', async () => {
    relay.cut();
    // B's own changes need the store: 503.
    const refused = await nodes.b.api.call('PUT', `/sandboxes/${sandboxID}/network`, {
      body: allowOnly('first.cluster.test'),
    });
    expect(refused.status, refused.text).toBe(503);
    // Its sandbox API cannot read the sandbox's record: a 503, not "not running".
    const envd = await fetch(`http://${nodes.b.at.sandbox}/health`, {
      headers: { 'e2b-sandbox-id': sandboxID, 'e2b-sandbox-port': '49983' },
    });
    expect(envd.status, await envd.text()).toBe(503);
    // A change accepted elsewhere meanwhile: stored, but B cannot hear of it yet.
    const put = await nodes.c.api.call('PUT', `/sandboxes/${sandboxID}/network`, {
      body: allowOnly('first.cluster.test'),
    });
    expect(put.status, put.text).toBe(204);
    await sleep(300);
    // Never open: B still enforces what it had.
    expect(await dnsAtB(source, 'second.cluster.test')).toBe('NOERROR');
    expect(await dnsAtB(source, 'first.cluster.test')).toBe('NXDOMAIN');
    relay.restore();
    await within(5000, 'B converging on the stored policy after Redis returned', async () => {
      return (await dnsAtB(source, 'first.cluster.test')) === 'NOERROR';
    });
    expect(await dnsAtB(source, 'second.cluster.test')).toBe('NXDOMAIN');
  });

  it('a restarted node reloads and enforces its sandboxes before it answers', async () => {
    await nodes.b.child.kill();
    await start('b');
    // The first answers after start-up already carry the stored policy.
    expect(await dnsAtB(source, 'first.cluster.test')).toBe('NOERROR');
    expect(await dnsAtB(source, 'second.cluster.test')).toBe('NXDOMAIN');
    expect((await nodes.a.api.call('GET', `/sandboxes/${sandboxID}`)).status).toBe(200);
  });

  it(
    'reports the sandboxes of a node whose heartbeat lapsed as gone, and removes them',
    async () => {
      await nodes.b.child.kill();
      const ms = await within(TTL_MS * 3, 'A reporting the sandbox gone', async () => {
        return (await nodes.a.api.call('GET', `/sandboxes/${sandboxID}`)).status === 404;
      });
      expect(ms).toBeLessThan(TTL_MS * 2);
      expect((await nodes.c.api.call('GET', `/sandboxes/${sandboxID}`)).status).toBe(404);
      await within(TTL_MS, 'the record removed from Redis', async () => {
        return (await admin.hget(`${prefix}sandboxes`, sandboxID)) === null;
      });
      // With no node hosting sandboxes, a create has nowhere to go.
      const create = await nodes.a.api.call('POST', '/sandboxes', { body: { templateID: 'base' } });
      expect(create.status, create.text).toBe(503);
    },
    TTL_MS * 5,
  );
});
