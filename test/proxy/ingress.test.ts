import { type ChildProcess, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import net from 'node:net';
import { Readable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { FlowRecorder, FlowStore } from '../../src/flows/index.js';
import { MoatMetrics } from '../../src/metrics/index.js';
import { IngressProxy, type IngressTarget } from '../../src/proxy/ingress.js';
import { kernelBufferedMax } from '../support/kernel-buffers.js';
import { bodyDigest } from '../support/origins.js';

const SANDBOX = 'ingresssandbox0000001';
const TOKEN = 'tat-0123456789abcdef0123456789abcdef';
const LOOPBACK = '127.0.0.1';
const CONNECT_TIMEOUT_MS = 300;
const IDLE_TIMEOUT_MS = 1000;
const MiB = 1 << 20;
/** What the flood route writes at most: far beyond what socket buffers can hold. */
const FLOOD_LIMIT = 256 * MiB;

const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const listen = (server: net.Server): Promise<number> =>
  new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, LOOPBACK, () => resolve((server.address() as net.AddressInfo).port));
  });

const shut = (server: http.Server) =>
  new Promise<void>((resolve) => {
    server.closeAllConnections();
    server.close(() => resolve());
  });

/** Deterministic bytes for downloads, so the client can check what arrived. */
function pattern(bytes: number): Buffer {
  const data = Buffer.alloc(bytes);
  for (let i = 0; i < bytes; i++) data[i] = (i * 31 + 7) % 251;
  return data;
}

/** Resolves when `stream` closes: whether it had finished (response) or completed (request). */
const closing = (stream: ServerResponse | IncomingMessage): Promise<boolean> =>
  new Promise((resolve) => {
    const done = () =>
      resolve('complete' in stream ? stream.complete : (stream as ServerResponse).writableFinished);
    if (stream.destroyed) done();
    else stream.once('close', done);
  });

interface Exchange {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
}

/** The HTTP origin behind the proxy (a service inside the sandbox). */
interface HttpOrigin {
  readonly port: number;
  readonly server: http.Server;
  /** Requests it received, in order. */
  readonly requests: IncomingMessage[];
  /** Bytes the /flood route has handed to its socket so far. */
  flooded: number;
  /** Resolves with the next request for `path`, to watch how it ends. */
  next(path: string): Promise<Exchange>;
}

const drained = (res: ServerResponse) =>
  new Promise<void>((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });

async function startHttpOrigin(): Promise<HttpOrigin> {
  const waiters = new Map<string, (exchange: Exchange) => void>();
  const routes: Record<string, (req: IncomingMessage, res: ServerResponse, url: URL) => void> = {
    '/download': (_req, res, url) => {
      const data = pattern(Number(url.searchParams.get('bytes')));
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      Readable.from(chunks(data, 64 * 1024)).pipe(res);
    },
    '/flood': async (_req, res) => {
      origin.flooded = 0;
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      const chunk = Buffer.alloc(64 * 1024, 7);
      while (origin.flooded < FLOOD_LIMIT && !res.destroyed) {
        origin.flooded += chunk.length;
        if (!res.write(chunk)) await drained(res);
      }
      res.end();
    },
    '/stream': (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      let ticks = 0;
      const timer = setInterval(() => {
        if (++ticks > 500) {
          clearInterval(timer);
          res.end();
        } else res.write('tick\n');
      }, 20);
      res.on('close', () => clearInterval(timer));
    },
    // Accepts the request and never answers.
    '/silent': () => {},
    '/die': (_req, res) => {
      res.writeHead(200, { 'content-length': '1000' });
      res.write(Buffer.alloc(100, 1));
      setTimeout(() => res.socket?.destroy(), 50);
    },
    '/hop-response': (_req, res) => {
      res.writeHead(200, {
        connection: 'X-Hop-Response',
        'x-hop-response': 'hop',
        'keep-alive': 'timeout=99',
        'proxy-authenticate': 'Basic realm="origin"',
        'x-end-to-end': 'kept',
        'content-length': '2',
      });
      res.end('ok');
    },
  };
  const echo = (req: IncomingMessage, res: ServerResponse) => {
    void bodyDigest(req).then(({ length, sha256 }) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          method: req.method,
          url: req.url,
          headers: req.headers,
          remotePort: req.socket.remotePort,
          bodyLength: length,
          bodySha256: sha256,
        }),
      );
    });
  };
  const server = http.createServer((req, res) => {
    req.on('error', () => {});
    res.on('error', () => {});
    origin.requests.push(req);
    const url = new URL(req.url ?? '/', 'http://origin');
    waiters.get(url.pathname)?.({ req, res });
    waiters.delete(url.pathname);
    (routes[url.pathname] ?? echo)(req, res, url);
  });
  const origin: HttpOrigin = {
    port: await listen(server),
    server,
    requests: [],
    flooded: 0,
    next: (path) => new Promise((resolve) => waiters.set(path, resolve)),
  };
  return origin;
}

