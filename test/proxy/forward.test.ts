/**
 * Absolute-form HTTP forwarding (`GET http://host:port/path HTTP/1.1` to the proxy listener),
 * black-box and byte-exact: what the proxy accepts and refuses in request heads, how it frames
 * request and response bodies, keep-alive and pipelining, hop-by-hop headers, upstream failures,
 * backpressure, and a fuzz run of mutated heads. The regression suite for the proxy's HTTP/1.1
 * front end.
 *
 * Origins listen on 127.0.0.30-127.0.0.35 and are reached by names a FakeDns resolves; the
 * client side speaks raw bytes over net sockets (test/support/raw-http.ts) unless a test says it
 * uses node:http. The fuzz run is seeded; set MOAT_FUZZ_SEED to replay another seed.
 */
import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { setTimeout as delay } from 'node:timers/promises';
import fc from 'fast-check';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { scratchMoatFlags } from '../../bench/lib/scratch.js';
import { type RunningMoat, startMoat } from '../../src/app/index.js';
import { loadConfig } from '../../src/config.js';
import { compilePolicy, parseIP, parseNetworkConfig } from '../../src/policy/index.js';
import { FakeDns } from '../support/fake-dns.js';
import { kernelBufferedMax } from '../support/kernel-buffers.js';
import { bodyDigest } from '../support/origins.js';
import {
  type CountingOrigin,
  countingHttpOrigin,
  header,
  headerValues,
  latin1,
  RawClient,
  type RawResponse,
  type ScriptedOrigin,
  scriptedOrigin,
} from '../support/raw-http.js';
import { steadyValue } from '../support/steady.js';
import type { HostPort } from '../../src/net/index.js';
import { LOOPBACK_IS_OUTSIDE } from '../../bench/lib/loopback-outside.js';

const SANDBOX = 'iforwardsandbox000001';
const SECRET = 'forward-secret-1';
const SOURCE = '127.77.0.30';
/** Short, so that stalled and trickled heads (the malformed-head tests, the fuzz truncations) end quickly. */
const HANDSHAKE_MS = 500;
const FUZZ_SEED = Number(process.env.MOAT_FUZZ_SEED ?? 0x5eed_f0a0) >>> 0;

const KiB = 1024;
const MiB = 1024 * KiB;

const REC = 'rec.fwd.test'; // 127.0.0.30: raw origin that records bytes; must see nothing
const ECHO = 'echo.fwd.test'; // 127.0.0.31: node:http origin, hashes request bodies
const RAW = 'raw.fwd.test'; // 127.0.0.32: raw origin with scripted responses
const BAD = 'bad.fwd.test'; // 127.0.0.33: raw origin that misbehaves
const FLOOD = 'flood.fwd.test'; // 127.0.0.34: per-test origins (backpressure, disconnect)
const FUZZ = 'fuzz.fwd.test'; // 127.0.0.35: node:http origin for the fuzz run
const SECOND = 'second.fwd.test'; // 127.0.0.36: a per-test origin next to FLOOD's
const BLOCKED = 'blocked.test'; // resolves to the echo origin, but the policy denies it

const AUTH = `Proxy-Authorization: Basic ${Buffer.from(`${SANDBOX}:${SECRET}`).toString('base64')}`;

let upstream: FakeDns;
let moat: RunningMoat;
let proxy: HostPort;
let rec: ScriptedOrigin;
let echo: CountingOrigin & { readonly paths: string[] };
let raw: ScriptedOrigin;
let bad: ScriptedOrigin;
let fuzz: CountingOrigin;
const scratch = scratchMoatFlags();
/** Connections the test opened (raw clients and plain sockets), destroyed after each test. */
const clients: Array<RawClient | net.Socket> = [];

/** The chunks the raw origin's /chunked response is made of. */
const CHUNKS = ['Hello, ', 'chunked ', 'world', 'x'.repeat(10_000), '!'];

/** Connections whose origin still owes the body its last 204 announced (sent late, as a stray). */
const owesStray = new WeakSet<net.Socket>();

/** An origin answering by path, for the response-side tests (bodiless requests only). */
function rawResponses(socket: net.Socket, method: string, target: string): void {
  socket.setNoDelay(true);
  // The late bytes arrive first, and look like an answer: read as one, they would be taken
  // for the answer to whatever request this connection carries next.
  if (owesStray.delete(socket)) socket.write('HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray');
  const path = target.split('?')[0];
  switch (path) {
    case '/ok':
      socket.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok');
      return;
    case '/chunked':
      socket.write(
        'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n' +
          'Trailer: X-Checksum\r\n\r\n',
      );
      CHUNKS.forEach((chunk, i) =>
        socket.write(
          latin1(`${chunk.length.toString(16)}${i === 1 ? ';ext=1' : ''}\r\n${chunk}\r\n`),
        ),
      );
      socket.write('0\r\nX-Checksum: abc\r\n\r\n');
      return;
    case '/head':
      socket.write(
        `HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n${
          method === 'HEAD' ? '' : 'h'.repeat(1000)
        }`,
      );
      return;
    case '/204':
      socket.write('HTTP/1.1 204 No Content\r\nX-Kind: 204\r\n\r\n');
      return;
    case '/204-announcing-body':
      socket.write('HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n');
      owesStray.add(socket);
      return;
    case '/304':
      // A 304 may carry the Content-Length of the representation; it still has no body.
      socket.write('HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\nContent-Length: 1000\r\n\r\n');
      return;
    case '/close-delimited':
      socket.end('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello');
      return;
    case '/hop':
      socket.write(
        'HTTP/1.1 200 OK\r\nConnection: x-secret-hop\r\nX-Secret-Hop: 1\r\n' +
          'Keep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nX-Kept: yes\r\n' +
          'Content-Length: 2\r\n\r\nok',
      );
      return;
    default:
      socket.write('HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n');
  }
}

function badResponses(socket: net.Socket, target: string): void {
  switch (target) {
    case '/garbage':
      socket.write('NOT HTTP\r\n\r\n');
      return;
    case '/hangup':
      socket.end();
      return;
    case '/huge-head': {
      const filler = Array.from(
        { length: 700 },
        (_, i) => `X-Filler-${i}: ${'f'.repeat(90)}\r\n`,
      ).join('');
      socket.write(`HTTP/1.1 200 OK\r\n${filler}Content-Length: 0\r\n\r\n`);
      return;
    }
    default:
      socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
  }
}

