/**
 * Fair shares of Moat's one event loop: a sandbox proxying as fast as it can, or asking for a
 * leaf certificate for name after name under a wildcard header rule, cannot take the loop from
 * another sandbox. Every flood here is bounded in time and count, on loopback only.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type InterceptingProxy,
  startInterceptingProxy,
} from '../../bench/lib/intercepting-proxy.js';
import { MoatCa } from '../../src/intercept-ca/index.js';
import { headerRules } from '../../src/policy/index.js';
import { connectThrough } from '../support/origins.js';
import { tlsFlood } from '../support/tls-flood.js';
import { TestCa } from '../support/test-ca.js';

const ORIGIN_IP = '127.0.0.41';
const TLS_ORIGIN_IP = '127.0.0.42';
const NETWORK = { allowOut: ['fair.test', '*.wild.test'], denyOut: ['0.0.0.0/0'] };
const HEAVY = { id: 'fairheavysandbox00001', secret: 'heavy-secret', source: '127.88.0.2' };
const STEADY = { id: 'fairsteadysandbox0001', secret: 'steady-secret', source: '127.88.0.3' };
const LIGHT = { id: 'fairlightsandbox00001', secret: 'light-secret', source: '127.88.0.4' };
type Who = typeof HEAVY;
/** What one leaf costs here (docs/benchmarks.md measures about 7 ms of CPU). */
const MINT_MS = 15;

/** Names Moat resolves: fair.test, and every name under wild.test. */
const NAMES = {
  get: (name: string) =>
    name === 'fair.test' ? [ORIGIN_IP] : name.endsWith('.wild.test') ? [TLS_ORIGIN_IP] : undefined,
} as unknown as ReadonlyMap<string, readonly string[]>;

const percentile = (values: number[], p: number) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))]!;
};

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

interface Tally {
  ok: number;
  limited: number;
  /** A 429's body, to check it names the budget. */
  limitedBody?: string;
}

/**
 * One keep-alive client connection sending absolute-form GETs until `until`: one after another
 * (after a 429 it waits 20 ms, as a polite client would), or one every `everyMs`, a sandbox
 * that is merely active (then any answer but 200 counts as limited).
 */
async function hammer(
  proxy: { port: number },
  who: Who,
  until: number,
  tally: Tally,
  everyMs?: number,
) {
  const auth = Buffer.from(`${who.id}:${who.secret}`).toString('base64');
  const request = `GET http://fair.test:${originPort}/ HTTP/1.1\r\nHost: fair.test\r\nProxy-Authorization: Basic ${auth}\r\n\r\n`;
  const socket = await openSocket(proxy.port, who.source);
  try {
    while (Date.now() < until && !socket.destroyed) {
      const answer = await exchange(socket, request);
      if (answer === undefined) break;
      if (answer.status === 200) tally.ok++;
      else if (everyMs !== undefined) tally.limited++;
      else if (answer.status === 429) {
        tally.limited++;
        tally.limitedBody ??= answer.body;
        await sleep(20);
      } else throw new Error(`unexpected answer ${answer.status}: ${answer.body}`);
      if (everyMs !== undefined) await sleep(everyMs);
    }
  } finally {
    socket.destroy();
  }
}

async function openSocket(port: number, localAddress: string): Promise<net.Socket> {
  const { connect } = await import('node:net');
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port, localAddress }, () => resolve(socket));
    socket.once('error', reject);
  });
}

/** Writes one request and reads its whole answer (Content-Length framed); undefined: closed. */
function exchange(
  socket: net.Socket,
  request: string,
): Promise<{ status: number; body: string } | undefined> {
  return new Promise((resolve) => {
    let received = '';
    const done = (answer: { status: number; body: string } | undefined) => {
      socket.off('data', onData).off('close', onClose);
      resolve(answer);
    };
    const onData = (chunk: Buffer) => {
      received += chunk.toString('latin1');
      const end = received.indexOf('\r\n\r\n');
      if (end < 0) return;
      const length = Number(/content-length: *(\d+)/i.exec(received.slice(0, end))?.[1] ?? 0);
      if (received.length < end + 4 + length) return;
      done({
        status: Number(received.split(' ')[1]),
        body: received.slice(end + 4, end + 4 + length),
      });
    };
    const onClose = () => done(undefined);
    socket.on('data', onData).on('close', onClose);
    socket.write(request);
  });
}

let originPort = 0;
/** Requests the origin served that came through a plain-HTTP CONNECT tunnel. */
let tunnelledServed = 0;

