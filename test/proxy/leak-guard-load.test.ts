/**
 * The leak guard's cost on Moat's one event loop: a sandbox sending request heads crafted to be
 * costly to search (the largest head Moat takes, every field percent-encoded four times over)
 * through a plain-HTTP tunnel, with a platform's usual number of stored secrets, must not hold
 * another sandbox's proxied request longer than the fair-share test lets a light sandbox wait.
 * Bounded in count and time, on loopback only; no secret value is printed.
 */
import http from 'node:http';
import type net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type InterceptingProxy,
  startInterceptingProxy,
} from '../../bench/lib/intercepting-proxy.js';
import { connectThrough } from '../support/origins.js';

const ORIGIN_IP = '127.0.0.43';
const NETWORK = { allowOut: ['plain.test'], denyOut: ['0.0.0.0/0'] };
const HEAVY = { id: 'guardheavysandbox0001', secret: 'heavy-secret', source: '127.88.1.2' };
const LIGHT = { id: 'guardlightsandbox0001', secret: 'light-secret', source: '127.88.1.3' };
/** Sixteen stored secrets of the lengths API keys have (20 to 110 characters), none in a head. */
const SECRETS = new Map<string, string>(
  Array.from({ length: 16 }, (_, i) => [`key${i}`, `${'v'.repeat(19 + i * 6)}Z`] as const),
);

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Just under 16 KiB of fields, each needing every decoding round the guard makes. */
function costlyHead(port: number): string {
  const field = `${'a'.repeat(150)}%25252541`;
  const fields = Array.from({ length: 94 }, (_, i) => `X-${i}: ${field}\r\n`).join('');
  return `GET /costly HTTP/1.1\r\nHost: plain.test:${port}\r\n${fields}\r\n`;
}

/** One absolute-form GET through the proxy on a new connection; its time in ms (5 s at most). */
function timedGet(proxy: { port: number }, port: number): Promise<number> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    setTimeout(() => resolve(5000), 5000).unref();
    const request = http.get({
      host: '127.0.0.1',
      port: proxy.port,
      localAddress: LIGHT.source,
      path: `http://plain.test:${port}/light`,
      headers: {
        host: 'plain.test',
        'proxy-authorization': `Basic ${Buffer.from(`${LIGHT.id}:${LIGHT.secret}`).toString('base64')}`,
      },
      agent: false,
    });
    request.on('response', (response) => {
      response.resume();
      response.on('end', () =>
        response.statusCode === 200
          ? resolve(performance.now() - started)
          : reject(new Error(`status ${response.statusCode}`)),
      );
    });
    request.on('error', reject);
  });
}

describe("the leak guard's cost on Moat's loop", () => {
  let origin: http.Server;
  let originPort = 0;
  let moat: InterceptingProxy;

  beforeAll(async () => {
    origin = http.createServer({ maxHeaderSize: 64 * 1024 }, (_, res) => res.end('ok'));
    await new Promise<void>((resolve) => origin.listen(0, ORIGIN_IP, resolve));
    originPort = (origin.address() as net.AddressInfo).port;
    moat = await startInterceptingProxy({
      names: { get: (name: string) => (name === 'plain.test' ? [ORIGIN_IP] : undefined) } as never,
      injection: {
        transformFor: () => undefined,
        leafContext: () => Promise.reject(new Error('no interception here')),
        secretValue: async (name) => SECRETS.get(name),
        secretValues: async () => SECRETS,
      },
      transparentPorts: { tls: 443, http: originPort },
    });
    for (const who of [HEAVY, LIGHT]) moat.register(who.id, who.secret, who.source, NETWORK);
  });

  afterAll(async () => {
    await moat?.close();
    origin?.close();
  });

  it("keeps another sandbox's request within 300 ms while one sends costly heads through a plain-HTTP tunnel", async () => {
    const tunnel = await connectThrough(moat.proxy, `plain.test:${originPort}`, {
      localAddress: HEAVY.source,
      auth: `${HEAVY.id}:${HEAVY.secret}`,
    });
    expect(tunnel.status).toBe(200);
    tunnel.socket.resume();
    const head = costlyHead(originPort);
    expect(head.length).toBeLessThan(16 * 1024);
    // 192 heads (3 MB), four to a write, one write every 50 ms: 80 heads (1.3 MB) a second, a
    // rate any sandbox's link carries.
    const until = Date.now() + 3200;
    const flood = (async () => {
      for (let sent = 0; sent < 48 && !tunnel.socket.destroyed; sent++) {
        tunnel.socket.write(head.repeat(4));
        await sleep(50);
      }
    })();
    await sleep(200);
    const latencies: number[] = [];
    while (Date.now() < until) {
      latencies.push(await timedGet(moat.proxy, originPort));
      await sleep(100);
    }
    await flood;
    tunnel.socket.destroy();
    expect(latencies.length).toBeGreaterThan(0);
    // Without the guard's search (no secrets stored) the same flood leaves it about 5 ms; the
    // fair-share test holds a light sandbox to 300 ms at worst, as here.
    expect(Math.max(...latencies)).toBeLessThan(300);
  }, 30_000);
});