function* chunks(data: Buffer, size: number) {
  for (let at = 0; at < data.length; at += size) yield data.subarray(at, at + size);
}

/**
 * The upgrade origin: answers 101, sends one JSON line with what it saw, echoes the bytes the
 * client sent after its head, then echoes everything. `Upgrade: refuse` gets a 426 instead.
 */
async function startUpgradeOrigin() {
  const sockets: net.Socket[] = [];
  const server = http.createServer((_req, res) => res.writeHead(404).end());
  server.on('upgrade', (req: IncomingMessage, socket: net.Socket, head: Buffer) => {
    socket.on('error', () => socket.destroy());
    sockets.push(socket);
    if (req.headers.upgrade === 'refuse') {
      socket.end(
        'HTTP/1.1 426 Upgrade Required\r\nContent-Type: text/plain\r\nContent-Length: 7\r\n\r\nrefused',
      );
      return;
    }
    socket.write(
      'HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\nX-Origin: upgraded\r\n\r\n',
    );
    socket.write(`${JSON.stringify({ url: req.url, headers: req.headers })}\n`);
    if (head.length > 0) socket.write(head);
    socket.pipe(socket);
  });
  return { port: await listen(server), server, sockets };
}

/** A front server standing in for the sandbox listener's router: requests go to `target()`. */
/** A flow recorder of its own (ingress requests are recorded as flows). */
const testFlows = (logger: pino.Logger) =>
  new FlowRecorder({
    store: new FlowStore(1000),
    metrics: new MoatMetrics({ defaultMetrics: false }),
    logger,
    node: 'test',
  });

async function startFront(ingress: IngressProxy, target: () => IngressTarget) {
  const server = http.createServer((req, res) => ingress.request(req, res, target()));
  server.on('upgrade', (req, socket, head) => ingress.upgrade(req, socket, head, target()));
  return { port: await listen(server), server };
}

/**
 * A port whose accept queue is full, so connecting to it hangs (SYNs are dropped): a real
 * connect timeout on loopback. The listener lives in a child that never accepts.
 */
async function unacceptingPort(): Promise<{ port: number; stop(): void }> {
  const child: ChildProcess = spawn(
    process.execPath,
    [
      '-e',
      `const s = require('node:net').createServer().listen({ port: 0, host: '${LOOPBACK}', backlog: 1 }, () => {
        require('node:fs').writeSync(1, s.address().port + '\\n');
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 30000);
      });`,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout!.once('data', (data) => resolve(Number(String(data).trim())));
    child.once('error', reject);
  });
  const held: net.Socket[] = [];
  const stop = () => {
    for (const socket of held) socket.destroy();
    child.kill();
  };
  for (let attempt = 0; attempt < 8; attempt++) {
    const socket = net.connect(port, LOOPBACK);
    socket.on('error', () => {});
    const connected = await Promise.race([
      new Promise<boolean>((resolve) => socket.once('connect', () => resolve(true))),
      sleep(300).then(() => false),
    ]);
    held.push(socket);
    if (!connected) return { port, stop };
  }
  stop();
  throw new Error('the accept queue never filled');
}

/** A port nothing listens on (bound, then released). */
async function closedPort(): Promise<number> {
  const server = net.createServer();
  const port = await listen(server);
  await new Promise((resolve) => server.close(resolve));
  return port;
}

interface Reply {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly body: Buffer;
}

interface Send {
  readonly method?: string;
  readonly path?: string;
  readonly headers?: Record<string, string>;
  readonly body?: Buffer | Readable;
  readonly port?: number;
}

