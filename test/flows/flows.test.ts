import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { scratchMoatFlags } from '../../bench/lib/scratch.js';
import { type RunningMoat, startMoat } from '../../src/app/index.js';
import { loadConfig } from '../../src/config.js';
import {
  CLOSE_FIELDS,
  DESTINATION_FIELDS,
  FLOW_FIELDS,
  INJECTION_FIELDS,
  REPORT_FIELDS,
  REQUEST_FIELDS,
  type FlowRecord,
  FlowRecorder,
  FlowStore,
  flowView,
} from '../../src/flows/index.js';
import { MoatMetrics } from '../../src/metrics/index.js';
import { IngressProxy } from '../../src/proxy/index.js';
import { compilePolicy, parseIP, parseNetworkConfig } from '../../src/policy/index.js';
import { API_KEY, ApiClient, expectNoContent } from '../support/api-client.js';
import { udpQuery } from '../support/dns-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { connectThrough, httpEchoOrigin, type Origin } from '../support/origins.js';
import { LOOPBACK_IS_OUTSIDE } from '../../bench/lib/loopback-outside.js';

const SANDBOX = 'iflowsandbox000000001';
const SECRET = 'egress-secret-flows';
const SOURCE = '127.78.0.2';
const MIB = 1 << 20;

type View = Record<string, unknown> & {
  event: string;
  kind: string;
  verdict: string;
  destination: Record<string, unknown>;
  bytesUp?: number;
  bytesDown?: number;
};