beforeAll(async () => {
  rec = await scriptedOrigin('127.0.0.30', (socket) =>
    socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'),
  );
  const paths: string[] = [];
  echo = Object.assign(
    await countingHttpOrigin('127.0.0.31', (req, res) => {
      paths.push(req.url ?? '');
      void bodyDigest(req).then(({ length, sha256 }) => {
        const body = JSON.stringify({
          method: req.method,
          path: req.url,
          host: req.headers.host,
          length,
          sha256,
        });
        res.writeHead(200, {
          'Content-Type': 'application/json',
          'Content-Length': Buffer.byteLength(body),
        });
        res.end(body);
      });
    }),
    { paths },
  );
  raw = await scriptedOrigin('127.0.0.32', (socket, request) =>
    rawResponses(socket, request.method, request.target),
  );
  bad = await scriptedOrigin('127.0.0.33', (socket, request) =>
    badResponses(socket, request.target),
  );
  fuzz = await countingHttpOrigin('127.0.0.35', (req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(200, { 'Content-Length': 2 }).end('ok'));
  });
  upstream = await new FakeDns(
    new Map([
      [REC, { A: ['127.0.0.30'] }],
      [ECHO, { A: ['127.0.0.31'] }],
      [RAW, { A: ['127.0.0.32'] }],
      [BAD, { A: ['127.0.0.33'] }],
      [FLOOD, { A: ['127.0.0.34'] }],
      [FUZZ, { A: ['127.0.0.35'] }],
      [SECOND, { A: ['127.0.0.36'] }],
      [BLOCKED, { A: ['127.0.0.31'] }],
    ]),
  ).start();
  const config = loadConfig({
    flags: {
      'internal-deny': '10.0.0.0/8,169.254.0.0/16',
      'dns-listen': '127.0.0.1:0',
      'dns-upstream': `127.0.0.1:${upstream.port}`,
      'proxy-listen': '127.0.0.1:0',
      'transparent-listen': '127.0.0.1:0',
      'proxy-max-tunnels': '8',
      'proxy-handshake-timeout-ms': String(HANDSHAKE_MS),
      'log-level': 'silent',
      ...scratch.flags,
    },
  });
  if (!config.ok) throw new Error(config.error);
  moat = await startMoat(config.value, pino({ level: 'silent' }), {
    defaultMetrics: false,
    // The origins are on this host's loopback; what is the host is test/proxy/host.test.ts's.
    hostAddresses: LOOPBACK_IS_OUTSIDE,
  });
  proxy = moat.listening.proxy;
  const parsed = parseNetworkConfig({ allowOut: ['*.fwd.test'], denyOut: ['0.0.0.0/0'] });
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
  const source = parseIP(SOURCE);
  if (!source.ok) throw new Error(source.error);
  moat.table.register(
    SANDBOX,
    { sourceAddress: source.value, egressSecret: SECRET },
    compilePolicy(parsed.value, moat.internal),
  );
});

afterAll(async () => {
  for (const client of clients) client.destroy();
  await moat?.stop();
  scratch.remove();
  await Promise.all([...[rec, echo, raw, bad, fuzz].map((o) => o?.close()), upstream?.stop()]);
});

beforeEach(() => {
  rec.bytesReceived = 0;
  rec.requests.length = 0;
  echo.paths.length = 0;
  raw.requests.length = 0;
});

afterEach(() => {
  for (const client of clients.splice(0)) client.destroy();
});

/** A new raw connection to the proxy, destroyed after the test. */
async function connect(): Promise<RawClient> {
  const client = await RawClient.connect(proxy);
  clients.push(client);
  return client;
}

/** `http://name:port/path` */
const url = (name: string, port: number, path = '/') => `http://${name}:${port}${path}`;

/**
 * The bytes of a request: request line, Host (from the URL), Proxy-Authorization, `lines`, then
 * the blank line and `body`. `line` replaces the request line; `eol` the line ending.
 */
function request(
  target: string,
  options: {
    method?: string;
    version?: string;
    line?: string;
    lines?: string[];
    body?: string | Buffer;
    eol?: string;
    auth?: boolean;
  } = {},
): Buffer {
  const { method = 'GET', version = 'HTTP/1.1', lines = [], eol = '\r\n', auth = true } = options;
  const host = target.startsWith('http://') ? new URL(target).host : 'invalid';
  const head = [
    options.line ?? `${method} ${target} ${version}`,
    `Host: ${host}`,
    ...(auth ? [AUTH] : []),
    ...lines,
    '',
    '',
  ].join(eol);
  const body = options.body ?? '';
  return Buffer.concat([latin1(head), typeof body === 'string' ? latin1(body) : body]);
}

function json(response: RawResponse): Record<string, unknown> {
  const text = response.body.toString('utf8');
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch {
    throw new Error(`${response.status} response body is not JSON: ${JSON.stringify(text)}`);
  }
}

/** Asserts a Moat error response: the status and a `{"code": status, "message": ...}` body. */
function expectError(response: RawResponse, status: number): { code: number; message: string } {
  expect(response.status, response.head).toBe(status);
  const body = json(response);
  expect(body).toEqual({ code: status, message: expect.any(String) });
  return body as { code: number; message: string };
}

/** Polls `condition` every 10 ms; fails after `timeoutMs`. */
async function until(condition: () => boolean, timeoutMs = 2000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!condition()) {
    if (performance.now() > deadline)
      throw new Error(`not true within ${timeoutMs} ms: ${condition}`);
    await delay(10);
  }
}

/** Sends `bytes` on a new connection and reads one response. */
async function exchange(bytes: Buffer, method = 'GET') {
  const client = await connect();
  client.send(bytes);
  return { client, response: await client.response({ method }) };
}

