/**
 * `network.egressProxy` and `network.httpsPorts` on the platform API: what is refused (and the
 * field each message names), what GET shows (never the password), that PUT replaces and clears,
 * and, in proxy mode, a CONNECT tunnelled through a SOCKS5 server on loopback, or refused with a
 * 502 when the login is wrong. No log line ever holds the password.
 */
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RunningMoat, startMoat } from '../../src/app/index.js';
import { ApiClient, expectError, testMoatConfig } from '../support/api-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { connectThrough } from '../support/origins.js';
import { REDIS_PORT, redisProblem } from '../support/redis.js';
import { SocksServer } from '../support/socks5-server.js';

const PASSWORD = 'pw-4d1c-never-shown';
const LOGIN = { username: 'operator', password: PASSWORD };

let moat: RunningMoat;
let api: ApiClient;
let upstream: FakeDns;
let scratch: { remove(): void };
let origin: net.Server;
let socks: SocksServer;
const logLines: string[] = [];

beforeAll(async () => {
  origin = net.createServer((socket) => {
    socket.on('error', () => socket.destroy());
    socket.pipe(socket);
  });
  await new Promise<void>((resolve) => origin.listen(0, '127.0.0.1', resolve));
  const originPort = (origin.address() as net.AddressInfo).port;
  socks = await SocksServer.start({
    host: '127.0.0.1',
    credentials: LOGIN,
    names: new Map([['origin.test', '127.0.0.1']]),
  });
  upstream = await new FakeDns(new Map([['origin.test', { A: ['127.0.0.1'] }]])).start();
  const started = testMoatConfig(upstream.port, {
    enforcement: 'proxy',
    // The origin is this host's: its port is opened as an operator would.
    'internal-deny': 'none',
    'allow-host-ports': String(originPort),
    'log-level': 'debug',
  });
  scratch = started.scratch;
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      logLines.push(chunk.toString());
      done();
    },
  });
  moat = await startMoat(started.config, pino({ level: 'debug' }, sink), {
    defaultMetrics: false,
  });
  api = new ApiClient(`http://127.0.0.1:${moat.listening.api.port}`);
});

afterAll(async () => {
  await moat?.stop();
  await upstream?.stop();
  scratch?.remove();
  await socks?.close();
  origin?.close();
});

async function create(network: unknown): Promise<string> {
  const reply = await api.call('POST', '/v2/sandboxes', {
    body: { templateID: 'base', timeout: 120, network },
  });
  expect(reply.status, reply.text).toBe(201);
  return (reply.body as { sandboxID: string }).sandboxID;
}

const networkOf = async (id: string) =>
  ((await api.call('GET', `/sandboxes/${id}`)).body as { network: Record<string, unknown> })
    .network;