let origin: HttpOrigin;
let upgrades: Awaited<ReturnType<typeof startUpgradeOrigin>>;
let front: Awaited<ReturnType<typeof startFront>>;
let ingress: IngressProxy;
let target: IngressTarget;
const logLines: string[] = [];

const originalHost = (port: number) => `${port}-${SANDBOX}.moat.test`;
const notListening = (port: number) =>
  `no service listening on port ${port} of sandbox ${SANDBOX}; a server in the sandbox must listen on 0.0.0.0 (every address), not only 127.0.0.1`;

/** Points the front at `port` of the sandbox with the given token and mask. */
function aim(overrides: Partial<IngressTarget> = {}): void {
  target = {
    sandboxID: SANDBOX,
    host: LOOPBACK,
    port: origin.port,
    trafficToken: null,
    maskRequestHost: null,
    ...overrides,
  };
}

/** One request through the front, on its own connection; resolves the whole reply. */
function send(options: Send = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: LOOPBACK,
      port: options.port ?? front.port,
      method: options.method ?? 'GET',
      path: options.path ?? '/',
      headers: { host: originalHost(target.port), ...options.headers },
      agent: false,
    });
    req.on('error', reject);
    req.on('response', (res) => {
      const parts: Buffer[] = [];
      res.on('data', (chunk: Buffer) => parts.push(chunk));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts) }),
      );
      res.on('error', reject);
    });
    if (options.body instanceof Readable) options.body.pipe(req);
    else req.end(options.body);
  });
}

const json = (reply: Reply) => JSON.parse(reply.body.toString('utf8'));

/** What the echo origin saw, from its reply. */
interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  remotePort: number;
  bodyLength: number;
  bodySha256: string;
}

async function echoed(options: Send = {}): Promise<Seen> {
  const reply = await send(options);
  expect(reply.status).toBe(200);
  return json(reply) as Seen;
}

/** Everything a raw socket receives, with a way to wait for enough of it. */
function received(socket: net.Socket) {
  let data = Buffer.alloc(0);
  let closed = false;
  const wakers = new Set<() => void>();
  const wake = () => {
    for (const waker of [...wakers]) waker();
  };
  socket.on('data', (chunk: Buffer) => {
    data = Buffer.concat([data, chunk]);
    wake();
  });
  socket.on('close', () => {
    closed = true;
    wake();
  });
  socket.on('error', () => {});
  return {
    get data() {
      return data;
    },
    get closed() {
      return closed;
    },
    /** Waits until `enough` holds (or the socket closed, or 5 s passed). */
    until(enough: (data: Buffer) => boolean): Promise<Buffer> {
      return new Promise((resolve) => {
        const check = () => {
          if (!enough(data) && !closed) return;
          clearTimeout(timer);
          wakers.delete(check);
          resolve(data);
        };
        const timer = setTimeout(() => {
          wakers.delete(check);
          resolve(data);
        }, 5000);
        wakers.add(check);
        check();
      });
    },
  };
}

/** Splits a raw HTTP response into status, lower-cased headers and the bytes after the head. */
function parseRaw(data: Buffer) {
  const end = data.indexOf('\r\n\r\n');
  if (end < 0) return { status: 0, headers: {} as Record<string, string>, rest: data };
  const [statusLine, ...lines] = data.subarray(0, end).toString('latin1').split('\r\n');
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const colon = line.indexOf(':');
    headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  return { status: Number(statusLine!.split(' ')[1]), headers, rest: data.subarray(end + 4) };
}

/** Sends an upgrade request (Upgrade: `protocol`) through the front, raw. */
async function openUpgrade(
  options: {
    headers?: Record<string, string>;
    early?: string;
    protocol?: string;
    port?: number;
  } = {},
) {
  const socket = net.connect(options.port ?? front.port, LOOPBACK);
  const reader = received(socket);
  await new Promise((resolve) => socket.once('connect', resolve));
  const extra = Object.entries(options.headers ?? {})
    .map(([name, value]) => `${name}: ${value}\r\n`)
    .join('');
  socket.write(
    `GET /ws?room=1 HTTP/1.1\r\nHost: ${originalHost(target.port)}\r\nConnection: Upgrade\r\n` +
      `Upgrade: ${options.protocol ?? 'echo'}\r\n${extra}\r\n${options.early ?? ''}`,
  );
  return { socket, reader };
}