/** Request through the proxy with node:http (absolute URL as path, Proxy-Authorization). */
function viaNodeClient(
  target: string,
  options: { method?: string; body?: Buffer; expectContinue?: boolean } = {},
): Promise<{
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  continued: boolean;
}> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string | number> = {
      'proxy-authorization': AUTH.slice('Proxy-Authorization: '.length),
    };
    if (options.body) headers['content-length'] = options.body.length;
    if (options.expectContinue) headers.expect = '100-continue';
    const req = http.request({
      host: proxy.host,
      port: proxy.port,
      method: options.method ?? 'GET',
      path: target,
      headers,
      agent: false,
    });
    let continued = false;
    const timer = setTimeout(
      () => req.destroy(new Error(`no complete response to ${target} within 3 s`)),
      3000,
    );
    req.on('continue', () => {
      continued = true;
      req.end(options.body);
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => {
        clearTimeout(timer);
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body: Buffer.concat(chunks),
          continued,
        });
      });
      res.on('error', reject);
    });
    req.on('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
    if (!options.expectContinue) req.end(options.body);
  });
}

const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');

describe('malformed request heads', () => {
  const target = () => url(REC, rec.port, '/');
  const line = (l: string) => () => request(target(), { line: l.replace('URL', target()) });
  const withLines =
    (lines: string[], extra: { method?: string; body?: string } = {}) =>
    () =>
      request(target(), { lines, ...extra });

  it.each<[string, () => Buffer]>([
    ['bare LF line endings', () => request(target(), { eol: '\n' })],
    [
      'a bare LF ending one header line',
      () => latin1(`GET ${target()} HTTP/1.1\r\nHost: ${REC}\r\n${AUTH}\r\nX-A: 1\nX-B: 2\r\n\r\n`),
    ],
    ['obs-fold (a line starting with a space)', withLines(['X-Folded: a', ' b'])],
    ['obs-fold (a line starting with a tab)', withLines(['X-Folded: a', '\tb'])],
    ['a space between header name and colon', withLines(['X-Space : v'])],
    ['a tab between header name and colon', withLines(['X-Tab\t: v'])],
    ['a NUL in a header value', withLines(['X-Nul: a\0b'])],
    ['a bare CR in a header value', withLines(['X-Cr: a\rb'])],
    ['two spaces after the method', line('GET  URL HTTP/1.1')],
    ['a tab instead of a space', line('GET\tURL HTTP/1.1')],
    ['no HTTP version', line('GET URL')],
    ['a protocol name that is not HTTP', line('GET URL HTTQ/1.1')],
    ['a lower-case protocol name', line('GET URL http/1.1')],
    ['a trailing space after the version', line('GET URL HTTP/1.1 ')],
    [
      'Content-Length together with Transfer-Encoding',
      withLines(['Content-Length: 5', 'Transfer-Encoding: chunked'], {
        method: 'POST',
        body: '0\r\n\r\n',
      }),
    ],
    [
      'two equal Content-Length headers',
      withLines(['Content-Length: 5', 'Content-Length: 5'], { method: 'POST', body: 'hello' }),
    ],
    [
      'two different Content-Length headers',
      withLines(['Content-Length: 5', 'Content-Length: 6'], { method: 'POST', body: 'hello!' }),
    ],
    ['Content-Length "+5"', withLines(['Content-Length: +5'], { method: 'POST', body: 'hello' })],
    ['Content-Length "5 5"', withLines(['Content-Length: 5 5'], { method: 'POST', body: 'hello' })],
    [
      'Content-Length "0x10"',
      withLines(['Content-Length: 0x10'], { method: 'POST', body: '0123456789abcdef' }),
    ],
  ])('answers 400 and closes for %s; the origin sees nothing', async (_, bytes) => {
    const { client, response } = await exchange(bytes());
    expectError(response, 400);
    expect(await client.waitClosed(2000), 'connection closed after the 400').toBe(true);
    await delay(50);
    expect(rec.bytesReceived).toBe(0);
  });

  it.each(['gzip', 'chunked, gzip', 'identity'])(
    'answers 501 and closes for Transfer-Encoding: %s; the origin sees nothing',
    async (coding) => {
      const { client, response } = await exchange(
        request(target(), {
          method: 'POST',
          lines: [`Transfer-Encoding: ${coding}`],
          body: '5\r\nhello\r\n0\r\n\r\n',
        }),
      );
      expectError(response, 501);
      expect(await client.waitClosed(2000), 'connection closed after the 501').toBe(true);
      await delay(50);
      expect(rec.bytesReceived).toBe(0);
    },
  );

  it.each<[string, () => string[]]>([
    ['a head over 16 KiB', () => [`X-Big: ${'a'.repeat(17 * KiB)}`]],
    [
      '101 header lines',
      // Host and Proxy-Authorization are two of them.
      () => Array.from({ length: 99 }, (_, i) => `X-Many-${i}: v`),
    ],
  ])('answers 431 and closes for %s; the origin sees nothing', async (_, lines) => {
    const { client, response } = await exchange(request(target(), { lines: lines() }));
    expect(response.status, response.head).toBe(431);
    expect(await client.waitClosed(2000), 'connection closed after the 431').toBe(true);
    await delay(50);
    expect(rec.bytesReceived).toBe(0);
  });

  it.each<[string, () => string[]]>([
    ['a head of 15 KiB', () => [`X-Big: ${'a'.repeat(15 * KiB)}`]],
    ['exactly 100 header lines', () => Array.from({ length: 98 }, (_, i) => `X-Many-${i}: v`)],
  ])('forwards a request just inside the limits: %s', async (_, lines) => {
    const { response } = await exchange(request(target(), { lines: lines() }));
    expect(response.status, response.head).toBe(200);
    expect(response.body.toString()).toBe('ok');
    expect(rec.requests).toHaveLength(1);
  });

  it('disconnects a client that stalls in the middle of its head, within the handshake timeout', async () => {
    const client = await connect();
    const sent = performance.now();
    client.send(`GET ${target()} HTTP/1.1\r\nHost: ${REC}:${rec.port}\r\n${AUTH}\r\nX-Par`);
    const closed = await client.waitClosed(HANDSHAKE_MS + 1500);
    const elapsed = performance.now() - sent;
    expect(closed, `still open ${Math.round(elapsed)} ms after a partial head`).toBe(true);
    // Not at once: a head may legitimately arrive in pieces.
    expect(elapsed).toBeGreaterThanOrEqual(HANDSHAKE_MS / 2);
    if (client.unread().length > 0) expect((await client.response()).status).toBe(408);
    expect(rec.bytesReceived).toBe(0);
  });

  /** Writes `text` a byte every 100 ms until `stop()` or 4 s pass; the ms that took. */
  async function trickle(write: (byte: string) => void, text: string, stop: () => boolean) {
    const started = performance.now();
    for (let at = 0; at < 40 && !stop(); at++) {
      write(text[at % text.length]!);
      await delay(100);
    }
    return performance.now() - started;
  }
  const slowHead = () => `GET ${target()} HTTP/1.1\r\nX-Slow: ${'a'.repeat(64)}`;

  it('disconnects a client that trickles its head, at the handshake timeout (a deadline, not an idle timer)', async () => {
    const first = await connect();
    const elapsed = await trickle(
      (b) => first.send(b),
      slowHead(),
      () => first.ended,
    );
    expect(first.ended).toBe(true);
    expect(elapsed).toBeLessThan(HANDSHAKE_MS + 1000);
    // A later head on a kept-alive connection has the same deadline from its first byte.
    const later = await connect();
    later.send(request(target()));
    expect((await later.response()).status).toBe(200);
    const again = await trickle(
      (b) => later.send(b),
      slowHead(),
      () => later.ended,
    );
    expect(later.ended).toBe(true);
    expect(again).toBeLessThan(HANDSHAKE_MS + 1000);
    expect(rec.requests).toHaveLength(1);
  });

  it('closes a refused connection whose client keeps sending, soon after the answer', async () => {
    // Half-open: the client keeps its side open after Moat's FIN, and keeps writing.
    const socket = net.connect({ ...proxy, allowHalfOpen: true });
    clients.push(socket);
    socket.on('error', () => {});
    let closed = false;
    socket.on('close', () => (closed = true));
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.write('NOT A REQUEST\r\n\r\n');
    socket.resume();
    await new Promise((resolve) => socket.once('end', resolve));
    // Moat reads on and drops what comes (so the client's FIN can arrive), but not forever.
    const elapsed = await trickle(
      (b) => socket.write(b),
      'x',
      () => closed,
    );
    socket.destroy();
    expect(closed).toBe(true);
    expect(elapsed).toBeLessThan(2 * HANDSHAKE_MS + 1000);
  });

  it('reads a head that arrives in many small pieces', async () => {
    const client = await connect();
    const bytes = request(url(ECHO, echo.port, '/pieces'));
    for (let at = 0; at < bytes.length; at += 7) {
      client.send(bytes.subarray(at, at + 7));
      await delay(2);
    }
    const response = await client.response();
    expect(response.status).toBe(200);
    expect(json(response).path).toBe('/pieces');
  });
});