describe('validation', () => {
  const bad: [string, unknown, string | RegExp][] = [
    ['no address', { egressProxy: {} }, 'body.network.egressProxy.address is required'],
    [
      'no port',
      { egressProxy: { address: 'proxy.example' } },
      'network.egressProxy.address must be host:port or [ipv6]:port (e.g. proxy.example.com:1080): "proxy.example" has no port',
    ],
    [
      'port 0',
      { egressProxy: { address: 'proxy.example:0' } },
      /^network\.egressProxy\.address .*port "0"/,
    ],
    [
      'port 65536',
      { egressProxy: { address: '198.18.0.1:65536' } },
      /^network\.egressProxy\.address .*port "65536"/,
    ],
    [
      'userinfo',
      { egressProxy: { address: 'u@proxy.example:1080' } },
      /^network\.egressProxy\.address .*userinfo/,
    ],
    [
      'a bad name',
      { egressProxy: { address: 'bad_name!:1080' } },
      /^network\.egressProxy\.address /,
    ],
    [
      'a string',
      { egressProxy: 'proxy.example:1080' },
      'body.network.egressProxy must be object,null',
    ],
    [
      'an unknown field',
      { egressProxy: { address: 'p.example:1080', token: 'x' } },
      'body.network.egressProxy has unknown field "token"',
    ],
    [
      'a password alone',
      { egressProxy: { address: 'p.example:1080', password: PASSWORD } },
      'network.egressProxy.password is only valid together with a username',
    ],
    [
      'an empty username',
      { egressProxy: { address: 'p.example:1080', username: '' } },
      'network.egressProxy.username must be 1 to 255 bytes (it is 0)',
    ],
    [
      'a username of 256 bytes',
      { egressProxy: { address: 'p.example:1080', username: 'é'.repeat(128) } },
      'network.egressProxy.username must be 1 to 255 bytes (it is 256)',
    ],
    [
      'a password of 300 bytes',
      { egressProxy: { address: 'p.example:1080', username: 'u', password: 'p'.repeat(300) } },
      'network.egressProxy.password must be 1 to 255 bytes (it is 300)',
    ],
  ];

  it.each(bad)(
    'refuses an egressProxy with %s, on create and on PUT',
    async (_what, network, message) => {
      const created = await api.call('POST', '/sandboxes', {
        body: { templateID: 'base', network },
      });
      expectError(created, 400, message);
      expect(created.text).not.toContain(PASSWORD);
      const id = await create({});
      const put = await api.call('PUT', `/sandboxes/${id}/network`, {
        body: network as { egressProxy: unknown },
      });
      // The PUT body is the network config itself.
      expectError(
        put,
        400,
        typeof message === 'string' ? message.replace('body.network.', 'body.') : message,
      );
      // Refused: what was there stays.
      expect(await networkOf(id)).toMatchObject({ egressProxy: null });
    },
  );

  it('refuses httpsPorts out of range, not whole numbers, or naming the sandbox API port', async () => {
    const cases: [unknown, string][] = [
      [[0], 'body.network.httpsPorts[0] must be >= 1'],
      [[443, 65536], 'body.network.httpsPorts[1] must be <= 65535'],
      [['443'], 'body.network.httpsPorts[0] must be integer'],
      [[1.5], 'body.network.httpsPorts[0] must be integer'],
      [443, 'body.network.httpsPorts must be array'],
      [
        [8443, 49983],
        'body.network.httpsPorts cannot list 49983: it is the sandbox API\u2019s own port'.replace(
          '\u2019',
          "'",
        ),
      ],
    ];
    for (const [httpsPorts, message] of cases) {
      for (const path of ['/sandboxes', '/v2/sandboxes']) {
        const reply = await api.call('POST', path, {
          body: { templateID: 'base', network: { httpsPorts } },
        });
        expectError(reply, 400, message);
      }
    }
  });
});

describe('what is stored and shown', () => {
  it('shows the address and username, never the password; PUT replaces and {} clears', async () => {
    const id = await create({
      egressProxy: { address: socks.address, ...LOGIN },
      httpsPorts: [8443, 9443],
    });
    expect(await networkOf(id)).toMatchObject({
      egressProxy: { address: socks.address, username: 'operator' },
      httpsPorts: [8443, 9443],
    });
    for (const path of [`/sandboxes/${id}`, '/sandboxes', '/v2/sandboxes']) {
      expect((await api.call('GET', path)).text).not.toContain(PASSWORD);
    }
    expect(moat.table.get(id)!.upstream).toMatchObject({ address: socks.address, ...LOGIN });

    const put = await api.call('PUT', `/sandboxes/${id}/network`, {
      body: { egressProxy: { address: '198.18.0.9:1080' } },
    });
    expect(put.status, put.text).toBe(204);
    expect((await networkOf(id)).egressProxy).toEqual({ address: '198.18.0.9:1080' });
    expect(moat.table.get(id)!.upstream).toMatchObject({ address: '198.18.0.9:1080' });
    expect(moat.table.get(id)!.upstream?.password).toBeUndefined();

    expect((await api.call('PUT', `/sandboxes/${id}/network`, { body: {} })).status).toBe(204);
    expect((await networkOf(id)).egressProxy).toBeNull();
    expect(moat.table.get(id)!.upstream).toBeUndefined();
    // httpsPorts are ingress, not egress: PUT network leaves them.
    expect((await networkOf(id)).httpsPorts).toEqual([8443, 9443]);
  });

  it('takes null as "no proxy"', async () => {
    const id = await create({ egressProxy: null });
    expect(await networkOf(id)).toMatchObject({ egressProxy: null, httpsPorts: [] });
    expect(moat.table.get(id)!.upstream).toBeUndefined();
  });
});

