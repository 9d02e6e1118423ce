/**
 * Connections a sandbox holds open on Moat's listeners are counted against it from accept to
 * close, in every state: a flood of silent connections, or keep-alive connections left open
 * after a 403, is held to the budget and closed by the first-byte and idle deadlines, while
 * another sandbox's proxy request and Moat's /health answer within a second. Two sandboxes,
 * told apart by their loopback source addresses; run on the native relay and on Node's sockets.
 */
import http from 'node:http';
import net from 'node:net';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RunningMoat, startMoat } from '../../src/app/index.js';
import { loadConfig } from '../../src/config.js';
import { compilePolicy, parseIP, parseNetworkConfig } from '../../src/policy/index.js';
import type { TcpIoSetting } from '../../src/proxy/index.js';
import { scratchMoatFlags } from '../../bench/lib/scratch.js';
import { FakeDns } from '../support/fake-dns.js';
import { httpEchoOrigin, type Origin } from '../support/origins.js';
import { LOOPBACK_IS_OUTSIDE } from '../../bench/lib/loopback-outside.js';

const CAP = 16;
const FLOOD = 2000;
const KEEP_ALIVE_MS = 600;
const FIRST_BYTE_MS = 1500;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe.each<TcpIoSetting>(['auto', 'node'])('connection budget (proxy io %s)', (io) => {
  // Each io's sandboxes have addresses of their own: the two files may run at once elsewhere.
  const A = io === 'auto' ? '127.77.9.2' : '127.77.9.12';
  const B = io === 'auto' ? '127.77.9.3' : '127.77.9.13';
  const ORIGIN = io === 'auto' ? '127.0.0.41' : '127.0.0.42';
  let upstream: FakeDns;
  let origin: Origin;
  let moat: RunningMoat;
  const scratch = scratchMoatFlags();

  beforeAll(async () => {
    origin = await httpEchoOrigin(ORIGIN);
    upstream = await new FakeDns(
      new Map([
        ['allowed.test', { A: [ORIGIN] }],
        ['denied.test', { A: [ORIGIN] }],
      ]),
    ).start();
    const config = loadConfig({
      flags: {
        'dns-listen': '127.0.0.1:0',
        'dns-upstream': `127.0.0.1:${upstream.port}`,
        'proxy-listen': '127.0.0.1:0',
        'transparent-listen': '127.0.0.1:0',
        'api-listen': '127.0.0.1:0',
        'log-level': 'silent',
        'proxy-io': io,
        'internal-deny': '10.0.0.0/8',
        'proxy-max-tunnels': String(CAP),
        'proxy-first-byte-timeout-ms': String(FIRST_BYTE_MS),
        'proxy-keep-alive-timeout-ms': String(KEEP_ALIVE_MS),
        ...scratch.flags,
      },
    });
    if (!config.ok) throw new Error(config.error);
    moat = await startMoat(config.value, pino({ level: 'silent' }), {
      defaultMetrics: false,
      hostAddresses: LOOPBACK_IS_OUTSIDE,
    });
    const parsed = parseNetworkConfig({ allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] });
    if (!parsed.ok) throw new Error('policy');
    for (const [id, source] of [
      ['budgetsandboxa000000001', A],
      ['budgetsandboxb000000001', B],
    ] as const) {
      const address = parseIP(source);
      if (!address.ok) throw new Error(address.error);
      moat.table.register(
        id,
        { sourceAddress: address.value, egressSecret: `secret-${id}` },
        compilePolicy(parsed.value, moat.internal),
      );
    }
  });

  afterAll(async () => {
    await moat?.stop();
    scratch.remove();
    await Promise.all([origin?.close(), upstream?.stop()]);
  });

  const refusals = async (resource: string): Promise<number> => {
    const text = await moat.metrics.registry.metrics();
    const line = new RegExp(`^moat_budget_refusals_total\\{resource="${resource}"\\} (\\d+)$`, 'm');
    return Number(line.exec(text)?.[1] ?? 0);
  };

  /** Connects from `source` to `at`; resolves once connected (or failed: then destroyed). */
  const connectFrom = (source: string, at: { host: string; port: number }) =>
    new Promise<net.Socket>((resolve) => {
      const socket = net.connect({ host: at.host, port: at.port, localAddress: source });
      socket.on('error', () => socket.destroy());
      socket.once('connect', () => resolve(socket));
      socket.once('close', () => resolve(socket));
    });

  /** Milliseconds until a GET answers, and its status. */
  const timedGet = (options: http.RequestOptions) =>
    new Promise<{ ms: number; status: number }>((resolve, reject) => {
      const started = performance.now();
      const request = http.get({ ...options, agent: false, timeout: 5000 });
      request.on('response', (response) => {
        response.resume();
        resolve({ ms: performance.now() - started, status: response.statusCode ?? 0 });
      });
      request.on('timeout', () => request.destroy(new Error('no answer within 5 s')));
      request.on('error', reject);
    });

  /** A GET through the proxy from sandbox B. */
  const timedGetFromB = () =>
    timedGet({
      host: moat.listening.proxy.host,
      port: moat.listening.proxy.port,
      path: `http://allowed.test:${origin.port}/`,
      localAddress: B,
    });

  /** Moat's /health. */
  const timedHealth = () =>
    timedGet({ host: moat.listening.api.host, port: moat.listening.api.port, path: '/health' });

  it(`holds a flood of ${FLOOD} silent connections to the budget; B and /health answer within 1 s`, async () => {
    const before = await refusals('proxy_connections');
    const silentBefore = await refusals('first_byte_deadline');
    const sockets: net.Socket[] = [];
    const deadline = Date.now() + 10_000;
    try {
      // Bounded: FLOOD connections, 200 at a time, for at most 10 s.
      for (let done = 0; done < FLOOD && Date.now() < deadline; done += 200)
        sockets.push(
          ...(await Promise.all(
            Array.from({ length: 200 }, () => connectFrom(A, moat.listening.proxy)),
          )),
        );
      const [b, health] = await Promise.all([timedGetFromB(), timedHealth()]);
      await sleep(200);
      const open = sockets.filter((s) => !s.destroyed).length;
      expect(open).toBeLessThanOrEqual(CAP);
      expect(b.status).toBe(200);
      expect(b.ms).toBeLessThan(1000);
      expect(health.status).toBe(200);
      expect(health.ms).toBeLessThan(1000);
      // Every other one was refused at accept, or closed at its first-byte deadline (freeing
      // its place for a later one of the flood).
      const refused = (await refusals('proxy_connections')) - before;
      const silent = (await refusals('first_byte_deadline')) - silentBefore;
      expect(refused).toBeGreaterThan(FLOOD / 2);
      expect(refused + silent + open).toBe(sockets.length);
    } finally {
      for (const socket of sockets) socket.destroy();
    }
    // Given back as they close: A may connect again.
    await sleep(200);
    expect(moat.connections.held('budgetsandboxa000000001')).toBe(0);
  }, 30_000);

  it('holds keep-alive connections left open after a 403 to the budget, and closes them when idle', async () => {
    const idleBefore = await refusals('idle_deadline');
    const sockets = await Promise.all(
      Array.from({ length: 3 * CAP }, () => connectFrom(A, moat.listening.proxy)),
    );
    try {
      const answers = await Promise.all(
        sockets.map(
          (socket) =>
            new Promise<string>((resolve) => {
              if (socket.destroyed) return resolve('closed');
              let text = '';
              socket.on('data', (chunk: Buffer) => {
                text += chunk.toString('latin1');
                if (text.includes('\r\n\r\n')) resolve(text.split(' ')[1]!);
              });
              socket.once('close', () => resolve('closed'));
              socket.write('GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n');
            }),
        ),
      );
      expect(answers.filter((a) => a === '403').length).toBeLessThanOrEqual(CAP);
      expect(answers.filter((a) => a === '403').length).toBeGreaterThan(0);
      // Every answered one is closed once it idles past the keep-alive cap.
      await sleep(KEEP_ALIVE_MS + 500);
      expect(sockets.filter((s) => !s.destroyed && !s.readableEnded)).toHaveLength(0);
      expect((await refusals('idle_deadline')) - idleBefore).toBeGreaterThan(0);
    } finally {
      for (const socket of sockets) socket.destroy();
    }
  }, 30_000);

  it('closes a connection that sends no first byte within the deadline, and counts it', async () => {
    const before = await refusals('first_byte_deadline');
    const socket = await connectFrom(B, moat.listening.proxy);
    const started = Date.now();
    await new Promise((resolve) => socket.once('close', resolve).resume());
    const waited = Date.now() - started;
    expect(waited).toBeGreaterThan(FIRST_BYTE_MS - 200);
    expect(waited).toBeLessThan(FIRST_BYTE_MS + 1000);
    expect((await refusals('first_byte_deadline')) - before).toBe(1);
  }, 10_000);

  it('counts a sandbox once across listeners: full on the proxy, its DNS over TCP is refused, B is not', async () => {
    const held = await Promise.all(
      Array.from({ length: CAP }, () => connectFrom(A, moat.listening.proxy)),
    );
    try {
      await sleep(100);
      const dnsA = await connectFrom(A, moat.listening.dns);
      const dnsB = await connectFrom(B, moat.listening.dns);
      await sleep(200);
      expect(dnsA.destroyed).toBe(true);
      expect(dnsB.destroyed).toBe(false);
      dnsB.destroy();
    } finally {
      for (const socket of held) socket.destroy();
    }
  }, 10_000);
});