describe('request bodies, pipelining and keep-alive', () => {
  it('carries a 1 MiB Content-Length body intact', async () => {
    const body = randomBytes(MiB);
    const { response } = await exchange(
      request(url(ECHO, echo.port, '/upload'), {
        method: 'POST',
        lines: [`Content-Length: ${body.length}`, 'Content-Type: application/octet-stream'],
        body,
      }),
    );
    expect(response.status).toBe(200);
    expect(json(response)).toMatchObject({ method: 'POST', length: MiB, sha256: sha256(body) });
  });

  it('carries a chunked body, sent in pieces with chunk extensions, intact', async () => {
    const pieces = [randomBytes(1000), latin1('hello'), randomBytes(70_000), randomBytes(1)];
    const client = await connect();
    client.send(
      request(url(ECHO, echo.port, '/chunked-upload'), {
        method: 'POST',
        lines: ['Transfer-Encoding: chunked'],
      }),
    );
    for (const [i, piece] of pieces.entries()) {
      const extension = i === 0 ? ';name=value' : i === 2 ? ';a=1;b="quoted value"' : '';
      client.send(
        Buffer.concat([
          latin1(`${piece.length.toString(16)}${extension}\r\n`),
          piece,
          latin1('\r\n'),
        ]),
      );
      await delay(5);
    }
    client.send('0\r\n\r\n');
    const response = await client.response();
    expect(response.status).toBe(200);
    const all = Buffer.concat(pieces);
    expect(json(response)).toMatchObject({
      method: 'POST',
      length: all.length,
      sha256: sha256(all),
    });
  });

  it('answers two GETs pipelined in one write, in order, on the same connection', async () => {
    const client = await connect();
    client.send(
      Buffer.concat([request(url(ECHO, echo.port, '/one')), request(url(ECHO, echo.port, '/two'))]),
    );
    const first = await client.response();
    const second = await client.response();
    expect([first.status, second.status]).toEqual([200, 200]);
    expect([json(first).path, json(second).path]).toEqual(['/one', '/two']);
    expect(client.ended).toBe(false);
  });

  it('keeps the client connection alive for 50 GETs and reuses upstream connections', async () => {
    const client = await connect();
    const before = echo.connections;
    for (let i = 0; i < 50; i++) {
      client.send(request(url(ECHO, echo.port, `/seq/${i}`)));
      const response = await client.response();
      expect(response.status, `request ${i}`).toBe(200);
      expect(json(response).path).toBe(`/seq/${i}`);
    }
    expect(echo.connections - before).toBeLessThanOrEqual(5);
  });

  it('keeps no more idle origin connections for a sandbox than its connection cap (8 here)', async () => {
    // Twelve origins on one allowed name, each on its own port: twelve pool keys.
    let open = 0;
    const servers = await Promise.all(
      Array.from({ length: 12 }, async () => {
        const server = http.createServer((_, res) => res.end('ok'));
        server.on('connection', (socket) => {
          open++;
          socket.on('close', () => open--);
        });
        await new Promise<void>((resolve) => server.listen(0, '127.0.0.35', resolve));
        return server;
      }),
    );
    try {
      const client = await connect();
      for (const server of servers) {
        const { port } = server.address() as net.AddressInfo;
        client.send(request(url(FUZZ, port, '/pooled')));
        expect((await client.response()).status).toBe(200);
      }
      await delay(100);
      expect(open).toBeLessThanOrEqual(8);
      expect(open).toBeGreaterThan(0);
    } finally {
      for (const server of servers) {
        server.closeAllConnections();
        server.close();
      }
    }
  });

  it('sends an idempotent request again when its pooled connection dies unanswered', async () => {
    // Each origin connection answers one request with keep-alive, then drops the next one
    // unanswered: the race of an origin closing an idle connection as Moat reuses it.
    const answered = new Set<number>();
    const dropping = await scriptedOrigin('127.0.0.34', (socket, { connection }) => {
      if (answered.has(connection)) return void socket.destroy();
      answered.add(connection);
      socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
    });
    try {
      const client = await connect();
      for (const [i, method] of ['GET', 'GET', 'DELETE'].entries()) {
        client.send(request(url(FLOOD, dropping.port, `/${i}`), { method }));
        expect((await client.response({ method })).status, `request ${i}`).toBe(200);
      }
      // A POST is never sent twice: it fails with 502 naming the destination.
      client.send(request(url(FLOOD, dropping.port, '/post'), { method: 'POST' }));
      expect(expectError(await client.response({ method: 'POST' }), 502).message).toContain(FLOOD);
      expect(dropping.requests.map((r) => `${r.connection} ${r.method} ${r.target}`)).toEqual([
        '0 GET /0',
        '0 GET /1',
        '1 GET /1',
        '1 DELETE /2',
        '2 DELETE /2',
        '2 POST /post',
      ]);
    } finally {
      await dropping.close();
    }
  });

  it('gives up a request whose client half-closes before its body is complete', async () => {
    let upstreamClosed = false;
    const waiting = await scriptedOrigin('127.0.0.34', (socket) => {
      socket.once('close', () => (upstreamClosed = true));
    });
    try {
      const client = await connect();
      client.send(
        request(url(FLOOD, waiting.port, '/upload'), {
          method: 'POST',
          lines: ['Content-Length: 100'],
          body: 'only ten b',
        }),
      );
      await until(() => waiting.requests.length === 1);
      client.end();
      expect(await client.waitClosed(2000), 'client connection still open').toBe(true);
      await until(() => upstreamClosed);
    } finally {
      await waiting.close();
    }
  });

  it('answers an HTTP/1.0 request in full and then closes', async () => {
    const client = await connect();
    client.send(request(url(ECHO, echo.port, '/ten'), { version: 'HTTP/1.0' }));
    const response = await client.response();
    expect(response.status).toBe(200);
    expect(json(response).path).toBe('/ten');
    expect(await client.waitClosed(2000), 'connection closed after the HTTP/1.0 response').toBe(
      true,
    );
  });

  it('decides each request: a denied name after an allowed one gets 403, the origin sees nothing', async () => {
    const client = await connect();
    client.send(request(url(ECHO, echo.port, '/allowed')));
    expect((await client.response()).status).toBe(200);
    client.send(request(url(BLOCKED, echo.port, '/denied')));
    const denied = expectError(await client.response(), 403);
    expect(denied.message).toContain(`${BLOCKED}:${echo.port}`);
    expect(echo.paths).toEqual(['/allowed']);
  });
});