/** Reads an upgrade's 101 and the origin's JSON line. */
async function upgraded(reader: ReturnType<typeof received>) {
  const data = await reader.until((d) => {
    const end = d.indexOf('\r\n\r\n');
    return end >= 0 && d.indexOf('\n', end + 4) >= 0;
  });
  const { status, headers, rest } = parseRaw(data);
  const newline = rest.indexOf('\n');
  return {
    status,
    headers,
    seen: JSON.parse(rest.subarray(0, newline).toString('utf8')) as Seen,
    consumed: data.length - rest.length + newline + 1,
  };
}

beforeAll(async () => {
  origin = await startHttpOrigin();
  upgrades = await startUpgradeOrigin();
  const logger = pino({ level: 'debug' }, { write: (line: string) => void logLines.push(line) });
  ingress = new IngressProxy({
    logger,
    flows: testFlows(logger),
    connectTimeoutMs: CONNECT_TIMEOUT_MS,
    idleTimeoutMs: IDLE_TIMEOUT_MS,
  });
  front = await startFront(ingress, () => target);
});

afterAll(async () => {
  ingress.close();
  await Promise.all([shut(front.server), shut(origin.server), shut(upgrades.server)]);
});

beforeEach(() => aim());

describe('HTTP requests', () => {
  it('forwards the method, path and query', async () => {
    const seen = await echoed({ method: 'DELETE', path: '/items/7?force=1&x=%20' });
    expect(seen.method).toBe('DELETE');
    expect(seen.url).toBe('/items/7?force=1&x=%20');
    expect(seen.bodyLength).toBe(0);
  });

  it('streams a 5 MiB request body with its Content-Length', async () => {
    const body = randomBytes(5 * MiB);
    const seen = await echoed({ method: 'POST', path: '/upload', body });
    expect(seen.headers['content-length']).toBe(String(5 * MiB));
    expect(seen.bodyLength).toBe(5 * MiB);
    expect(seen.bodySha256).toBe(sha256(body));
  });

  it('streams a request body of unknown length as chunked', async () => {
    const body = randomBytes(MiB + 123);
    const seen = await echoed({
      method: 'PUT',
      path: '/upload',
      body: Readable.from(chunks(body, 10_000)),
    });
    expect(seen.headers['transfer-encoding']).toBe('chunked');
    expect(seen.headers['content-length']).toBeUndefined();
    expect(seen.bodyLength).toBe(body.length);
    expect(seen.bodySha256).toBe(sha256(body));
  });

  it('streams a 5 MiB response body', async () => {
    const reply = await send({ path: `/download?bytes=${5 * MiB}` });
    expect(reply.status).toBe(200);
    expect(reply.body.length).toBe(5 * MiB);
    expect(sha256(reply.body)).toBe(sha256(pattern(5 * MiB)));
  });

  it('holds a fast origin back while the client does not read (backpressure)', async () => {
    const exchange = origin.next('/flood');
    const req = http.request({
      host: LOOPBACK,
      port: front.port,
      path: '/flood',
      headers: { host: originalHost(origin.port) },
      agent: false,
    });
    req.on('error', () => {});
    const res = await new Promise<IncomingMessage>((resolve) => req.on('response', resolve).end());
    res.on('error', () => {});
    res.pause();
    await sleep(500);
    // Socket buffers on two loopback hops hold some MiB; without backpressure all of it goes.
    expect(origin.flooded).toBeLessThan(kernelBufferedMax(2) + 4 * MiB);
    const originRes = (await exchange).res;
    req.destroy();
    expect(await closing(originRes)).toBe(false);
  });

  it('forwards end-to-end headers and drops hop-by-hop ones', async () => {
    const seen = await echoed({
      method: 'POST',
      headers: {
        'X-Custom': 'yes',
        Connection: 'keep-alive, X-Hop',
        'X-Hop': 'named by Connection',
        'Keep-Alive': 'timeout=5',
        TE: 'trailers',
        Trailer: 'X-Checksum',
        Upgrade: 'h2c',
        'Proxy-Authorization': 'Basic eDp5',
        'Proxy-Foo': 'bar',
        // Read as Transfer-Encoding by a service that folds "_" into "-".
        Transfer_Encoding: 'chunked',
        Keep_Alive: 'timeout=5',
        X_Custom_Key: 'kept',
        Cookie: 'a=1',
      },
      // Node's client sends Trailer only with a chunked body.
      body: Readable.from([Buffer.from('body')]),
    });
    expect(seen.headers['x-custom']).toBe('yes');
    expect(seen.headers.cookie).toBe('a=1');
    expect(seen.headers.x_custom_key).toBe('kept');
    for (const name of [
      'transfer_encoding',
      'keep_alive',
      'x-hop',
      'keep-alive',
      'te',
      'trailer',
      'upgrade',
      'proxy-authorization',
      'proxy-foo',
    ])
      expect(seen.headers[name], name).toBeUndefined();
    // The proxy's own connection header, not the client's list.
    expect(seen.headers.connection).toBe('keep-alive');
  });

  it('drops hop-by-hop headers of the response', async () => {
    const reply = await send({ path: '/hop-response' });
    expect(reply.status).toBe(200);
    expect(reply.body.toString()).toBe('ok');
    expect(reply.headers['x-end-to-end']).toBe('kept');
    expect(reply.headers['x-hop-response']).toBeUndefined();
    expect(reply.headers['proxy-authenticate']).toBeUndefined();
    expect(reply.headers['keep-alive']).not.toBe('timeout=99');
  });

  it.each<{ name: string; given: Record<string, string>; forwardedFor: string }>([
    { name: 'no forwarding headers', given: {}, forwardedFor: LOOPBACK },
    {
      name: 'forwarding headers from an earlier hop',
      given: {
        'X-Forwarded-For': '203.0.113.7',
        'X-Forwarded-Host': 'spoofed.example',
        'X-Forwarded-Proto': 'https',
      },
      forwardedFor: `203.0.113.7, ${LOOPBACK}`,
    },
  ])('sets X-Forwarded-* and keeps the Host without a mask ($name)', async (row) => {
    const seen = await echoed({ headers: row.given });
    expect(seen.headers.host).toBe(originalHost(origin.port));
    expect(seen.headers['x-forwarded-host']).toBe(originalHost(origin.port));
    expect(seen.headers['x-forwarded-proto']).toBe('http');
    expect(seen.headers['x-forwarded-for']).toBe(row.forwardedFor);
  });

  it.each([
    { mask: 'localhost:${PORT}', host: (port: number) => `localhost:${port}` },
    {
      mask: '${PORT}.app.internal:${PORT}',
      host: (port: number) => `${port}.app.internal:${port}`,
    },
    { mask: 'app.internal', host: () => 'app.internal' },
  ])('maskRequestHost $mask becomes the upstream Host', async ({ mask, host }) => {
    aim({ maskRequestHost: mask });
    const seen = await echoed();
    expect(seen.headers.host).toBe(host(origin.port));
    expect(seen.headers['x-forwarded-host']).toBe(originalHost(origin.port));
  });

  it('writes header names in canonical case (Host:, X-Forwarded-For:), as read off the wire', async () => {
    // A raw socket origin: what it reads is exactly what the proxy wrote.
    let head = '';
    const raw = net.createServer((socket) => {
      socket.setEncoding('latin1');
      socket.on('data', (chunk: string) => {
        head += chunk;
        if (head.includes('\r\n\r\n'))
          socket.end('HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok');
      });
    });
    try {
      aim({ port: await listen(raw) });
      const reply = await send({ headers: { 'x-custom-name': 'v', 'E2B-ODD-case': 'w' } });
      expect(reply.body.toString()).toBe('ok');
      const names = head
        .split('\r\n')
        .slice(1, -2)
        .map((line) => line.split(':')[0]);
      expect(names).toContain('Host');
      expect(names).toEqual(
        expect.arrayContaining([
          'X-Custom-Name',
          'E2b-Odd-Case',
          'X-Forwarded-For',
          'X-Forwarded-Host',
        ]),
      );
      for (const name of names) expect(name).toMatch(/^([A-Z0-9][a-z0-9]*)(-[A-Z0-9][a-z0-9]*)*$/);
    } finally {
      raw.close();
    }
  });

  it('keeps upstream connections alive between requests', async () => {
    const first = await echoed();
    const second = await echoed();
    expect(second.remotePort).toBe(first.remotePort);
  });

  it('closes pooled upstream connections that idle for idleTimeoutMs', async () => {
    const exchange = origin.next('/idle');
    await echoed({ path: '/idle' });
    const { req } = await exchange;
    const closed = new Promise<number>((resolve) => {
      const started = performance.now();
      req.socket.once('close', () => resolve(performance.now() - started));
    });
    // Node's origin would keep it 5 s (its keepAliveTimeout): the proxy closes it first.
    const after = await Promise.race([closed, sleep(3000).then(() => Infinity)]);
    expect(after).toBeLessThan(IDLE_TIMEOUT_MS + 1000);
  });
});