/** A TCP origin that answers its first bytes with exactly `size` bytes, then ends. */
async function bulkOrigin(host: string, size: number): Promise<Origin> {
  const server = net.createServer((socket) => {
    socket.on('error', () => socket.destroy());
    socket.once('data', () => socket.end(Buffer.alloc(size, 0x61)));
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  return {
    host,
    port: (server.address() as net.AddressInfo).port,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

describe('flow records', () => {
  let upstream: FakeDns;
  let web: Origin;
  let bulk: Origin;
  let moat: RunningMoat;
  let api: ApiClient;
  const scratch = scratchMoatFlags();
  const logDir = mkdtempSync(path.join(os.tmpdir(), 'moat-flows-'));
  const flowLog = path.join(logDir, 'flows.jsonl');
  const auth = `${SANDBOX}:${SECRET}`;

  beforeAll(async () => {
    web = await httpEchoOrigin('127.0.0.10');
    bulk = await bulkOrigin('127.0.0.12', MIB);
    upstream = await new FakeDns(
      new Map([
        ['allowed.test', { A: ['127.0.0.10'] }],
        ['bulk.allowed.test', { A: ['127.0.0.12'] }],
        ['denied.test', { A: ['127.0.0.10'] }],
      ]),
    ).start();
    const config = loadConfig({
      flags: {
        ...scratch.flags,
        'api-keys': API_KEY,
        'dns-listen': '127.0.0.1:0',
        'dns-upstream': `127.0.0.1:${upstream.port}`,
        'proxy-listen': '127.0.0.1:0',
        'transparent-listen': '127.0.0.1:0',
        'log-level': 'silent',
        'flow-store-size': '1000',
        'flow-log': flowLog,
        'internal-deny': '10.0.0.0/8,169.254.0.0/16',
      },
    });
    if (!config.ok) throw new Error(config.error);
    moat = await startMoat(config.value, pino({ level: 'silent' }), {
      defaultMetrics: false,
      // The origins are on this host's loopback: the host is not what these tests are about.
      hostAddresses: LOOPBACK_IS_OUTSIDE,
      transparentPorts: { tls: 1, http: web.port },
    });
    api = new ApiClient(`http://127.0.0.1:${moat.listening.api.port}`);
  });

  afterAll(async () => {
    await moat.stop();
    scratch.remove();
    rmSync(logDir, { recursive: true, force: true });
    await Promise.all([web.close(), bulk.close(), upstream.stop()]);
  });

  beforeEach(() => {
    const parsed = parseNetworkConfig({
      allowOut: ['allowed.test', '*.allowed.test'],
      denyOut: ['0.0.0.0/0'],
    });
    const source = parseIP(SOURCE);
    if (!parsed.ok || !source.ok) throw new Error('test policy');
    moat.table.remove(SANDBOX);
    moat.table.register(
      SANDBOX,
      { sourceAddress: source.value, egressSecret: SECRET },
      compilePolicy(parsed.value, moat.internal),
    );
  });

  /** The records added by `act`, oldest first. */
  async function recorded(act: () => Promise<void>, settle: (r: FlowRecord[]) => boolean) {
    const added: FlowRecord[] = [];
    const stop = moat.flows.store.follow(
      (record) => added.push(record) > 0,
      () => {},
    );
    try {
      await act();
      const deadline = Date.now() + 3000;
      while (!settle(added) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
      // Anything extra would come now.
      await new Promise((r) => setTimeout(r, 50));
    } finally {
      stop();
    }
    return added;
  }

  /** Every record carries exactly the fixed fields (close fields only on close records). */
  function expectShape(record: FlowRecord): void {
    const fields = FLOW_FIELDS.filter(
      (f) =>
        (record.event === 'close' || !(CLOSE_FIELDS as readonly string[]).includes(f)) &&
        (record.ruleKey !== undefined || !(INJECTION_FIELDS as readonly string[]).includes(f)) &&
        (record.request !== undefined || !(REQUEST_FIELDS as readonly string[]).includes(f)) &&
        (record.wouldDeny !== undefined || !(REPORT_FIELDS as readonly string[]).includes(f)),
    );
    expect(Object.keys(flowView(record))).toEqual(fields);
    expect(Object.keys(record.destination).sort()).toEqual([...DESTINATION_FIELDS].sort());
    expect(record.sandboxID).toBe(SANDBOX);
    expect(record.node).not.toBe('');
  }

  it('records a CONNECT that moves 1 MiB down once when decided and once at close', async () => {
    const records = await recorded(
      async () => {
        const { socket, status } = await connectThrough(
          moat.listening.proxy,
          `bulk.allowed.test:${bulk.port}`,
          { auth },
        );
        expect(status).toBe(200);
        let received = 0;
        await new Promise<void>((resolve) => {
          socket.on('data', (chunk: Buffer) => (received += chunk.length));
          socket.on('end', () => resolve());
          socket.resume();
          socket.write(Buffer.from([0, 1, 2, 3]));
        });
        socket.end();
        expect(received).toBe(MIB);
      },
      (r) => r.some((x) => x.event === 'close'),
    );
    expect(records.map((r) => [r.kind, r.event, r.verdict])).toEqual([
      ['connect', 'decision', 'allow'],
      ['connect', 'close', 'allow'],
    ]);
    const [decision, close] = records as [FlowRecord, FlowRecord];
    for (const record of records) expectShape(record);
    expect(decision.destination).toEqual({
      name: 'bulk.allowed.test',
      address: '127.0.0.12',
      port: bulk.port,
      protocol: 'tcp',
    });
    expect(decision.list).toBe('allowOut');
    expect(decision.rule).toBe('*.allowed.test');
    expect(close.id).toBe(decision.id);
    expect(close.bytesUp).toBe(4);
    // The CONNECT answer's head is counted down too.
    expect(close.bytesDown).toBeGreaterThanOrEqual(MIB);
    expect(close.bytesDown).toBeLessThan(MIB + 100);
    expect(close.end).toBe('closed');
    expect(close.durationMs).toBeGreaterThanOrEqual(0);
  });

  it('records a denied CONNECT once, with the deciding list, and no close', async () => {
    const records = await recorded(
      async () => {
        const { status, socket } = await connectThrough(moat.listening.proxy, 'denied.test:443', {
          auth,
        });
        expect(status).toBe(403);
        socket.destroy();
      },
      (r) => r.length > 0,
    );
    expect(records).toHaveLength(1);
    const [denied] = records as [FlowRecord];
    expectShape(denied);
    expect(denied).toMatchObject({
      event: 'decision',
      kind: 'connect',
      verdict: 'deny',
      list: 'denyOut',
      rule: '0.0.0.0/0',
      destination: { name: 'denied.test', address: null, port: 443, protocol: 'tcp' },
    });
    const metrics = await moat.metrics.registry.getSingleMetricAsString('moat_proxy_denials_total');
    expect(metrics).toMatch(/moat_proxy_denials_total\{kind="connect",list="denyOut"\} [1-9]/);
  });

  it('records an absolute-form request with the bytes sent and read', async () => {
    const records = await recorded(
      () =>
        new Promise<void>((resolve, reject) => {
          const req = http.request({
            ...moat.listening.proxy,
            path: `http://allowed.test:${web.port}/x`,
            headers: { 'proxy-authorization': `Basic ${Buffer.from(auth).toString('base64')}` },
            agent: false,
          });
          req.on('response', (res) => {
            expect(res.statusCode).toBe(200);
            res.resume();
            res.on('end', resolve);
          });
          req.on('error', reject);
          req.end();
        }),
      (r) => r.some((x) => x.event === 'close'),
    );
    expect(records.map((r) => [r.kind, r.event, r.verdict])).toEqual([
      ['http', 'decision', 'allow'],
      ['http', 'close', 'allow'],
    ]);
    for (const record of records) expectShape(record);
    const close = records[1]!;
    expect(close.destination).toMatchObject({ name: 'allowed.test', address: '127.0.0.10' });
    expect(close.bytesUp).toBeGreaterThan(20);
    expect(close.bytesDown).toBeGreaterThan(20);
  });

  it('records a transparent connection by the Host it named, and its close', async () => {
    const records = await recorded(
      async () => {
        const socket = net.connect({
          host: '127.0.0.1',
          port: moat.listening.transparent!.port,
          localAddress: SOURCE,
        });
        socket.on('error', () => {});
        socket.write('GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n');
        await new Promise((resolve) => socket.on('close', resolve).resume());
      },
      (r) => r.some((x) => x.event === 'close'),
    );
    expect(records.map((r) => [r.kind, r.event, r.verdict])).toEqual([
      ['transparent', 'decision', 'allow'],
      ['transparent', 'close', 'allow'],
    ]);
    for (const record of records) expectShape(record);
    expect(records[0]!.destination).toEqual({
      name: 'allowed.test',
      address: '127.0.0.10',
      port: web.port,
      protocol: 'http',
    });
    expect(records[1]!.bytesDown).toBeGreaterThan(20);
  });

  it('records each DNS query once: allowed and denied names', async () => {
    const records = await recorded(
      async () => {
        expect((await udpQuery(moat.listening.dns.port, SOURCE, 'allowed.test')).rcode).toBe(
          'NOERROR',
        );
        expect((await udpQuery(moat.listening.dns.port, SOURCE, 'denied.test')).rcode).toBe(
          'NXDOMAIN',
        );
      },
      (r) => r.length >= 2,
    );
    expect(records.map((r) => [r.kind, r.event, r.verdict, r.destination.name])).toEqual([
      ['dns', 'decision', 'allow', 'allowed.test'],
      ['dns', 'decision', 'deny', 'denied.test'],
    ]);
    for (const record of records) expectShape(record);
    expect(records[0]!.destination).toEqual({
      name: 'allowed.test',
      address: null,
      port: null,
      protocol: 'udp',
    });
  });

  it('records ingress requests: the traffic token decides, the close has the bytes', async () => {
    const flows = new FlowRecorder({
      store: new FlowStore(100),
      metrics: new MoatMetrics({ defaultMetrics: false }),
      logger: pino({ level: 'silent' }),
      node: 'test',
    });
    const ingress = new IngressProxy({
      logger: pino({ level: 'silent' }),
      flows,
      connectTimeoutMs: 2000,
      idleTimeoutMs: 5000,
    });
    const target = {
      sandboxID: SANDBOX,
      host: web.host,
      port: web.port,
      trafficToken: 'token-0123456789',
      maskRequestHost: null,
    };
    const front = http.createServer((req, res) => void ingress.request(req, res, target));
    await new Promise<void>((resolve) => front.listen(0, '127.0.0.1', resolve));
    const port = (front.address() as net.AddressInfo).port;
    const get = (token: string) =>
      new Promise<number>((resolve, reject) => {
        const req = http.get({
          host: '127.0.0.1',
          port,
          path: '/in',
          agent: false,
          headers: { 'e2b-traffic-access-token': token },
        });
        req.on('response', (res) => res.resume().on('end', () => resolve(res.statusCode ?? 0)));
        req.on('error', reject);
      });
    try {
      expect(await get('token-0123456789')).toBe(200);
      expect(await get('wrong-token')).toBe(403);
      const deadline = Date.now() + 2000;
      while (flows.store.size < 3 && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 10));
      const records = flows.store.query({}, 10).reverse();
      expect(records.map((r) => [r.kind, r.event, r.verdict, r.list])).toEqual([
        ['ingress', 'decision', 'allow', 'trafficToken'],
        ['ingress', 'close', 'allow', 'trafficToken'],
        ['ingress', 'decision', 'deny', 'trafficToken'],
      ]);
      expect(records[0]!.destination).toEqual({
        name: null,
        address: web.host,
        port: web.port,
        protocol: 'http',
      });
      expect(records[1]!.bytesUp).toBeGreaterThan(20);
      expect(records[1]!.bytesDown).toBeGreaterThan(20);
      expect(records[2]!.reason).toBe('wrong traffic access token');
      expect(JSON.stringify(records)).not.toContain('token-0123456789');
    } finally {
      ingress.close();
      await new Promise((resolve) => front.close(resolve));
    }
  });

  describe('GET /flows', () => {
    const get = (query: string, key?: string | null) =>
      api.call('GET', `/flows${query}`, key === undefined ? {} : { key });

    it('needs the API key', async () => {
      expect((await get('', null)).status).toBe(401);
      expect((await get('', 'wrong-key-0123456789abcdef')).status).toBe(401);
    });

    it.each([
      ['verdict=maybe', 'verdict'],
      ['kind=udp', 'kind'],
      ['since=yesterday', 'since'],
      ['since=5x', 'since'],
      ['limit=0', 'limit'],
      ['limit=abc', 'limit'],
      ['limit=1000000', 'limit'],
      ['follow=yes', 'follow'],
      ['sandboxID=a%20b', 'sandboxID'],
      ['sandboxID=nosuchsandbox', 'sandboxID'],
      ['colour=red', 'colour'],
      ['verdict=allow&verdict=deny', 'verdict'],
    ])('answers %s with a 400 naming the parameter', async (query, parameter) => {
      const reply = await get(`?${query}`);
      expect(reply.status).toBe(400);
      expect((reply.body as { message: string }).message).toContain(parameter);
    });

    it('filters, newest first, up to the limit', async () => {
      await udpQuery(moat.listening.dns.port, SOURCE, 'allowed.test');
      await udpQuery(moat.listening.dns.port, SOURCE, 'denied.test');
      const all = (await get(`?sandboxID=${SANDBOX}&limit=1000`)).body as View[];
      expect(all.length).toBeGreaterThanOrEqual(2);
      const times = all.map((r) => Date.parse(r.time as string));
      expect([...times].sort((a, b) => b - a)).toEqual(times);
      expect(all[0]).toMatchObject({ kind: 'dns', verdict: 'deny' });
      const denied = (await get('?verdict=deny&kind=dns&since=5m')).body as View[];
      expect(denied.length).toBeGreaterThan(0);
      expect(denied.every((r) => r.verdict === 'deny' && r.kind === 'dns')).toBe(true);
      const named = (await get('?destination=DENIED.TEST')).body as View[];
      expect(named.length).toBeGreaterThan(0);
      expect(named.every((r) => String(r.destination.name).includes('denied.test'))).toBe(true);
      expect((await get('?limit=1')).body).toHaveLength(1);
      expect((await get(`?since=${new Date(Date.now() + 60_000).toISOString()}`)).body).toEqual([]);
      expect((await get('?sandboxID=inosuchsandbox0000000')).body).toEqual([]);
    });

    /** Opens a follow stream; resolves once its headers came. */
    function follow(query: string, accept?: string) {
      return new Promise<{ res: http.IncomingMessage; req: http.ClientRequest }>(
        (resolve, reject) => {
          const req = http.get({
            host: '127.0.0.1',
            port: moat.listening.api.port,
            path: `/flows?follow=true${query}`,
            headers: { 'x-api-key': API_KEY, ...(accept ? { accept } : {}) },
          });
          req.on('response', (res) => resolve({ res, req }));
          req.on('error', reject);
        },
      );
    }

    /** The stream's text until `done` holds (or 3 s). */
    function readStream(res: http.IncomingMessage, done: (text: string) => boolean) {
      return new Promise<string>((resolve) => {
        let text = '';
        const timer = setTimeout(() => resolve(text), 3000);
        res.on('data', (chunk: Buffer) => {
          text += chunk.toString();
          if (done(text)) {
            clearTimeout(timer);
            resolve(text);
          }
        });
      });
    }

    it('follows new records as NDJSON, filtered, until the client leaves', async () => {
      const { res, req } = await follow('&verdict=deny');
      expect(res.statusCode).toBe(200);
      expect(res.headers['content-type']).toBe('application/x-ndjson');
      const text = readStream(res, (t) => t.includes('\n'));
      await udpQuery(moat.listening.dns.port, SOURCE, 'allowed.test');
      await udpQuery(moat.listening.dns.port, SOURCE, 'denied.test');
      const lines = (await text).trim().split('\n');
      expect(lines).toHaveLength(1);
      expect(JSON.parse(lines[0]!)).toMatchObject({
        kind: 'dns',
        verdict: 'deny',
        destination: { name: 'denied.test' },
      });
      const before = moat.flows.store.followerCount;
      req.destroy();
      const deadline = Date.now() + 2000;
      while (moat.flows.store.followerCount >= before && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 10));
      expect(moat.flows.store.followerCount).toBe(before - 1);
    });

    it('follows as server-sent events when asked for them', async () => {
      const { res, req } = await follow('&kind=dns', 'text/event-stream');
      expect(res.headers['content-type']).toBe('text/event-stream');
      const text = readStream(res, (t) => t.includes('\n\n'));
      await udpQuery(moat.listening.dns.port, SOURCE, 'denied.test');
      const event = await text;
      req.destroy();
      expect(event).toMatch(/^data: \{.*\}\n\n$/);
      expect(JSON.parse(event.slice('data: '.length))).toMatchObject({ kind: 'dns' });
    });

    it('cuts a follower that does not read, and counts it', async () => {
      const socket = net.connect({ host: '127.0.0.1', port: moat.listening.api.port });
      socket.on('error', () => {});
      socket.write(`GET /flows?follow=true HTTP/1.1\r\nHost: x\r\nX-API-Key: ${API_KEY}\r\n\r\n`);
      // Never read: the kernel buffers fill, then Moat's backlog, then the follower is cut.
      socket.pause();
      await new Promise((r) => setTimeout(r, 100));
      const before = moat.flows.store.followerCount;
      expect(before).toBeGreaterThan(0);
      const record = (i: number): FlowRecord => ({
        time: Date.now(),
        id: 1e9 + i,
        event: 'decision',
        sandboxID: SANDBOX,
        node: 'n',
        kind: 'dns',
        destination: {
          name: `n${i}.${'x'.repeat(200)}.test`,
          address: null,
          port: null,
          protocol: 'udp',
        },
        verdict: 'allow',
        list: 'allowOut',
        rule: '*',
        reason: 'r',
      });
      // Bounded: ~500 bytes each, 40,000 records is ~20 MB, far past any socket buffer and 1 MiB.
      for (let i = 0; i < 40_000 && moat.flows.store.followerCount >= before; i++)
        moat.flows.store.add(record(i));
      expect(moat.flows.store.followerCount).toBe(before - 1);
      const dropped = await moat.metrics.registry.getSingleMetricAsString(
        'moat_flow_records_dropped_total',
      );
      expect(dropped).toMatch(/where="follower"\} [1-9]/);
      socket.destroy();
    });
  });

  it("adds each sandbox's flow totals to GET /sandboxes/{id}", async () => {
    const { sandboxID: id } = await api.sandbox();
    try {
      const { egress } = await api.detail(id);
      expectNoContent(
        await api.put(`/sandboxes/${id}/network`, {
          allowOut: ['allowed.test'],
          denyOut: ['0.0.0.0/0'],
        }),
      );
      expect((await api.detail(id)).flows).toEqual({
        allowed: 0,
        denied: 0,
        bytesUp: 0,
        bytesDown: 0,
      });
      await udpQuery(moat.listening.dns.port, egress.address, 'allowed.test');
      await udpQuery(moat.listening.dns.port, egress.address, 'denied.test');
      await udpQuery(moat.listening.dns.port, egress.address, 'denied.test');
      expect((await api.detail(id)).flows).toEqual({
        allowed: 1,
        denied: 2,
        bytesUp: 0,
        bytesDown: 0,
      });
      const own = (await api.call('GET', `/flows?sandboxID=${id}`)).body as View[];
      expect(own.map((r) => r.verdict)).toEqual(['deny', 'deny', 'allow']);
    } finally {
      await api.call('DELETE', `/sandboxes/${id}`);
    }
  });

  it('appends every record to the --flow-log file', async () => {
    await udpQuery(moat.listening.dns.port, SOURCE, 'denied.test');
    const newest = moat.flows.store.query({}, 1)[0]!;
    const deadline = Date.now() + 2000;
    const logged = () => readFileSync(flowLog, 'utf8').trim().split('\n').at(-1);
    while (logged() !== JSON.stringify(flowView(newest)) && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 10));
    expect(JSON.parse(logged()!)).toEqual(flowView(newest));
  });

  it('keeps the newest records under a burst beyond the bound', async () => {
    const store = moat.flows.store;
    expect(store.capacity).toBe(1000);
    const base = 2e9;
    for (let i = 0; i < 5000; i++)
      store.add({
        time: Date.now(),
        id: base + i,
        event: 'decision',
        sandboxID: 'iburst',
        node: 'n',
        kind: 'dns',
        destination: { name: `b${i}.test`, address: null, port: null, protocol: 'udp' },
        verdict: 'deny',
        list: 'default',
        rule: null,
        reason: 'burst',
      });
    expect(store.size).toBe(1000);
    const kept = store.query({}, 10_000);
    expect(kept).toHaveLength(1000);
    expect(kept[0]!.id).toBe(base + 4999);
    expect(kept[999]!.id).toBe(base + 4000);
    const dropped = await moat.metrics.registry.getSingleMetricAsString(
      'moat_flow_records_dropped_total',
    );
    expect(dropped).toMatch(/where="store"\} [1-9]/);
  });

  it('counts flows by kind and verdict, and bytes, without sandbox labels', async () => {
    await udpQuery(moat.listening.dns.port, SOURCE, 'allowed.test');
    const flows = await moat.metrics.registry.getSingleMetricAsString('moat_flows_total');
    expect(flows).toMatch(/moat_flows_total\{kind="dns",verdict="allow"\} [1-9]/);
    const bytes = await moat.metrics.registry.getSingleMetricAsString('moat_flow_bytes_total');
    expect(bytes).toMatch(/moat_flow_bytes_total\{kind="connect",direction="down"\} \d{7}/);
    expect(flows + bytes).not.toContain('sandbox_id');
  });
});