describe('fair shares of the event loop between sandboxes', () => {
  const originCa = new TestCa('fair-origin-ca');
  const dataDir = mkdtempSync(join(tmpdir(), 'moat-fair-'));
  let origin: http.Server;
  let tlsOrigin: https.Server;
  let moat: InterceptingProxy;
  /**
   * A leaf is minted one at a time, each taking MINT_MS, in the order asked: the CPU a mint
   * costs, as a server of fixed speed, so the test does not depend on how loaded the machine is
   * (the clients do not check the certificate, so one leaf of Moat's CA serves every name).
   */
  let mints: Promise<unknown> = Promise.resolve();
  const mintInTurn = (): Promise<tls.SecureContext> => {
    const minted = mints.then(async () => {
      await sleep(MINT_MS);
      return leaf;
    });
    mints = minted;
    return minted;
  };
  let leaf: tls.SecureContext;

  beforeAll(async () => {
    origin = http.createServer((req, res) => {
      if (req.url === '/tunnelled') tunnelledServed++;
      res.end('ok');
    });
    await new Promise<void>((resolve) => origin.listen(0, ORIGIN_IP, resolve));
    originPort = (origin.address() as net.AddressInfo).port;
    tlsOrigin = https.createServer(originCa.issue(['*.wild.test']), (_, res) => res.end('tls'));
    await new Promise<void>((resolve) => tlsOrigin.listen(0, TLS_ORIGIN_IP, resolve));
    const opened = await MoatCa.open({ dataDir, owner: 'fair-test' });
    if (!opened.ok) throw new Error(opened.error);
    leaf = await opened.value.secureContextFor('leaf.wild.test');
    moat = await startInterceptingProxy({
      names: NAMES,
      injection: {
        transformFor: (_, name) =>
          name.endsWith('.wild.test')
            ? headerRules('*.wild.test', [{ name: 'X-Rule', value: [{ literal: 'y' }] }])
            : undefined,
        leafContext: mintInTurn,
        secretValue: async () => undefined,
      },
      upstreamCa: originCa.cert,
      transparentPorts: { tls: (tlsOrigin.address() as net.AddressInfo).port, http: originPort },
      fairShare: { requestsPerSecond: 100, leafMintsWaiting: 16 },
    });
    for (const who of [HEAVY, STEADY, LIGHT])
      moat.register(who.id, who.secret, who.source, NETWORK);
  });

  afterAll(async () => {
    await moat?.close();
    origin?.close();
    tlsOrigin?.close();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('gives two saturating sandboxes comparable shares of proxied requests, and a light one its latency', async () => {
    const until = Date.now() + 2500;
    const heavy: Tally = { ok: 0, limited: 0 };
    const steady: Tally = { ok: 0, limited: 0 };
    const latencies: number[] = [];
    const light = (async () => {
      const auth = Buffer.from(`${LIGHT.id}:${LIGHT.secret}`).toString('base64');
      const request = `GET http://fair.test:${originPort}/ HTTP/1.1\r\nHost: fair.test\r\nProxy-Authorization: Basic ${auth}\r\n\r\n`;
      const socket = await openSocket(moat.proxy.port, LIGHT.source);
      try {
        while (Date.now() < until) {
          const started = performance.now();
          const answer = await exchange(socket, request);
          expect(answer?.status).toBe(200);
          latencies.push(performance.now() - started);
          await sleep(100);
        }
      } finally {
        socket.destroy();
      }
    })();
    // The heavy sandbox has 32 times the connections of the steady one: on one event loop that
    // serves connections in turn, it would get about 32 times the requests through.
    await Promise.all([
      ...Array.from({ length: 64 }, () => hammer(moat.proxy, HEAVY, until, heavy)),
      ...Array.from({ length: 2 }, () => hammer(moat.proxy, STEADY, until, steady)),
      light,
    ]);
    expect(steady.ok).toBeGreaterThan(50);
    // Unshared, about 32. Shared, near 1 on a quiet host; on a loaded one this test's own client
    // is slow to send the steady sandbox's next request on its two connections, and the heavy
    // one's 64 fill the gaps (2.1 in a CI run beside other work, 3.6 at load 8): a quarter of
    // the unshared ratio still tells the two apart.
    expect(heavy.ok / steady.ok).toBeLessThan(8);
    expect(latencies.length).toBeGreaterThan(10);
    // Unheld, its requests wait only for the loop, never the 250 ms a held request waits (on a
    // machine at load 7 the loop alone made the 90th percentile 106 ms).
    expect(percentile(latencies, 90)).toBeLessThan(200);
    expect(Math.max(...latencies)).toBeLessThan(300);
    // Past what its queue holds, the heavy sandbox is told which budget it is over.
    expect(heavy.limited).toBeGreaterThan(0);
    expect(heavy.limitedBody).toContain('proxy-requests-per-second');
    expect(heavy.limitedBody).toContain(HEAVY.id);
    const refusals = await moat.metrics.budgetRefusals.get();
    const counted = refusals.values.find((v) => v.labels.resource === 'proxied_requests');
    expect(counted?.value).toBeGreaterThan(0);
  }, 30_000);

  it.each([
    ['a CONNECT tunnel', 'connect'],
    ['a direct connection to port 80 (transparent)', 'transparent'],
  ] as const)(
    "holds the requests of plain HTTP kept alive in %s to the sandbox's rate, as proxied ones are",
    async (_, path) => {
      // Every request of a plain-HTTP tunnel is parsed and checked on Moat's loop (Host, the
      // leak guard), as an absolute-form one is: one connection must not carry requests past
      // the rate.
      const steadyUntil = Date.now() + 2500;
      const steady: Tally = { ok: 0, limited: 0 };
      const active = hammer(moat.proxy, STEADY, steadyUntil, steady, 100);
      await sleep(100);
      let socket: net.Socket;
      if (path === 'connect') {
        const tunnel = await connectThrough(moat.proxy, `fair.test:${originPort}`, {
          localAddress: HEAVY.source,
          auth: `${HEAVY.id}:${HEAVY.secret}`,
        });
        expect(tunnel.status).toBe(200);
        socket = tunnel.socket;
      } else socket = await openSocket(moat.transparent.port, HEAVY.source);
      tunnelledServed = 0;
      const request = `GET /tunnelled HTTP/1.1\r\nHost: fair.test:${originPort}\r\n\r\n`;
      // 1,000 requests pipelined in one write, read back for 1.5 s: at 100 a second (a tenth
      // of a second's burst, 250 ms held) fewer than 200 may be served.
      socket.resume();
      socket.write(request.repeat(1000));
      await sleep(1500);
      const served = tunnelledServed;
      socket.destroy();
      await active;
      expect(steady.ok).toBeGreaterThan(5);
      expect(served).toBeLessThan(200);
    },
    30_000,
  );

  it("keeps a sandbox asking for leaf after leaf from delaying another sandbox's intercepted connection", async () => {
    /**
     * A TLS handshake with Moat's leaf for `name` through a CONNECT: its time from the tunnel's
     * 200 (what a leaf mint delays; the CONNECT before it waits for the loop like any request).
     */
    const handshake = async (who: Who, name: string): Promise<number> => {
      const tunnel = await connectThrough(moat.proxy, `${name}:443`, {
        localAddress: who.source,
        auth: `${who.id}:${who.secret}`,
      });
      if (tunnel.status !== 200) throw new Error(`CONNECT ${name}: ${tunnel.status}`);
      const started = performance.now();
      return new Promise((resolve, reject) => {
        const secure = tls.connect({
          socket: tunnel.socket,
          servername: name,
          rejectUnauthorized: false,
        });
        secure.once('secureConnect', () => {
          resolve(performance.now() - started);
          secure.destroy();
        });
        secure.once('error', reject);
      });
    };
    const flood = tlsFlood({
      proxy: moat.proxy,
      localAddress: HEAVY.source,
      auth: `${HEAVY.id}:${HEAVY.secret}`,
      prefix: 'n',
      domain: 'wild.test',
      concurrency: 48,
      durationMs: 5000,
      maxNames: 5000,
    });
    // The light sandbox starts once the flood has filled Moat's queue of mints.
    await sleep(500);
    const latencies: number[] = [];
    for (let i = 0; i < 15; i++) {
      latencies.push(await handshake(LIGHT, `light${i}.wild.test`));
      await sleep(100);
    }
    const flooded = await flood;
    expect(flooded.handshakes).toBeGreaterThan(20);
    // Served in turn, the light sandbox waits for a mint or two, not behind the flood's whole
    // queue (48 mints, over 700 ms) as each of the flood's connections does.
    expect(percentile(latencies, 90)).toBeLessThan(250);
    expect(percentile(latencies, 90)).toBeLessThan(flooded.medianMs / 2);
    if (flooded.failed > 0) {
      const refusals = await moat.metrics.budgetRefusals.get();
      const counted = refusals.values.find((v) => v.labels.resource === 'leaf_mints');
      expect(counted?.value).toBeGreaterThan(0);
    }
  }, 30_000);
});