describe('traffic access token', () => {
  const forbidden = (reply: Reply) => {
    expect(reply.status).toBe(403);
    expect(reply.headers['content-type']).toBe('application/json');
    const body = json(reply);
    expect(body).toEqual({ message: expect.any(String), code: 403, sandboxID: SANDBOX });
    expect(body.message).toContain('traffic access token');
  };

  it.each<{ name: string; headers: Record<string, string> }>([
    { name: 'missing', headers: {} },
    { name: 'wrong', headers: { 'e2b-traffic-access-token': 'nope' } },
    {
      name: 'wrong, same length',
      headers: { 'e2b-traffic-access-token': TOKEN.replace('a', 'b') },
    },
    { name: 'the token with a suffix', headers: { 'e2b-traffic-access-token': `${TOKEN}x` } },
    { name: 'empty', headers: { 'e2b-traffic-access-token': '' } },
  ])('refuses a $name token with 403 and never reaches the sandbox', async ({ headers }) => {
    aim({ trafficToken: TOKEN });
    const before = origin.requests.length;
    forbidden(await send({ method: 'POST', headers, body: Buffer.from('payload') }));
    expect(origin.requests.length).toBe(before);
  });

  it('lets the right token through and does not forward it', async () => {
    aim({ trafficToken: TOKEN });
    const seen = await echoed({ headers: { 'E2B-Traffic-Access-Token': TOKEN } });
    expect(seen.headers['e2b-traffic-access-token']).toBeUndefined();
  });

  it('does not forward the header when no token is required', async () => {
    const seen = await echoed({ headers: { 'e2b-traffic-access-token': TOKEN } });
    expect(seen.headers['e2b-traffic-access-token']).toBeUndefined();
  });

  it('logs with the sandboxID on every line and never the token', async () => {
    logLines.length = 0;
    aim({ trafficToken: TOKEN });
    await send({ headers: { 'e2b-traffic-access-token': TOKEN } });
    await send({ headers: { 'e2b-traffic-access-token': `${TOKEN}-wrong` } });
    aim({ trafficToken: TOKEN, port: await closedPort() });
    await send({ headers: { 'e2b-traffic-access-token': TOKEN } });
    expect(logLines.length).toBeGreaterThanOrEqual(3);
    for (const line of logLines) {
      expect(JSON.parse(line).sandboxID).toBe(SANDBOX);
      expect(line).not.toContain(TOKEN);
    }
  });
});