describe('tunnelling in proxy mode', () => {
  const tunnel = async (id: string) => {
    const record = await moat.sandboxes.get(id);
    const originPort = (origin.address() as net.AddressInfo).port;
    return connectThrough(moat.listening.proxy, `origin.test:${originPort}`, {
      auth: `${id}:${record.egressSecret}`,
    });
  };

  it('tunnels a CONNECT through the SOCKS5 server, logged in, by name', async () => {
    const id = await create({ egressProxy: { address: socks.address, ...LOGIN } });
    const { socket, status } = await tunnel(id);
    expect(status).toBe(200);
    // Bytes that cannot begin an HTTP request: the tunnel carries them without waiting for more.
    socket.write('{"ping":1}');
    const echoed = await new Promise<string>((resolve) => {
      socket.once('data', (chunk: Buffer) => resolve(chunk.toString()));
      socket.resume();
    });
    socket.destroy();
    expect(echoed).toBe('{"ping":1}');
    expect(socks.requests.at(-1)).toMatchObject({
      kind: 'domain',
      host: 'origin.test',
      username: 'operator',
    });
  });

  it('keeps open tunnels when a PUT repeats the proxy, closes them when it changes the route', async () => {
    const proxy = { address: socks.address, ...LOGIN };
    const id = await create({ egressProxy: proxy });
    const put = async (body: object) =>
      expect((await api.call('PUT', `/sandboxes/${id}/network`, { body })).status).toBe(204);
    const closed = (socket: net.Socket) =>
      new Promise<boolean>((resolve) => {
        if (socket.destroyed) return resolve(true);
        const timer = setTimeout(() => resolve(false), 500);
        socket.once('close', () => {
          clearTimeout(timer);
          resolve(true);
        });
        socket.resume();
      });
    const kept = await tunnel(id);
    expect(kept.status).toBe(200);
    await put({ egressProxy: { ...proxy } });
    expect(await closed(kept.socket)).toBe(false);
    // Another route: direct (the proxy left out), then another proxy.
    await put({});
    expect(await closed(kept.socket)).toBe(true);
    const direct = await tunnel(id);
    expect(direct.status).toBe(200);
    await put({ egressProxy: proxy });
    expect(await closed(direct.socket)).toBe(true);
  });

  it('refuses with 502 naming the proxy when the login is wrong; the password is in no log', async () => {
    const wrong = `${PASSWORD}-wrong`;
    const id = await create({
      egressProxy: { address: socks.address, username: 'operator', password: wrong },
    });
    const { socket, status, body } = await tunnel(id);
    socket.destroy();
    expect(status).toBe(502);
    expect(body).toContain(`egress proxy ${socks.address}`);
    expect(body).toContain('it rejected the username and password');
    expect(body).not.toContain(wrong);
    expect(socks.refusedLogins).toContain('operator');
    expect(logLines.join('')).toContain('egress failed');
    expect(logLines.join('')).not.toContain(PASSWORD);
  });
});

const redis = await redisProblem();
describe.each([
  ['the file store', undefined],
  ['the Redis store', redis],
] as const)('a restart with %s', (store, problem) => {
  it.skipIf(problem !== undefined)(
    'brings the upstream proxy back, password and all, and keeps it out of GET',
    async () => {
      const dns = await new FakeDns(new Map()).start();
      const flags: Record<string, string> =
        store === 'the Redis store'
          ? {
              store: `redis://127.0.0.1:${REDIS_PORT}`,
              'store-prefix': `moat-test:${randomUUID()}:`,
            }
          : {};
      const { config, scratch: folder } = testMoatConfig(dns.port, flags);
      const quiet = pino({ level: 'silent' });
      let first: RunningMoat | undefined = await startMoat(config, quiet, {
        defaultMetrics: false,
      });
      let second: RunningMoat | undefined;
      try {
        const client = new ApiClient(`http://127.0.0.1:${first.listening.api.port}`);
        const created = await client.call('POST', '/sandboxes', {
          body: {
            templateID: 'base',
            timeout: 120,
            network: { egressProxy: { address: '198.18.0.1:1080', ...LOGIN } },
          },
        });
        expect(created.status, created.text).toBe(201);
        const id = (created.body as { sandboxID: string }).sandboxID;
        await first.stop();
        first = undefined;
        second = await startMoat(config, quiet, { defaultMetrics: false });
        expect(second.table.get(id)?.upstream).toMatchObject({
          address: '198.18.0.1:1080',
          ...LOGIN,
        });
        const again = new ApiClient(`http://127.0.0.1:${second.listening.api.port}`);
        const detail = await again.call('GET', `/sandboxes/${id}`);
        expect((detail.body as { network: unknown }).network).toMatchObject({
          egressProxy: { address: '198.18.0.1:1080', username: 'operator' },
        });
        expect(detail.text).not.toContain(PASSWORD);
        await again.call('DELETE', `/sandboxes/${id}`);
      } finally {
        await first?.stop();
        await second?.stop();
        await dns.stop();
        folder.remove();
      }
    },
  );
});
