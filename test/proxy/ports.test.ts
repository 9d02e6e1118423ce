/**
 * Port-scoped rules and names in denyOut at each door of the proxy, with real sockets: CONNECT,
 * absolute-form HTTP and the transparent listener each decide a destination on its port. The
 * origins are on loopback (an HTTP echo and a TLS echo on their own ports, a TCP echo on a
 * third); names come from a fake DNS zone.
 */
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { type RunningMoat, startMoat } from '../../src/app/index.js';
import {
  compileHostAddresses,
  compileInternalDenyList,
  compilePolicy,
  parseInternalDenyList,
  parseIP,
  parseNetworkConfig,
  type Policy,
} from '../../src/policy/index.js';
import { testMoatConfig } from '../support/api-client.js';
import { FakeDns } from '../support/fake-dns.js';
import {
  connectThrough,
  httpEchoOrigin,
  type Origin,
  readUntil,
  tcpEchoOrigin,
  tlsEchoOrigin,
} from '../support/origins.js';

const SANDBOX = 'iportssandbox00000001';
const SECRET = 'ports-secret';
const SOURCE = '127.77.0.3';
const AUTH = `${SANDBOX}:${SECRET}`;

let upstream: FakeDns;
let web: Origin;
let secure: Origin;
let echo: Origin;
let moat: RunningMoat;
let stopScratch: () => void;

/** The origins are on loopback: the internal deny list here holds 10.0.0.0/8 only. */
const INTERNAL = '10.0.0.0/8';

function policy(config: Record<string, unknown>): Policy {
  const parsed = parseNetworkConfig(config);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
  const internal = parseInternalDenyList(INTERNAL);
  if (!internal.ok) throw new Error(internal.error);
  return compilePolicy(parsed.value, compileInternalDenyList(internal.value));
}

function enforce(config: Record<string, unknown>): void {
  moat.table.remove(SANDBOX);
  const source = parseIP(SOURCE);
  if (!source.ok) throw new Error(source.error);
  moat.table.register(
    SANDBOX,
    { sourceAddress: source.value, egressSecret: SECRET },
    policy(config),
  );
}

beforeAll(async () => {
  web = await httpEchoOrigin('127.0.0.20');
  secure = await tlsEchoOrigin('127.0.0.20');
  echo = await tcpEchoOrigin('127.0.0.20');
  upstream = await new FakeDns(
    new Map([
      ['web.test', { A: ['127.0.0.20'] }],
      ['tls.test', { A: ['127.0.0.20'] }],
      ['db.test', { A: ['127.0.0.20'] }],
      ['evil.test', { A: ['127.0.0.20'] }],
    ]),
  ).start();
  const { config, scratch } = testMoatConfig(upstream.port, {
    'transparent-listen': '127.0.0.1:0',
    'internal-deny': INTERNAL,
  });
  stopScratch = () => scratch.remove();
  moat = await startMoat(config, pino({ level: 'silent' }), {
    defaultMetrics: false,
    // The origins are on this host's loopback: the host is not a destination here.
    hostAddresses: compileHostAddresses([]),
    transparentPorts: { tls: secure.port, http: web.port },
  });
});

afterAll(async () => {
  await moat?.stop();
  stopScratch?.();
  await Promise.all([web?.close(), secure?.close(), echo?.close(), upstream?.stop()]);
});

const connect = (authority: string) =>
  connectThrough(moat.listening.proxy, authority, { auth: AUTH }).then((r) => {
    r.socket.destroy();
    return { status: r.status, body: r.body };
  });

function proxyGet(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({
      ...moat.listening.proxy,
      path: url,
      headers: { 'proxy-authorization': `Basic ${Buffer.from(AUTH).toString('base64')}` },
      agent: false,
    });
    req.on('response', (res) => {
      let body = '';
      res.on('data', (chunk) => (body += chunk));
      res.on('end', () => resolve({ status: res.statusCode!, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('CONNECT and absolute-form decide on the port', () => {
  beforeEach(() =>
    enforce({
      allowOut: [`db.test:${echo.port}`, `web.test:${web.port}`, `127.0.0.20:${secure.port}`],
      denyOut: ['0.0.0.0/0'],
    }),
  );

  it('CONNECT: a name and an address open on their port only', async () => {
    expect((await connect(`db.test:${echo.port}`)).status).toBe(200);
    const otherPort = await connect(`db.test:${web.port}`);
    expect(otherPort.status).toBe(403);
    expect(otherPort.body).toContain('0.0.0.0/0');
    expect((await connect(`127.0.0.20:${secure.port}`)).status).toBe(200);
    expect((await connect(`127.0.0.20:${echo.port}`)).status).toBe(403);
  });

  it('absolute-form: the URL’s port decides, the scheme’s default when it has none', async () => {
    const allowed = await proxyGet(`http://web.test:${web.port}/p`);
    expect(allowed.status).toBe(200);
    expect(allowed.body).toContain('"path":"/p"');
    expect((await proxyGet(`http://db.test:${web.port}/p`)).status).toBe(403);
    // Port 80 by the scheme: not the allowed port.
    expect((await proxyGet('http://web.test/p')).status).toBe(403);
  });
});

describe('names in denyOut at the proxy', () => {
  beforeEach(() => enforce({ denyOut: [`evil.test:${echo.port}`, '*.evil.test'] }));

  it('refuses a name on its denied port, allows its other ports', async () => {
    const denied = await connect(`evil.test:${echo.port}`);
    expect(denied.status).toBe(403);
    expect(denied.body).toContain(`evil.test:${echo.port}`);
    expect((await connect(`evil.test:${web.port}`)).status).toBe(200);
    expect((await connect(`www.evil.test:${web.port}`)).status).toBe(403);
    expect((await proxyGet(`http://evil.test:${web.port}/`)).status).toBe(200);
  });
});

describe('the transparent listener decides the name on the port it serves', () => {
  const toTransparent = () =>
    net.connect({
      host: '127.0.0.1',
      port: moat.listening.transparent!.port,
      localAddress: SOURCE,
    });
  const httpThrough = async (host: string) => {
    const socket = toTransparent();
    socket.on('error', () => {});
    socket.write(`GET /t HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
    const text = await readUntil(socket, (t) => t.includes('}'), 2000);
    socket.destroy();
    return text;
  };
  const tlsThrough = (servername: string) =>
    new Promise<string>((resolve) => {
      const client = tls.connect({
        socket: toTransparent(),
        servername,
        rejectUnauthorized: false,
      });
      client.on('data', (chunk) => {
        client.destroy();
        resolve(String(chunk).trim());
      });
      client.on('error', () => resolve('refused'));
      client.on('close', () => resolve('refused'));
    });

  beforeEach(() =>
    enforce({
      // web.test on the HTTP port only, tls.test on the TLS port only.
      allowOut: [`web.test:${web.port}`, `tls.test:${secure.port}`],
      denyOut: ['0.0.0.0/0'],
    }),
  );

  it('HTTP by its Host header, TLS by its SNI, each on its own port', async () => {
    expect(await httpThrough('web.test')).toContain('"path":"/t"');
    expect(await httpThrough('tls.test')).toBe('');
    expect(await tlsThrough('tls.test')).toBe('sni=tls.test');
    expect(await tlsThrough('web.test')).toBe('refused');
  });
});