describe('upstream failures', () => {
  const failed = (reply: Reply, status: number, message: string | RegExp) => {
    expect(reply.status).toBe(status);
    expect(reply.headers['content-type']).toBe('application/json');
    expect(json(reply)).toEqual({
      message: typeof message === 'string' ? message : expect.stringMatching(message),
      code: status,
      sandboxID: SANDBOX,
    });
  };

  it('answers 502 naming the port when nothing listens on it', async () => {
    const port = await closedPort();
    aim({ port });
    failed(await send(), 502, notListening(port));
  });

  it('answers 504 when the port does not accept the connection in time', async () => {
    const hung = await unacceptingPort();
    try {
      aim({ port: hung.port });
      const started = performance.now();
      const reply = await send();
      const took = performance.now() - started;
      failed(
        reply,
        504,
        `port ${hung.port} of sandbox ${SANDBOX} did not accept a connection within ${CONNECT_TIMEOUT_MS} ms`,
      );
      expect(took).toBeGreaterThanOrEqual(CONNECT_TIMEOUT_MS - 20);
      expect(took).toBeLessThan(CONNECT_TIMEOUT_MS + 1500);
    } finally {
      hung.stop();
    }
  });

  it('answers 504 when the service accepts but sends no response head', async () => {
    const exchange = origin.next('/silent');
    const reply = await send({ path: '/silent' });
    failed(
      reply,
      504,
      `port ${origin.port} of sandbox ${SANDBOX} sent no response within ${IDLE_TIMEOUT_MS} ms`,
    );
    // The silent upstream request was given up, not left open.
    expect(await closing((await exchange).req)).toBe(true);
    expect((await exchange).req.socket.destroyed).toBe(true);
  });

  it('cuts the client off when the service dies mid-response', async () => {
    const outcome = await new Promise<{ status: number; complete: boolean }>((resolve) => {
      const req = http.request({
        host: LOOPBACK,
        port: front.port,
        path: '/die',
        headers: { host: originalHost(origin.port) },
        agent: false,
      });
      req.on('error', () => {});
      req.on('response', (res) => {
        res.on('error', () => {});
        res.resume();
        res.on('close', () => resolve({ status: res.statusCode ?? 0, complete: res.complete }));
      });
      req.end();
    });
    expect(outcome).toEqual({ status: 200, complete: false });
    expect((await echoed()).method).toBe('GET');
  });

  it('frees the upstream when the client disconnects mid-response', async () => {
    const exchange = origin.next('/stream');
    const req = http.request({
      host: LOOPBACK,
      port: front.port,
      path: '/stream',
      headers: { host: originalHost(origin.port) },
      agent: false,
    });
    req.on('error', () => {});
    const res = await new Promise<IncomingMessage>((resolve) => req.on('response', resolve).end());
    res.on('error', () => {});
    await new Promise((resolve) => res.once('data', resolve));
    const originRes = (await exchange).res;
    req.destroy();
    expect(await closing(originRes)).toBe(false);
    expect(originRes.socket?.destroyed ?? true).toBe(true);
    expect((await echoed()).method).toBe('GET');
  });

  it('frees the upstream when the client disconnects mid-upload', async () => {
    const exchange = origin.next('/partial');
    const req = http.request({
      host: LOOPBACK,
      port: front.port,
      method: 'POST',
      path: '/partial',
      headers: { host: originalHost(origin.port), 'content-length': String(10 * MiB) },
      agent: false,
    });
    req.on('error', () => {});
    req.write(Buffer.alloc(MiB, 1));
    const originReq = (await exchange).req;
    req.destroy();
    expect(await closing(originReq)).toBe(false);
    expect((await echoed()).method).toBe('GET');
  });
});