describe('responses', () => {
  it('relays a chunked response with a trailer to a node:http client', async () => {
    const response = await viaNodeClient(url(RAW, raw.port, '/chunked'));
    expect(response.status).toBe(200);
    expect(response.body.toString('latin1')).toBe(CHUNKS.join(''));
  });

  it('relays a chunked response and keeps the connection usable', async () => {
    const client = await connect();
    client.send(request(url(RAW, raw.port, '/chunked')));
    const response = await client.response();
    expect(response.status).toBe(200);
    expect(response.body.toString('latin1')).toBe(CHUNKS.join(''));
    client.send(request(url(RAW, raw.port, '/ok')));
    const next = await client.response();
    expect(next.status).toBe(200);
    expect(next.body.toString()).toBe('ok');
  });

  it('relays a HEAD response without waiting for a body, then serves a GET', async () => {
    const client = await connect();
    client.send(request(url(RAW, raw.port, '/head'), { method: 'HEAD' }));
    const head = await client.response({ method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(header(head, 'content-length')).toBe('1000');
    client.send(request(url(RAW, raw.port, '/head')));
    const get = await client.response();
    expect(get.status).toBe(200);
    expect(get.body.toString()).toBe('h'.repeat(1000));
  });

  it.each(['204', '304'])(
    'relays a %s without a body, then serves the next request',
    async (status) => {
      const client = await connect();
      client.send(request(url(RAW, raw.port, `/${status}`)));
      const response = await client.response();
      expect(response.status).toBe(Number(status));
      client.send(request(url(RAW, raw.port, '/ok')));
      const next = await client.response();
      expect(next.status, `the request after the ${status}`).toBe(200);
      expect(next.body.toString()).toBe('ok');
    },
  );

  it('does not pool an origin connection whose 204 announced a body (its late bytes are no answer)', async () => {
    const client = await connect();
    client.send(request(url(RAW, raw.port, '/204-announcing-body')));
    expect((await client.response()).status).toBe(204);
    client.send(request(url(RAW, raw.port, '/ok')));
    const next = await client.response();
    expect(next.status).toBe(200);
    expect(next.body.toString(), 'the answer to /ok, not the stray bytes').toBe('ok');
  });

  it('relays a close-delimited response and then closes the client connection', async () => {
    const client = await connect();
    client.send(request(url(RAW, raw.port, '/close-delimited')));
    const response = await client.response();
    expect(response.status).toBe(200);
    expect(response.body.toString()).toBe('hello');
    expect(await client.waitClosed(2000), 'connection closed after the response').toBe(true);
  });

  it('relays the final response after a 100-continue, and the origin gets the body', async () => {
    const body = randomBytes(20_000);
    const response = await viaNodeClient(url(ECHO, echo.port, '/continue'), {
      method: 'POST',
      body,
      expectContinue: true,
    });
    expect(response.continued).toBe(true);
    expect(response.status).toBe(200);
    expect(JSON.parse(response.body.toString())).toMatchObject({
      path: '/continue',
      length: body.length,
      sha256: sha256(body),
    });
  });

  it('strips hop-by-hop response headers and keeps the others', async () => {
    const client = await connect();
    client.send(request(url(RAW, raw.port, '/hop')));
    const response = await client.response();
    expect(response.status).toBe(200);
    expect(header(response, 'x-kept')).toBe('yes');
    expect(headerValues(response, 'x-secret-hop')).toEqual([]);
    expect(headerValues(response, 'proxy-authenticate')).toEqual([]);
    expect(headerValues(response, 'keep-alive')).not.toContain('timeout=5');
    for (const value of headerValues(response, 'connection'))
      expect(value.toLowerCase()).not.toContain('x-secret-hop');
    expect(response.body.toString()).toBe('ok');
  });

  it.each([
    ['answers something that is not HTTP', '/garbage'],
    ['closes without answering', '/hangup'],
    ['sends a response head over 64 KiB', '/huge-head'],
  ])('answers 502 naming the destination when the origin %s', async (_, path) => {
    const { response } = await exchange(request(url(BAD, bad.port, path)));
    const { message } = expectError(response, 502);
    expect(message).toContain(BAD);
    expect(message).toContain(`:${bad.port}`);
    const after = await exchange(request(url(BAD, bad.port, '/fine')));
    expect(after.response.status).toBe(200);
    expect(after.response.body.toString()).toBe('ok');
  });
});

describe('what a hostile client or origin cannot do', () => {
  it('frames what it forwards itself: a Connection option naming Content-Length smuggles nothing', async () => {
    const smuggled = `GET /smuggled HTTP/1.1\r\nHost: ${BLOCKED}\r\n\r\n`;
    const { client, response } = await exchange(
      request(url(ECHO, echo.port, '/first'), {
        method: 'POST',
        lines: [`Content-Length: ${smuggled.length}`, 'Connection: content-length'],
        body: smuggled,
      }),
      'POST',
    );
    expect(response.status).toBe(200);
    expect(json(response)).toMatchObject({ path: '/first', length: smuggled.length });
    client.send(request(url(ECHO, echo.port, '/second')));
    expect(json(await client.response()).path).toBe('/second');
    expect(echo.paths.slice(-2)).toEqual(['/first', '/second']);
  });

  it('gives the client the framing it relays, whatever the origin named in Connection', async () => {
    const origin = await scriptedOrigin('127.0.0.34', (socket) =>
      socket.write(
        'HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello',
      ),
    );
    try {
      const client = await connect();
      for (const i of [1, 2]) {
        client.send(request(url(FLOOD, origin.port, `/${i}`)));
        const response = await client.response();
        expect(header(response, 'content-length'), `response ${i}`).toBe('5');
        expect(response.body.toString()).toBe('hello');
      }
    } finally {
      await origin.close();
    }
  });

  it('does not hand out a pooled connection the origin reset', async () => {
    const origin = await scriptedOrigin('127.0.0.34', (socket) => {
      socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
      setTimeout(() => socket.resetAndDestroy(), 20);
    });
    try {
      const client = await connect();
      for (const method of ['GET', 'POST']) {
        client.send(request(url(FLOOD, origin.port, `/${method}`), { method }));
        expect((await client.response({ method, timeoutMs: 2000 })).status, method).toBe(200);
        await delay(100);
      }
    } finally {
      await origin.close();
    }
  });

  it('stops reading pipelined requests from a client that does not read its answers', async () => {
    const socket = net.connect({ host: proxy.host, port: proxy.port });
    clients.push(socket);
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.pause();
    // Origin-form requests: each gets Moat's own 400, and the connection stays open.
    const one = latin1(`GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ${'p'.repeat(200)}\r\n\r\n`);
    // Far more than the kernel's buffers on both ends can take, so what Moat leaves unread stays
    // with the client; in small pieces, as a write leaves writableLength only once all of it is
    // sent.
    const piece = Buffer.concat(Array.from({ length: 256 }, () => one));
    while (socket.writableLength < 64 * MiB) socket.write(piece);
    // Moat stops reading once its answers wait: the client's queue then stops shrinking (two
    // seconds without a change). A Moat that read on would take bytes until none were left.
    const deadline = performance.now() + 20_000;
    let readings = [-1, -2];
    while (readings[0] !== readings[1] && socket.writableLength > 0) {
      expect(performance.now(), 'Moat still reading requests after 20 s').toBeLessThan(deadline);
      await delay(2000);
      readings = [readings[1]!, socket.writableLength];
    }
    expect(socket.destroyed, 'Moat closed the connection').toBe(false);
    expect(socket.writableLength, 'bytes of requests left with the client').toBeGreaterThan(
      2 * MiB,
    );
    socket.destroy();
  });

  it('answers 502 to an origin that sends interim responses without end', async () => {
    const origin = await scriptedOrigin('127.0.0.34', (socket, { target }) => {
      const count = target === '/few' ? 3 : 100;
      for (let i = 0; i < count; i++)
        socket.write('HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n');
      socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
    });
    try {
      const client = await connect();
      client.send(request(url(FLOOD, origin.port, '/few')));
      for (let i = 0; i < 3; i++) expect((await client.response()).status).toBe(103);
      expect((await client.response()).status).toBe(200);
      const flood = await connect();
      flood.send(request(url(FLOOD, origin.port, '/many')));
      let response = await flood.response();
      while (response.status === 103) response = await flood.response();
      expect(expectError(response, 502).message).toMatch(/interim responses/);
    } finally {
      await origin.close();
    }
  });

  it.each([
    ['an HTTP/1.0 request', { version: 'HTTP/1.0' }],
    ['Connection: close', { lines: ['Connection: close'] }],
  ])('closes after its own answer to %s', async (_, options) => {
    const { client, response } = await exchange(request(url(BLOCKED, echo.port, '/'), options));
    expectError(response, 403);
    expect(header(response, 'connection')).toBe('close');
    expect(await client.waitClosed(1000)).toBe(true);
  });

  it('refuses Transfer-Encoding in an HTTP/1.0 request', async () => {
    const { response } = await exchange(
      request(url(REC, rec.port, '/'), {
        method: 'POST',
        version: 'HTTP/1.0',
        lines: ['Transfer-Encoding: chunked'],
        body: '0\r\n\r\n',
      }),
      'POST',
    );
    expectError(response, 400);
  });
});

describe('connections Moat decided to close', () => {
  /** `moat_proxy_client_connections`: client sockets the proxy holds. */
  async function held(): Promise<number> {
    const text = await moat.metrics.registry.metrics();
    return Number(/^moat_proxy_client_connections (\d+)$/m.exec(text)?.[1]);
  }

  it('are freed even when the client sends more after Moat answered', async () => {
    // Earlier tests' connections are gone first: then every socket counted is one of these.
    for (const client of clients.splice(0)) client.destroy();
    // On a loaded machine Moat may take a while to see them go (a pipelining client above left
    // it megabytes of requests to get through first).
    const settle = performance.now() + 10_000;
    while ((await held()) > 0 && performance.now() < settle) await delay(20);
    expect(await held()).toBe(0);
    const cases = [
      // A forwarded request asking to close, then more bytes.
      request(url(ECHO, echo.port, '/'), { lines: ['Connection: close'] }),
      // Moat's own 403 to a request with a body, the body arriving after it.
      request(url(BLOCKED, echo.port, '/'), { method: 'POST', lines: ['Content-Length: 4'] }),
      // A refused CONNECT, then bytes that would have been the tunnel's.
      latin1(`CONNECT ${BLOCKED}:${echo.port} HTTP/1.1\r\n${AUTH}\r\n\r\n`),
    ];
    const sockets = await Promise.all(
      cases.map(async (bytes) => {
        const socket = net.connect({ host: proxy.host, port: proxy.port, allowHalfOpen: true });
        clients.push(socket);
        socket.on('error', () => {});
        socket.resume();
        await new Promise((resolve) => socket.once('connect', resolve));
        socket.write(bytes);
        await delay(100);
        socket.end('junk');
        return socket;
      }),
    );
    await until(() => sockets.every((socket) => socket.readableEnded), 2000);
    for (const socket of sockets) socket.destroy();
    const deadline = performance.now() + 2000;
    while ((await held()) > 0 && performance.now() < deadline) await delay(20);
    expect(await held(), 'client sockets Moat still holds').toBe(0);
  });

  it('still answers a whole pipelined request with a body when the client half-closes after it', async () => {
    const answer: http.RequestListener = (req, res) => {
      let body = '';
      req.on('data', (chunk: Buffer) => (body += chunk.toString()));
      req.on('end', () =>
        setTimeout(() => res.end(`${req.url} ${body}`), req.url === '/slow' ? 300 : 0),
      );
    };
    const slow = await countingHttpOrigin('127.0.0.34', answer);
    const second = await countingHttpOrigin('127.0.0.36', answer);
    try {
      const socket = net.connect({ host: proxy.host, port: proxy.port, allowHalfOpen: true });
      clients.push(socket);
      let received = '';
      socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')));
      await new Promise((resolve) => socket.once('connect', resolve));
      socket.write(request(url(FLOOD, slow.port, '/slow')));
      // While the first is answered: a whole POST to an origin Moat must dial, head and body in
      // one segment, then FIN (which Moat sees before the new connection is up).
      await delay(50);
      socket.end(
        request(url(SECOND, second.port, '/post'), {
          method: 'POST',
          lines: ['Content-Length: 5'],
          body: 'hello',
        }),
      );
      await until(() => socket.readableEnded, 3000);
      expect(received).toContain('/slow ');
      expect(received).toContain('/post hello');
    } finally {
      await Promise.all([slow.close(), second.close()]);
    }
  });

  it('answers every pipelined request of a client that half-closes before reading', async () => {
    const body = 'b'.repeat(100 * KiB);
    const large = await scriptedOrigin('127.0.0.34', (socket) =>
      socket.write(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\n\r\n${body}`),
    );
    try {
      const socket = net.connect({ host: proxy.host, port: proxy.port, allowHalfOpen: true });
      clients.push(socket);
      await new Promise((resolve) => socket.once('connect', resolve));
      socket.pause();
      const count = 200;
      const one = request(url(FLOOD, large.port, '/large'));
      socket.write(Buffer.concat(Array.from({ length: count }, () => one)));
      // 20 MB of answers back up: Moat waits for this client to read. Then its FIN arrives.
      await delay(500);
      socket.end();
      await delay(300);
      let answers = 0;
      let tail = '';
      socket.on('data', (chunk: Buffer) => {
        const text = tail + chunk.toString('latin1');
        answers += text.split('HTTP/1.1 200 OK').length - 1;
        tail = text.slice(-20);
      });
      socket.resume();
      await until(() => socket.readableEnded, 10_000);
      expect(answers).toBe(count);
    } finally {
      await large.close();
    }
  });
});

describe('flow control', () => {
  it('holds a fast origin back while the client does not read, then delivers all of it', async () => {
    // What a stalled client lets through is bounded by the kernel buffers of two loopback
    // connections (client and origin side) and Moat's own; the origin has 64 MiB more than that
    // to send, so a relay that read on without bound would pass the bound.
    const bound = kernelBufferedMax(2) + 4 * MiB;
    const total = kernelBufferedMax(2) + 64 * MiB;
    let written = 0;
    const flood = await scriptedOrigin('127.0.0.34', (socket) => {
      socket.write(
        `HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: ${total}\r\n\r\n`,
      );
      const chunk = Buffer.alloc(64 * KiB, 0x61);
      const push = () => {
        while (written < total) {
          const piece = chunk.subarray(0, Math.min(chunk.length, total - written));
          written += piece.length;
          if (!socket.write(piece)) return void socket.once('drain', push);
        }
      };
      push();
    });
    let client: RawClient | undefined;
    try {
      client = await connect();
      client.pause();
      client.send(request(url(FLOOD, flood.port, '/flood')));
      // The origin stops once the buffers are full: no byte more for half a second.
      const stalled = await steadyValue(() => written, {
        quietMs: 500,
        withinMs: 15_000,
        what: 'bytes the origin wrote to a client that reads nothing',
      });
      expect(stalled, 'bytes the origin could write while the client read nothing').toBeLessThan(
        bound,
      );
      expect(stalled).toBeGreaterThan(0);
      const response = await client.response({ keepBody: false, timeoutMs: 30_000 });
      expect(response.status).toBe(200);
      expect(response.bodyLength).toBe(total);
      expect(client.unread().length).toBe(0);
    } finally {
      // Before the origin closes: a client left open would keep Moat's connection to it.
      client?.destroy();
      await flood.close();
    }
  });

  it('closes the upstream connection when the client disconnects mid-response', async () => {
    let upstreamClosed: Promise<number> | undefined;
    const slow = await scriptedOrigin('127.0.0.34', (socket) => {
      upstreamClosed = new Promise((resolve) =>
        socket.once('close', () => resolve(performance.now())),
      );
      socket.write(`HTTP/1.1 200 OK\r\nContent-Length: ${100 * MiB}\r\n\r\n`);
      socket.write(Buffer.alloc(64 * KiB, 0x62));
    });
    try {
      const client = await connect();
      client.send(request(url(FLOOD, slow.port, '/slow')));
      await client.waitReceived(16 * KiB);
      expect(upstreamClosed).toBeDefined();
      client.destroy();
      const gone = performance.now();
      const closedAt = await Promise.race([upstreamClosed!, delay(2000).then(() => undefined)]);
      expect(closedAt, 'origin connection still open 2 s after the client left').toBeDefined();
      expect(closedAt! - gone).toBeLessThan(2000);
    } finally {
      await slow.close();
    }
  });
});

describe('fuzz', () => {
  interface FuzzCase {
    readonly kind: string;
    readonly bytes: Buffer;
  }

  /** 2,000 heads from FUZZ_SEED: mutations of a valid GET, random bytes, huge header counts. */
  function fuzzCases(count: number): FuzzCase[] {
    const target = url(FUZZ, fuzz.port, '/fuzz?q=1');
    const base = request(target, { lines: ['User-Agent: fuzz/1', 'Accept: */*'] });
    const n = base.length;
    const flips = fc
      .array(fc.tuple(fc.nat({ max: n - 1 }), fc.nat({ max: 7 })), { minLength: 1, maxLength: 6 })
      .map((list) => {
        const bytes = Buffer.from(base);
        for (const [at, bit] of list) bytes[at] = bytes[at]! ^ (1 << bit);
        return { kind: 'bit flips', bytes };
      });
    const truncation = fc
      .integer({ min: 1, max: n - 1 })
      .map((cut) => ({ kind: 'truncation', bytes: base.subarray(0, cut) }));
    const random = fc
      .uint8Array({ minLength: 1, maxLength: 1024 })
      .map((array) => ({ kind: 'random bytes', bytes: Buffer.from(array) }));
    // Random bytes rarely end a head, so most of the above wait out the handshake timeout.
    const randomHead = fc.uint8Array({ minLength: 1, maxLength: 1024 }).map((array) => ({
      kind: 'random head',
      bytes: Buffer.concat([Buffer.from(array), latin1('\r\n\r\n')]),
    }));
    const many = fc.integer({ min: 101, max: 4000 }).map((headers) => ({
      kind: 'many headers',
      bytes: request(target, {
        lines: Array.from({ length: headers }, (_, i) => `X-Fuzz-${i}: ${i}`),
      }),
    }));
    const fragments = ['\0', '\r', '\n', ' ', '\t', ':', '\x7f', '\xff', '\r\n', '\r\n '];
    const inserted = fc
      .tuple(fc.nat({ max: n }), fc.constantFrom(...fragments, '\r\n\r\n', 'HTTP/1.1', '%00'))
      .map(([at, fragment]) => ({
        kind: 'insertion',
        bytes: Buffer.concat([base.subarray(0, at), latin1(fragment), base.subarray(at)]),
      }));
    const removed = fc
      .tuple(fc.nat({ max: n - 1 }), fc.integer({ min: 1, max: 16 }))
      .map(([at, length]) => ({
        kind: 'deletion',
        bytes: Buffer.concat([base.subarray(0, at), base.subarray(at + length)]),
      }));
    const arbitrary = fc.oneof(
      { arbitrary: flips, weight: 35 },
      { arbitrary: truncation, weight: 6 },
      { arbitrary: random, weight: 4 },
      { arbitrary: randomHead, weight: 11 },
      { arbitrary: many, weight: 8 },
      { arbitrary: inserted, weight: 26 },
      { arbitrary: removed, weight: 10 },
    );
    return fc.sample(arbitrary, { seed: FUZZ_SEED, numRuns: count });
  }

  /** Undefined when the connection ended (response head or close) within 2 s, else the problem. */
  /** `source`: each worker connects from its own address, within the per-source budget. */
  async function runCase(bytes: Buffer, source: string): Promise<string | undefined> {
    let client: RawClient;
    try {
      client = await RawClient.connect(proxy, 2000, source);
    } catch (error) {
      return `could not connect: ${(error as Error).message}`;
    }
    try {
      client.send(bytes);
      const answered = await client.waitUntil((unread) => unread.includes('\r\n\r\n'), 2000);
      const unread = client.unread();
      if (unread.length > 0 && !/^HTTP\/1\.[01] \d{3} /.test(unread.toString('latin1', 0, 13)))
        return `answered with something that is not an HTTP response: ${JSON.stringify(unread.toString('latin1', 0, 60))}`;
      if (!answered && !client.ended) return 'neither answered nor closed within 2 s';
      return undefined;
    } finally {
      client.destroy();
    }
  }

  it('survives 2,000 mutated heads, each ending within 2 s, and still forwards afterwards', async () => {
    const cases = fuzzCases(2000);
    const problems: string[] = [];
    const budgetEnd = performance.now() + 15_000;
    let next = 0;
    let done = 0;
    const worker = async (source: string) => {
      while (next < cases.length && problems.length < 20 && performance.now() < budgetEnd) {
        const fuzzCase = cases[next++]!;
        const problem = await runCase(fuzzCase.bytes, source);
        done++;
        if (problem !== undefined) {
          const preview = fuzzCase.bytes.toString('latin1', 0, 120);
          problems.push(`${fuzzCase.kind}: ${problem}: ${JSON.stringify(preview)}`);
        }
      }
    };
    await Promise.all(Array.from({ length: 32 }, (_, i) => worker(`127.0.4.${i + 1}`)));
    expect(problems, `seed ${FUZZ_SEED} (MOAT_FUZZ_SEED to replay)`).toEqual([]);
    expect(done, 'cases run within the 15 s budget').toBe(cases.length);
    const { response } = await exchange(request(url(FUZZ, fuzz.port, '/after')));
    expect(response.status).toBe(200);
    expect(response.body.toString()).toBe('ok');
  }, 25_000);
});