describe('upgrades', () => {
  it('relays the 101 and carries bytes both ways, with token, mask and forwarding headers', async () => {
    aim({ port: upgrades.port, trafficToken: TOKEN, maskRequestHost: 'localhost:${PORT}' });
    const { socket, reader } = await openUpgrade({
      headers: { 'e2b-traffic-access-token': TOKEN, 'Keep-Alive': 'timeout=1', 'X-App': 'a' },
      early: 'early',
    });
    const { status, headers, seen, consumed } = await upgraded(reader);
    expect(status).toBe(101);
    expect(headers.upgrade).toBe('echo');
    expect(headers.connection).toBe('Upgrade');
    expect(headers['x-origin']).toBe('upgraded');
    expect(seen.url).toBe('/ws?room=1');
    expect(seen.headers).toMatchObject({
      host: `localhost:${upgrades.port}`,
      connection: 'Upgrade',
      upgrade: 'echo',
      'x-app': 'a',
      'x-forwarded-host': originalHost(upgrades.port),
      'x-forwarded-proto': 'http',
      'x-forwarded-for': LOOPBACK,
    });
    expect(seen.headers['e2b-traffic-access-token']).toBeUndefined();
    expect(seen.headers['keep-alive']).toBeUndefined();

    // The bytes that followed the request head went up after the upgrade and came back.
    const early = await reader.until((d) => d.length >= consumed + 5);
    expect(early.subarray(consumed, consumed + 5).toString()).toBe('early');

    const payload = randomBytes(MiB);
    const start = consumed + 5;
    socket.write(payload);
    const echoedBack = await reader.until((d) => d.length >= start + payload.length);
    expect(sha256(echoedBack.subarray(start))).toBe(sha256(payload));

    // The client leaving closes the sandbox side.
    const upstreamSide = upgrades.sockets.at(-1)!;
    socket.destroy();
    await new Promise((resolve) =>
      upstreamSide.destroyed ? resolve(null) : upstreamSide.once('close', resolve),
    );
    expect(upstreamSide.destroyed).toBe(true);
  });

  it.each<{ name: string; headers: Record<string, string> }>([
    { name: 'no token', headers: {} },
    { name: 'a wrong token', headers: { 'e2b-traffic-access-token': TOKEN.toUpperCase() } },
  ])('refuses an upgrade with $name with 403 and closes', async ({ headers }) => {
    aim({ port: upgrades.port, trafficToken: TOKEN });
    const before = upgrades.sockets.length;
    const { reader } = await openUpgrade({ headers });
    const { status, headers: head, rest } = parseRaw(await reader.until(() => false));
    expect(reader.closed).toBe(true);
    expect(status).toBe(403);
    expect(head['content-type']).toBe('application/json');
    expect(JSON.parse(rest.toString())).toEqual({
      message: expect.stringContaining('traffic access token'),
      code: 403,
      sandboxID: SANDBOX,
    });
    expect(upgrades.sockets.length).toBe(before);
  });

  it('answers 502 to an upgrade for a port nothing listens on', async () => {
    const port = await closedPort();
    aim({ port });
    const { reader } = await openUpgrade();
    const { status, rest } = parseRaw(await reader.until(() => false));
    expect(reader.closed).toBe(true);
    expect(status).toBe(502);
    expect(JSON.parse(rest.toString())).toEqual({
      message: notListening(port),
      code: 502,
      sandboxID: SANDBOX,
    });
  });

  it('relays a declined upgrade as it came, then closes', async () => {
    aim({ port: upgrades.port });
    const { reader } = await openUpgrade({ protocol: 'refuse' });
    const { status, headers, rest } = parseRaw(await reader.until(() => false));
    expect(reader.closed).toBe(true);
    expect(status).toBe(426);
    expect(headers['content-type']).toBe('text/plain');
    expect(rest.toString()).toBe('refused');
  });
  it('frees a declined upgrade whose client sends more and then closes', async () => {
    aim({ port: upgrades.port });
    const connections = () =>
      new Promise<number>((resolve, reject) =>
        front.server.getConnections((error, count) => (error ? reject(error) : resolve(count))),
      );
    const settled = Date.now() + 2000;
    while ((await connections()) > 0 && Date.now() < settled)
      await new Promise((resolve) => setTimeout(resolve, 20));
    const before = await connections();
    const socket = net.connect({ host: LOOPBACK, port: front.port, allowHalfOpen: true });
    const reader = received(socket);
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.write(
      `GET /ws HTTP/1.1\r\nHost: ${originalHost(target.port)}\r\nConnection: Upgrade\r\n` +
        'Upgrade: refuse\r\n\r\n',
    );
    await reader.until((data) => data.includes('refused'));
    // Nobody reads an upgrade socket: these bytes must not keep its FIN from being seen.
    socket.end('more bytes');
    const deadline = Date.now() + 2000;
    while ((await connections()) > before && Date.now() < deadline)
      await new Promise((resolve) => setTimeout(resolve, 20));
    expect(await connections()).toBe(before);
  });
});

describe('close', () => {
  it('closes pooled upstream connections and open upgraded connections', async () => {
    const own = new IngressProxy({
      logger: pino({ level: 'silent' }),
      flows: testFlows(pino({ level: 'silent' })),
      connectTimeoutMs: CONNECT_TIMEOUT_MS,
      idleTimeoutMs: 30_000,
    });
    let ownTarget = target;
    const ownFront = await startFront(own, () => ownTarget);
    try {
      const exchange = origin.next('/pooled');
      expect((await echoed({ path: '/pooled', port: ownFront.port })).method).toBe('GET');
      const pooled = (await exchange).req.socket;
      ownTarget = { ...target, port: upgrades.port };
      const { reader } = await openUpgrade({ port: ownFront.port });
      expect((await upgraded(reader)).status).toBe(101);
      expect(pooled.destroyed).toBe(false);

      own.close();
      await reader.until(() => false);
      expect(reader.closed).toBe(true);
      await new Promise((resolve) =>
        pooled.destroyed ? resolve(null) : pooled.once('close', resolve),
      );
      expect(pooled.destroyed).toBe(true);
    } finally {
      own.close();
      await shut(ownFront.server);
    }
  });
});
