/**
 * Secretless egress: TLS to a destination with a header rule is terminated by Moat, and each
 * request is re-sent over verified TLS with the rule's headers. Attacker first: a sandbox that
 * fronts, sends garbage or stalls, origins Moat must not trust, plain HTTP to a rule's domain;
 * secret values never in logs or flow records.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { Writable } from 'node:stream';
import tls from 'node:tls';
import { promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  type InterceptingProxy,
  startInterceptingProxy,
} from '../../bench/lib/intercepting-proxy.js';
import { type DestinationRules, headerRules } from '../../src/policy/index.js';
import type { HeaderInjection } from '../../src/proxy/index.js';
import { nativeTcpUnavailable } from '../../src/proxy/native-tcp.js';
import { originTrust } from '../../src/proxy/intercept.js';
import { connectThrough, readUntil } from '../support/origins.js';
import { type KeyPair, TestCa } from '../support/test-ca.js';

const run = promisify(execFile);

const SANDBOX = 'iinterceptsandbox0001';
const SECRET = 'egress-secret-intercept';
const SOURCE = '127.77.0.3';
const auth = `${SANDBOX}:${SECRET}`;

/** Secret values: none may ever show in a log line or a flow record. */
const TOKEN = 'tok-5ecret-value-one';
const ROTATED = 'tok-5ecret-value-two';
const API_KEY = 'key-5ecret-value-abc';
const CRLF = 'crlf-5ecret\r\nX-Evil: 1';
const SECRET_VALUES = [TOKEN, ROTATED, API_KEY, 'crlf-5ecret'];

const ORIGINS: Record<string, { ip: string; cert: (origin: TestCa) => KeyPair }> = {
  good: { ip: '127.0.0.31', cert: (ca) => ca.issue(['api.rule.test', '*.rule.test']) },
  expired: { ip: '127.0.0.32', cert: (ca) => ca.issue(['old.rule.test'], { expired: true }) },
  self: { ip: '127.0.0.33', cert: (ca) => ca.selfSigned('self.rule.test') },
  wrong: { ip: '127.0.0.34', cert: (ca) => ca.issue(['elsewhere.test']) },
  plain: { ip: '127.0.0.35', cert: (ca) => ca.issue(['norule.test']) },
};

const NAMES = new Map<string, string[]>([
  ['api.rule.test', ['127.0.0.31']],
  ['ws.rule.test', ['127.0.0.31']],
  ['missing.rule.test', ['127.0.0.31']],
  ['crlf.rule.test', ['127.0.0.31']],
  ['id.rule.test', ['127.0.0.31']],
  ['noallow.rule.test', ['127.0.0.31']],
  ['old.rule.test', ['127.0.0.32']],
  ['self.rule.test', ['127.0.0.33']],
  ['wrong.rule.test', ['127.0.0.34']],
  ['norule.test', ['127.0.0.35']],
]);

const NETWORK = {
  allowOut: [
    'api.rule.test',
    'ws.rule.test',
    'missing.rule.test',
    'crlf.rule.test',
    'id.rule.test',
    'old.rule.test',
    'self.rule.test',
    'wrong.rule.test',
    'norule.test',
  ],
  denyOut: ['0.0.0.0/0'],
};

const RULES: Record<string, DestinationRules> = {
  'api.rule.test': headerRules('api.rule.test', [
    { name: 'Authorization', value: [{ literal: 'Bearer ' }, { secret: 'token' }] },
    { name: 'X-Literal', value: [{ literal: 'lit-1' }] },
  ]),
  'missing.rule.test': headerRules('missing.rule.test', [
    { name: 'X-Api-Key', value: [{ secret: 'absent' }] },
  ]),
  'crlf.rule.test': headerRules('crlf.rule.test', [
    { name: 'X-Api-Key', value: [{ secret: 'crlf' }] },
  ]),
  // A rule stored while identity was on, enforced by a Moat started without --identity-issuer.
  'id.rule.test': headerRules('id.rule.test', [
    { name: 'Authorization', value: [{ literal: 'Bearer ' }, { identity: 'aws' }] },
  ]),
  '*.rule.test': headerRules('*.rule.test', [{ name: 'X-Api-Key', value: [{ secret: 'key' }] }]),
};

interface Echo {
  method: string;
  url: string;
  rawHeaders: string[];
  body: string;
}

/** Response heads that do not parse, each carrying the credential the origin was sent. */
const malformedAnswers = (credential: string): Record<string, string> => ({
  '/echo-line': `HTTP/1.1 200 OK\r\n${credential}\r\n\r\n`,
  '/echo-length': `HTTP/1.1 200 OK\r\nContent-Length: ${credential}\r\n\r\n`,
  '/echo-status': `HTTP/9 ${credential}\r\n\r\n`,
  '/echo-name-control': `HTTP/1.1 200 OK\r\nX-${credential.replace(' ', '-')}: \u0001\r\n\r\n`,
});

/** The values of one header an origin saw (rawHeaders keeps duplicates and case). */
const seen = (echo: Echo, name: string) =>
  echo.rawHeaders.filter((_, i) => i % 2 === 1 && echo.rawHeaders[i - 1]!.toLowerCase() === name);

describe('TLS interception for header rules', () => {
  const moatCa = new TestCa('moat-test-ca');
  const originCa = new TestCa('origin-test-ca');
  const secrets = new Map<string, string>([
    ['token', TOKEN],
    ['key', API_KEY],
    ['crlf', CRLF],
  ]);
  const logLines: string[] = [];
  const origins: https.Server[] = [];
  let port = 0;
  let moat: InterceptingProxy;
  /** The same, with --redact-secrets-in-responses. */
  let redacting: InterceptingProxy;
  const leaves = new Map<string, tls.SecureContext>();
  const moatInjection: HeaderInjection = {
    transformFor: (sandboxID, name) =>
      sandboxID !== SANDBOX
        ? undefined
        : (RULES[name] ?? (name.endsWith('.rule.test') ? RULES['*.rule.test'] : undefined)),
    leafContext: async (name) => {
      let context = leaves.get(name);
      if (context === undefined)
        leaves.set(name, (context = tls.createSecureContext(moatCa.issue([name]))));
      return context;
    },
    secretValue: async (name) => {
      if (unreadable !== undefined) throw unreadable;
      return secrets.get(name);
    },
    secretValues: async () => {
      if (unreadable !== undefined && !valuesKept) throw unreadable;
      return new Map(secrets);
    },
  };
  /** Set: the secrets cannot be read (a store outage, another node's key)... */
  let unreadable: Error | undefined;
  /** ...but the leak guard's decrypted copies were kept from before. */
  let valuesKept = false;

  beforeAll(async () => {
    for (const origin of Object.values(ORIGINS)) {
      const server = https.createServer(origin.cert(originCa), (req, res) => {
        const chunks: Buffer[] = [];
        req.on('data', (chunk: Buffer) => chunks.push(chunk));
        req.on('end', () => {
          if (req.url === '/204') return void res.writeHead(204).end();
          // An echo that ignores Accept-Encoding and compresses anyway.
          if (req.url === '/gzip')
            return void res.writeHead(200, { 'content-encoding': 'gzip' }).end(gzipSync('{}'));
          // The credential back in a response header, and in a body written in two pieces.
          if (req.url === '/echo-header') {
            res.writeHead(200, { 'x-echo': req.headers.authorization ?? '' });
            res.write(`{"seen":"${req.headers.authorization ?? ''}`);
            return void setTimeout(() => res.end('"}'), 10);
          }
          // The credential back in a response header's name, in another case.
          if (req.url === '/echo-name') {
            const credential = (req.headers.authorization ?? '').split(' ')[1] ?? 'none';
            res.setHeader(`X-Bearer-${credential.toUpperCase()}`, '1');
            return void res.end('named');
          }
          // The credential back inside a response head that does not parse: as a header line
          // without a colon, as a Content-Length, as a status line, as a header name.
          const malformed = malformedAnswers(req.headers.authorization ?? '')[req.url!];
          if (malformed !== undefined) return void req.socket.end(malformed);
          if (req.url === '/echo-coding') {
            const credential = (req.headers.authorization ?? '').split(' ')[1] ?? 'none';
            return void res.writeHead(200, { 'content-encoding': credential }).end('{}');
          }
          // The body back in pieces, with no length: chunked.
          if (req.url === '/chunked') {
            const body = Buffer.concat(chunks);
            res.write(body.subarray(0, body.length >> 1));
            return void setTimeout(() => res.end(body.subarray(body.length >> 1)), 10);
          }
          const echo: Echo = {
            method: req.method!,
            url: req.url!,
            rawHeaders: req.rawHeaders,
            body: Buffer.concat(chunks).toString('latin1'),
          };
          const text = JSON.stringify(echo);
          res.writeHead(200, {
            'content-type': 'application/json',
            'content-length': Buffer.byteLength(text),
          });
          res.end(text);
        });
      });
      server.on('upgrade', (req, socket: net.Socket) => {
        // Any switch agreed to, without proving it read the handshake, and the request echoed.
        if (req.url === '/echo-upgrade') {
          socket.write(
            `HTTP/1.1 101 Switching Protocols\r\nUpgrade: ${req.headers.upgrade}\r\nConnection: Upgrade\r\n\r\n`,
          );
          return void socket.end(JSON.stringify(req.rawHeaders));
        }
        const accept = createHash('sha1')
          .update(`${req.headers['sec-websocket-key']}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`)
          .digest('base64');
        socket.write(
          'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
            `Sec-WebSocket-Accept: ${accept}\r\nX-Key-Seen: ${req.headers['x-api-key'] === API_KEY}\r\n\r\n`,
        );
        socket.on('data', (data) => socket.write(data));
      });
      await new Promise<void>((resolve) => server.listen(port, origin.ip, resolve));
      port = (server.address() as net.AddressInfo).port;
      origins.push(server);
    }
    const proxyOptions = {
      names: NAMES,
      upstreamCa: originCa.cert,
      transparentPorts: { tls: port, http: port },
      handshakeTimeoutMs: 1000,
      injection: moatInjection,
    };
    redacting = await startInterceptingProxy({ ...proxyOptions, redactSecretsInResponses: true });
    moat = await startInterceptingProxy({
      ...proxyOptions,
      logger: pino(
        { level: 'debug' },
        new Writable({
          write(chunk: Buffer, _encoding, done) {
            logLines.push(chunk.toString());
            done();
          },
        }),
      ),
    });
  }, 60_000);

  afterAll(async () => {
    await moat?.close();
    await redacting?.close();
    await Promise.all(origins.map((s) => new Promise((resolve) => s.close(resolve))));
    moatCa.remove();
    originCa.remove();
  });

  beforeEach(() => {
    moat.register(SANDBOX, SECRET, SOURCE, NETWORK);
    redacting.register(SANDBOX, SECRET, SOURCE, NETWORK);
    secrets.set('token', TOKEN);
    unreadable = undefined;
    valuesKept = false;
  });

  const curlProxy = (url: string, ...args: string[]) => curlThrough(moat, url, ...args);
  const curlThrough = (proxy: InterceptingProxy, url: string, ...args: string[]) =>
    run(
      'curl',
      [
        '-sS',
        '--max-time',
        '10',
        '--proxy',
        `http://${proxy.proxy.host}:${proxy.proxy.port}`,
        '--proxy-user',
        auth,
        '--cacert',
        moatCa.certFile(),
        ...args,
        url,
      ],
      { timeout: 15_000 },
    );

  /** A TLS connection to `name` through a CONNECT tunnel, trusting `ca`. */
  async function tunnelTls(name: string, ca: string, through = moat): Promise<tls.TLSSocket> {
    const { socket, status } = await connectThrough(through.proxy, `${name}:${port}`, { auth });
    expect(status).toBe(200);
    return new Promise((resolve, reject) => {
      const secure = tls.connect({ socket, servername: name, ca, ALPNProtocols: ['http/1.1'] });
      secure.once('secureConnect', () => resolve(secure));
      secure.once('error', reject);
    });
  }

  /** Sends raw request text on a connection; resolves the response head and body. */
  async function exchange(socket: net.Socket, text: string | Buffer, bodyless = false) {
    socket.write(text);
    let head = '';
    const whole = (all: string) => {
      const end = all.indexOf('\r\n\r\n');
      if (end < 0) return false;
      head = all.slice(0, end);
      const length = bodyless ? 0 : Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
      return all.length >= end + 4 + length;
    };
    const all = await readUntil(socket, whole);
    socket.pause();
    const status = Number(head.split(' ')[1] ?? 0);
    return { status, head, body: all.slice(head.length + 4) };
  }

  const get = (host: string, extra = '') =>
    `GET /path?q=1 HTTP/1.1\r\nHost: ${host}\r\n${extra}\r\n`;

  it('injects literal and secret headers through CONNECT (curl), replacing any the client sent in another case', async () => {
    const { stdout } = await curlProxy(
      `https://api.rule.test:${port}/hello`,
      '-H',
      'authorization: from-the-sandbox',
      '-H',
      'x-literal: mine',
    );
    const echo = JSON.parse(stdout) as Echo;
    expect(echo.url).toBe('/hello');
    expect(seen(echo, 'authorization')).toEqual([`Bearer ${TOKEN}`]);
    expect(seen(echo, 'x-literal')).toEqual(['lit-1']);
  });

  it('injects through the transparent listener (curl from the sandbox source address)', async () => {
    const { stdout } = await run(
      'curl',
      [
        '-sS',
        '--max-time',
        '10',
        '--interface',
        SOURCE,
        '--connect-to',
        `ws.rule.test:${port}:127.0.0.1:${moat.transparent.port}`,
        '--cacert',
        moatCa.certFile(),
        `https://ws.rule.test:${port}/t`,
      ],
      { timeout: 15_000 },
    );
    const echo = JSON.parse(stdout) as Echo;
    expect(seen(echo, 'x-api-key')).toEqual([API_KEY]);
  });

  it('keeps a connection alive for 3 requests; a secret changed after the 2nd applies to the 3rd', async () => {
    const socket = await tunnelTls('api.rule.test', moatCa.cert);
    const values: string[][] = [];
    for (let i = 0; i < 3; i++) {
      if (i === 2) secrets.set('token', ROTATED);
      const reply = await exchange(socket, get('api.rule.test'));
      expect(reply.status).toBe(200);
      values.push(seen(JSON.parse(reply.body) as Echo, 'authorization'));
    }
    expect(values).toEqual([[`Bearer ${TOKEN}`], [`Bearer ${TOKEN}`], [`Bearer ${ROTATED}`]]);
    expect(socket.destroyed).toBe(false);
    socket.destroy();
  });

  it('relays HEAD and 204 answers (no body) and keeps the connection in step', async () => {
    const socket = await tunnelTls('api.rule.test', moatCa.cert);
    const head = await exchange(socket, get('api.rule.test').replace('GET', 'HEAD'), true);
    expect(head.status).toBe(200);
    expect(head.head).toMatch(/content-length: \d+/i);
    expect(head.body).toBe('');
    const empty = await exchange(socket, 'GET /204 HTTP/1.1\r\nHost: api.rule.test\r\n\r\n', true);
    expect(empty.status).toBe(204);
    const after = await exchange(socket, get('api.rule.test'));
    expect(seen(JSON.parse(after.body) as Echo, 'authorization')).toEqual([`Bearer ${TOKEN}`]);
    socket.destroy();
  });

  it('leaves a flow without a rule an opaque tunnel: the client sees the origin certificate', async () => {
    const socket = await tunnelTls('norule.test', originCa.cert);
    expect(socket.getPeerCertificate().issuer.CN).toBe('origin-test-ca');
    const reply = await exchange(socket, get('norule.test', 'X-Api-Key: sandbox-own\r\n'));
    expect(seen(JSON.parse(reply.body) as Echo, 'x-api-key')).toEqual(['sandbox-own']);
    socket.destroy();
  });

  it('serves a Moat leaf (not the origin certificate) where a rule applies', async () => {
    const socket = await tunnelTls('api.rule.test', moatCa.cert);
    expect(socket.getPeerCertificate().issuer.CN).toBe('moat-test-ca');
    expect(socket.alpnProtocol).toBe('http/1.1');
    socket.destroy();
  });

  it('closes an intercepted connection when a policy change denies its destination', async () => {
    const socket = await tunnelTls('api.rule.test', moatCa.cert);
    expect((await exchange(socket, get('api.rule.test'))).status).toBe(200);
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    socket.resume();
    moat.publish(SANDBOX, { allowOut: ['norule.test'], denyOut: ['0.0.0.0/0'] });
    await closed;
    const denied = moat.flows
      .query({ sandboxID: SANDBOX }, 100)
      .find((r) => r.event === 'close' && r.ruleKey === 'api.rule.test');
    expect(denied?.end).toBe('policy');
  });

  it('intercepts a CONNECT that arrives on the native relay (handed to Node)', async () => {
    const native = await startInterceptingProxy({
      names: NAMES,
      upstreamCa: originCa.cert,
      transparentPorts: { tls: port, http: port },
      tcpIo: 'auto',
      injection: moatInjection,
    });
    const why = nativeTcpUnavailable();
    if (why !== undefined) console.warn(`CONNECT arrives on Node's sockets here: ${why}`);
    try {
      native.register(SANDBOX, SECRET, SOURCE, NETWORK);
      const { stdout } = await run(
        'curl',
        [
          '-sS',
          '--max-time',
          '10',
          '--proxy',
          `http://${native.proxy.host}:${native.proxy.port}`,
          '--proxy-user',
          auth,
          '--cacert',
          moatCa.certFile(),
          `https://api.rule.test:${port}/native`,
        ],
        { timeout: 15_000 },
      );
      expect(seen(JSON.parse(stdout) as Echo, 'authorization')).toEqual([`Bearer ${TOKEN}`]);
    } finally {
      await native.close();
    }
  });

  it('refuses an upstream CA bundle that holds no certificate, or a broken one, naming it', () => {
    expect(() => originTrust('not a certificate')).toThrow('holds no PEM certificate');
    expect(() =>
      originTrust(`${originCa.cert}-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n`),
    ).toThrow('certificate 2 of the upstream CA bundle does not parse');
    expect(() => originTrust(originCa.cert)).not.toThrow();
  });

  it('does not open a destination that has a rule but no allowOut entry', async () => {
    const { status, body } = await connectThrough(moat.proxy, `noallow.rule.test:${port}`, {
      auth,
    });
    expect(status).toBe(403);
    expect(body).toContain('noallow.rule.test');
  });

  it('refuses a request whose Host is not the TLS name (domain fronting) and closes', async () => {
    const socket = await tunnelTls('api.rule.test', moatCa.cert);
    const reply = await exchange(socket, get('norule.test'));
    expect(reply.status).toBe(421);
    expect(reply.body).toContain('domain fronting');
    await readUntil(socket, () => false, 1000);
    expect(socket.readableEnded || socket.destroyed).toBe(true);
  });

  it.each([
    ['expired', 'old.rule.test', 'certificate has expired'],
    ['self-signed', 'self.rule.test', 'self-signed certificate'],
    ['for another name', 'wrong.rule.test', "does not match certificate's altnames"],
  ])('answers 502 naming the reason when the origin certificate is %s', async (_, name, reason) => {
    const socket = await tunnelTls(name, moatCa.cert);
    const reply = await exchange(socket, get(name));
    expect(reply.status).toBe(502);
    expect(reply.body).toContain(reason);
    socket.destroy();
  });

  it('refuses plain HTTP to a rule domain: absolute-form, inside a CONNECT, and transparent port 80', async () => {
    const { stdout } = await run('curl', [
      '-sS',
      '--max-time',
      '10',
      '--proxy',
      `http://${moat.proxy.host}:${moat.proxy.port}`,
      '--proxy-user',
      auth,
      '-w',
      '\\n%{http_code}',
      'http://api.rule.test/',
    ]);
    expect(stdout).toMatch(/403$/);
    expect(stdout).toContain('added over HTTPS only');
    const tunnel = await connectThrough(moat.proxy, `api.rule.test:${port}`, { auth });
    expect(tunnel.status).toBe(200);
    const inTunnel = await exchange(tunnel.socket, get('api.rule.test'));
    expect(inTunnel.status).toBe(403);
    expect(inTunnel.body).toContain('added over HTTPS only');
    tunnel.socket.destroy();
    // Transparent port 80: the request names its host by Host.
    const plain = net.connect({ ...moat.transparent, localAddress: SOURCE });
    const reply = await exchange(plain, get('api.rule.test'));
    expect(reply.status).toBe(403);
    expect(reply.body).toContain('added over HTTPS only');
    plain.destroy();
  });

  it('streams a chunked upload body to the origin', async () => {
    const socket = await tunnelTls('api.rule.test', moatCa.cert);
    const body = 'x'.repeat(70_000);
    const chunked = `${(40_000).toString(16)}\r\n${body.slice(0, 40_000)}\r\n${(30_000).toString(16)}\r\n${body.slice(40_000)}\r\n0\r\n\r\n`;
    const reply = await exchange(
      socket,
      `POST /up HTTP/1.1\r\nHost: api.rule.test\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}`,
    );
    expect(reply.status).toBe(200);
    const echo = JSON.parse(reply.body) as Echo;
    expect(echo.body).toBe(body);
    expect(seen(echo, 'authorization')).toEqual([`Bearer ${TOKEN}`]);
    socket.destroy();
  });

  it('streams a length-framed upload and a chunked answer', async () => {
    const socket = await tunnelTls('api.rule.test', moatCa.cert);
    const body = 'y'.repeat(300_000);
    socket.write(
      `POST /chunked HTTP/1.1\r\nHost: api.rule.test\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    );
    const answer = await readUntil(socket, (text) => text.endsWith('\r\n0\r\n\r\n'), 5000);
    expect(answer).toMatch(/^HTTP\/1\.1 200/);
    expect(answer.toLowerCase()).toContain('transfer-encoding: chunked');
    const payload = answer
      .slice(answer.indexOf('\r\n\r\n') + 4)
      .replace(/(^|\r\n)[0-9a-f]+\r\n/g, '');
    expect(payload.replaceAll('\r\n', '')).toBe(body);
    socket.destroy();
  });

  it('passes a WebSocket upgrade after injecting, then carries its bytes both ways', async () => {
    const socket = await tunnelTls('ws.rule.test', moatCa.cert);
    const reply = await exchange(
      socket,
      get(
        'ws.rule.test',
        'Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n' +
          'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n',
      ),
    );
    expect(reply.status).toBe(101);
    expect(reply.head).toContain('X-Key-Seen: true');
    expect(reply.head).toContain('s3pPLMBiTxaQ9kYGzzhZRbK+xOo=');
    socket.write('ping-frame');
    expect(await readUntil(socket, (t) => t.includes('ping-frame'))).toContain('ping-frame');
    socket.destroy();
  });

  it('answers 502 naming a missing secret or identity token, and refuses a secret that would break the header line', async () => {
    for (const [name, expected] of [
      [
        'missing.rule.test',
        'names secret "absent" for X-Api-Key, and no secret of that name is stored',
      ],
      [
        'id.rule.test',
        'names identity token "aws" for Authorization, and this Moat mints no identity tokens (its operator has not set --identity-issuer)',
      ],
      ['crlf.rule.test', 'control character'],
    ] as const) {
      const socket = await tunnelTls(name, moatCa.cert);
      const reply = await exchange(socket, get(name));
      expect(reply.status).toBe(502);
      expect((JSON.parse(reply.body) as { message: string }).message).toContain(expected);
      for (const value of SECRET_VALUES) expect(reply.body).not.toContain(value);
      socket.destroy();
    }
  });

  it('refuses (403, naming the secret) a request carrying a secret to a destination not bound to it', async () => {
    const refused = async (name: string, extra: string, path = '/path?q=1') => {
      const socket = await tunnelTls(name, moatCa.cert);
      const reply = await exchange(socket, `GET ${path} HTTP/1.1\r\nHost: ${name}\r\n${extra}\r\n`);
      socket.destroy();
      return reply;
    };
    // api.rule.test binds `token` only; ws.rule.test (the wildcard) binds `key` only.
    const byValue = await refused('api.rule.test', `X-Other: pre-${API_KEY}-post\r\n`);
    expect(byValue.status).toBe(403);
    expect(byValue.body).toContain('secret \\"key\\"');
    const byPlaceholder = await refused('ws.rule.test', 'X-T: ${e2b.secrets.TOKEN}\r\n');
    expect(byPlaceholder.status).toBe(403);
    expect(byPlaceholder.body).toContain('a secret placeholder');
    const inPath = await refused('ws.rule.test', '', `/q?t=${encodeURIComponent(TOKEN)}`);
    expect(inPath.status).toBe(403);
    // Its own secret may go where it is bound.
    expect((await refused('api.rule.test', '', `/q?t=${TOKEN}`)).status).toBe(200);
    // Plaintext, through the proxy: the same guard.
    const { stdout } = await run('curl', [
      '-sS',
      '--max-time',
      '10',
      '--proxy',
      `http://${moat.proxy.host}:${moat.proxy.port}`,
      '--proxy-user',
      auth,
      '-w',
      '\\n%{http_code}',
      '-H',
      `X-Key: ${API_KEY}`,
      `http://norule.test:${port}/`,
    ]);
    expect(stdout).toMatch(/403$/);
    expect(stdout).toContain('secret \\"key\\"');
    for (const reply of [byValue, byPlaceholder, inPath])
      for (const value of SECRET_VALUES) expect(reply.body).not.toContain(value);
  });

  it('refuses requests it cannot check or complete while the secrets are unreadable (502, cause only in the log), and holds no slot', async () => {
    unreadable = new Error('store at /var/lib/moat-private unreachable');
    const intercept = async () => {
      const socket = await tunnelTls('api.rule.test', moatCa.cert);
      const reply = await exchange(socket, get('api.rule.test'));
      socket.destroy();
      return reply;
    };
    const unchecked = await intercept();
    expect(unchecked.status).toBe(502);
    expect(unchecked.body).toContain('could not read its stored secrets');
    valuesKept = true;
    const intercepted = await intercept();
    expect(intercepted.status).toBe(502);
    expect(intercepted.body).toContain('could not read secret \\"token\\"');
    valuesKept = false;
    /** A plaintext request through the proxy that the leak guard must check: its status. */
    const plain = () =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const request = http.request(
          {
            host: moat.proxy.host,
            port: moat.proxy.port,
            agent: false,
            path: `http://norule.test:${port}/`,
            headers: {
              host: `norule.test:${port}`,
              'proxy-authorization': `Basic ${Buffer.from(auth).toString('base64')}`,
            },
          },
          (response) => {
            let body = '';
            response.setEncoding('utf8').on('data', (chunk: string) => (body += chunk));
            response.on('end', () => resolve({ status: response.statusCode ?? 0, body }));
          },
        );
        request.on('error', reject);
        request.end();
      });
    const first = await plain();
    expect(first.status).toBe(502);
    expect(first.body).toContain('could not read its stored secrets');
    for (const reply of [unchecked, intercepted, first])
      expect(reply.body).not.toContain('moat-private');
    expect(logLines.join('')).toContain('moat-private');
    // More refusals than the sandbox has connection slots (256): each gave its slot back.
    for (let i = 0; i < 300; i++) expect((await plain()).status).toBe(502);
  });

  describe('with --redact-secrets-in-responses', () => {
    const placeholder = '${e2b.secrets.token}';

    it('replaces injected values in echoed heads and bodies, on keep-alive, asking for uncoded bodies', async () => {
      const url = `https://api.rule.test:${port}`;
      // Two requests on one connection: a JSON echo, then a header and a two-piece body.
      const { stdout } = await curlThrough(
        redacting,
        `${url}/path`,
        '-i',
        '-H',
        'Accept-Encoding: gzip',
        `${url}/echo-header`,
      );
      for (const value of SECRET_VALUES) expect(stdout).not.toContain(value);
      expect(stdout.match(/Connection Established/gi)).toHaveLength(1);
      // curl asks for the URLs in order: /echo-header (an argument), then /path (its last).
      const [second, first] = stdout
        .split(/(?=HTTP\/1\.[01] \d{3} )/)
        .filter((part) => !/^HTTP\/1\.[01] 200 Connection established/i.test(part));
      expect(first).toMatch(/^transfer-encoding: chunked\r$/im);
      const echo = JSON.parse(first!.slice(first!.indexOf('\r\n\r\n') + 4)) as Echo;
      expect(seen(echo, 'authorization')).toEqual([`Bearer ${placeholder}`]);
      expect(seen(echo, 'accept-encoding')).toEqual(['identity']);
      expect(second).toContain(`x-echo: Bearer ${placeholder}\r\n`);
      expect(second).toContain(`{"seen":"Bearer ${placeholder}"}`);
      // The origin did get the value (and without the option, the sandbox would too).
      const plain = await curlProxy(`${url}/echo-header`);
      expect(plain.stdout).toBe(`{"seen":"Bearer ${TOKEN}"}`);
    });

    it('replaces a value cut across two writes, and ends an HTTP/1.0 answer by closing', async () => {
      const body = `xx${TOKEN}yy`;
      const url = `https://api.rule.test:${port}/chunked`;
      const chunked = await curlThrough(redacting, url, '--data-binary', body);
      expect(chunked.stdout).toBe(`xx${placeholder}yy`);
      const socket = await tunnelTls('api.rule.test', moatCa.cert, redacting);
      socket.setEncoding('latin1');
      let old = '';
      socket.on('data', (text: string) => (old += text));
      const closed = new Promise((resolve) => socket.once('end', resolve));
      socket.write(
        `POST /chunked HTTP/1.0\r\nHost: api.rule.test\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
      );
      await closed;
      socket.destroy();
      expect(old).toMatch(/^connection: close\r$/im);
      expect(old).not.toMatch(/^(transfer-encoding|content-length):/im);
      expect(old.endsWith(`\r\n\r\nxx${placeholder}yy`)).toBe(true);
    });

    it.each(Object.keys(malformedAnswers('')))(
      'refuses (502) a response head that does not parse without quoting it: the value the origin echoes into %s is in no answer or log line',
      async (path) => {
        const url = `https://api.rule.test:${port}${path}`;
        for (const proxy of [redacting, moat]) {
          const { stdout } = await curlThrough(proxy, url, '-w', '\n%{http_code}');
          expect(stdout).toMatch(/sent a malformed response: .*\n502$/);
          expect(stdout.toLowerCase()).not.toContain(TOKEN);
        }
        expect(logLines.join('').toLowerCase()).not.toContain(TOKEN);
      },
    );

    it('refuses (502) a body the origin compressed although asked not to', async () => {
      const { stdout } = await curlThrough(
        redacting,
        `https://api.rule.test:${port}/gzip`,
        '-w',
        '\n%{http_code}',
      );
      expect(stdout).toMatch(/502$/);
      expect(stdout).toContain('gzip coded body although Moat asked for none');
      // A coding no one registered is not named: it may be the credential, echoed.
      const echoed = await curlThrough(
        redacting,
        `https://api.rule.test:${port}/echo-coding`,
        '-w',
        '\n%{http_code}',
      );
      expect(echoed.stdout.toLowerCase()).not.toContain(TOKEN);
      expect(echoed.stdout).toMatch(
        /a non-standard coded body although Moat asked for none.*\n502$/,
      );
    });
  });

  describe('secret gaps on the interception and plaintext paths', () => {
    /** Every byte of `text` percent-encoded (`%6B%65...`). */
    const percent = (text: string) =>
      [...Buffer.from(text)].map((b) => `%${b.toString(16).padStart(2, '0')}`).join('');
    const carriesAny = (text: string) => SECRET_VALUES.some((v) => text.includes(v));
    const leaks = async (proxy: InterceptingProxy) => {
      const text = await proxy.metrics.registry.getSingleMetricAsString(
        'moat_secret_injections_total',
      );
      return Number(/outcome="leak"} (\d+)/.exec(text)?.[1] ?? 0);
    };

    it('refuses any Upgrade but WebSocket on an intercepted connection: the echoed request never comes back', async () => {
      for (const proxy of [moat, redacting]) {
        const socket = await tunnelTls('api.rule.test', moatCa.cert, proxy);
        const reply = await exchange(
          socket,
          'GET /echo-upgrade HTTP/1.1\r\nHost: api.rule.test\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n',
        );
        const all = reply.head + reply.body + (await readUntil(socket, () => false, 300));
        socket.destroy();
        expect(reply.status).toBe(400);
        expect(reply.body).toContain('only websocket');
        expect(carriesAny(all), 'a secret value reached the sandbox').toBe(false);
      }
    });

    it('answers 502 and closes the origin when a WebSocket 101 does not carry the matching Sec-WebSocket-Accept', async () => {
      const socket = await tunnelTls('api.rule.test', moatCa.cert, redacting);
      const reply = await exchange(
        socket,
        'GET /echo-upgrade HTTP/1.1\r\nHost: api.rule.test\r\nConnection: Upgrade\r\n' +
          'Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n',
      );
      const all = reply.head + reply.body + (await readUntil(socket, () => false, 300));
      socket.destroy();
      expect(reply.status).toBe(502);
      expect(reply.body).toContain('Sec-WebSocket-Accept');
      expect(carriesAny(all), 'a secret value reached the sandbox').toBe(false);
      // A WebSocket request without a well-formed key is not sent at all.
      const keyless = await tunnelTls('ws.rule.test', moatCa.cert, redacting);
      const bad = await exchange(
        keyless,
        get(
          'ws.rule.test',
          'Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: x\r\n',
        ),
      );
      keyless.destroy();
      expect(bad.status).toBe(400);
    });

    it('drops a response header whose name carries an injected value (any case)', async () => {
      const { stdout } = await curlThrough(
        redacting,
        `https://api.rule.test:${port}/echo-name`,
        '-i',
      );
      expect(stdout).toContain('named');
      const lower = stdout.toLowerCase();
      expect(
        SECRET_VALUES.some((v) => lower.includes(v.toLowerCase())),
        'a secret value in a header name',
      ).toBe(false);
    });

    it('refuses a secret sent lower- or upper-cased, split across fields, or percent-encoded more than once', async () => {
      const half = API_KEY.length >> 1;
      const [front, back] = [API_KEY.slice(0, half), API_KEY.slice(half)];
      const variants: [string, string, string][] = [
        ['upper case', '/p', `X-Other: ${API_KEY.toUpperCase()}\r\n`],
        ['two fields', '/p', `X-A: ${front}\r\nX-B: ${back}\r\n`],
        ['one field twice', '/p', `X-A: ${front}\r\nX-Z: 1\r\nX-A: ${back}\r\n`],
        ['encoded twice', `/q?k=${percent(percent(API_KEY))}`, ''],
        ['encoded three times', `/q?k=${percent(percent(percent(API_KEY)))}`, ''],
        ['in a field name', '/p', `X-${API_KEY}: 1\r\n`],
        ['placeholder, upper case', '/p', 'X-T: ${E2B.SECRETS.KEY}\r\n'],
        ['placeholder, encoded', `/q?k=${percent('${e2b.secrets.key}')}`, ''],
      ];
      for (const [what, path, extra] of variants) {
        const socket = await tunnelTls('api.rule.test', moatCa.cert);
        const reply = await exchange(
          socket,
          `GET ${path} HTTP/1.1\r\nHost: api.rule.test\r\n${extra}\r\n`,
        );
        socket.destroy();
        expect(reply.status, what).toBe(403);
        expect(reply.body, what).toContain(
          what.startsWith('placeholder') ? 'a secret placeholder' : 'secret \\"key\\"',
        );
      }
      // Not a false alarm: a near value passes, and the bound secret goes where it is bound.
      const near = await tunnelTls('api.rule.test', moatCa.cert);
      const nearMiss = `${API_KEY.slice(0, -1)}_`;
      expect((await exchange(near, get('api.rule.test', `X-N: ${nearMiss}\r\n`))).status).toBe(200);
      const own = `/q?t=${percent(percent(TOKEN.toUpperCase()))}`;
      expect(
        (await exchange(near, `GET ${own} HTTP/1.1\r\nHost: api.rule.test\r\n\r\n`)).status,
      ).toBe(200);
      near.destroy();
    });

    it('refuses a secret on plain HTTP sent directly to port 80 (transparent) and inside a CONNECT tunnel', async () => {
      const before = await leaks(moat);
      // Transparent port 80: the first request is answered 403 before anything is dialled.
      const plain = net.connect({ ...moat.transparent, localAddress: SOURCE });
      const reply = await exchange(plain, get('norule.test', 'X-T: ${e2b.secrets.token}\r\n'));
      plain.destroy();
      expect(reply.status).toBe(403);
      expect(reply.body).toContain('a secret placeholder');
      const byValue = net.connect({ ...moat.transparent, localAddress: SOURCE });
      const valued = await exchange(byValue, get('norule.test', `X-T: ${TOKEN}\r\n`));
      byValue.destroy();
      expect(valued.status).toBe(403);
      expect(carriesAny(valued.body)).toBe(false);
      // Inside a CONNECT tunnel to a destination without a rule: the tunnel is closed before
      // the request goes on.
      const tunnel = await connectThrough(moat.proxy, `norule.test:${port}`, { auth });
      expect(tunnel.status).toBe(200);
      tunnel.socket.write(get('norule.test', 'X-T: ${e2b.secrets.token}\r\n'));
      await readUntil(tunnel.socket, () => false, 2000);
      expect(tunnel.socket.readableEnded || tunnel.socket.destroyed).toBe(true);
      tunnel.socket.destroy();
      expect(await leaks(moat)).toBe(before + 3);
    });

    it('answers the placeholder of a stored secret no rule of the sandbox names as it answers an unknown name (no oracle of stored names)', async () => {
      // A placeholder is no credential: refusing it only for names that are stored, and naming
      // them, tells a sandbox which secrets the platform holds beyond its own rules.
      secrets.set('unbound_key', `${'u'.repeat(32)}-unbound`);
      try {
        const answer = async (name: string) => {
          const plain = net.connect({ ...moat.transparent, localAddress: SOURCE });
          const reply = await exchange(
            plain,
            get('norule.test', `X-T: \${e2b.secrets.${name}}\r\n`),
          );
          plain.destroy();
          return reply;
        };
        const stored = await answer('unbound_key');
        const unknown = await answer('no_such_key');
        expect(stored.status).toBe(unknown.status);
        expect(stored.body).not.toContain('unbound_key');
      } finally {
        secrets.delete('unbound_key');
      }
    });

    it('ends a CONNECT tunnel carried by the native relay at a request carrying a secret', async () => {
      const native = await startInterceptingProxy({
        names: NAMES,
        upstreamCa: originCa.cert,
        transparentPorts: { tls: port, http: port },
        tcpIo: 'auto',
        injection: moatInjection,
      });
      try {
        native.register(SANDBOX, SECRET, SOURCE, NETWORK);
        const tunnel = await connectThrough(native.proxy, `norule.test:${port}`, { auth });
        expect(tunnel.status).toBe(200);
        tunnel.socket.write(get('norule.test', `X-T: ${TOKEN.toUpperCase()}\r\n`));
        await readUntil(tunnel.socket, () => false, 2000);
        expect(tunnel.socket.readableEnded || tunnel.socket.destroyed).toBe(true);
        tunnel.socket.destroy();
        expect(await leaks(native)).toBe(1);
      } finally {
        await native.close();
      }
    });

    it("sends a rule's headers to every port allowOut opens for its name, over verified TLS", async () => {
      const other = https.createServer(originCa.issue(['api.rule.test']), (req, res) =>
        res.end(JSON.stringify({ rawHeaders: req.rawHeaders })),
      );
      await new Promise<void>((resolve) => other.listen(0, '127.0.0.31', resolve));
      const otherPort = (other.address() as net.AddressInfo).port;
      try {
        const { stdout } = await curlProxy(`https://api.rule.test:${otherPort}/port`);
        const echo = JSON.parse(stdout) as Echo;
        expect(seen(echo, 'authorization')).toEqual([`Bearer ${TOKEN}`]);
      } finally {
        await new Promise((resolve) => other.close(resolve));
      }
    });
  });

  describe('a hostile sandbox', () => {
    it('gets garbage, oversized and slow heads refused within bounds, and Moat serves on', async () => {
      const garbage = await tunnelTls('api.rule.test', moatCa.cert);
      expect((await exchange(garbage, '\x00\x01\x02 not http\r\n\r\n')).status).toBe(400);
      garbage.destroy();

      const big = await tunnelTls('api.rule.test', moatCa.cert);
      const huge = get('api.rule.test', `X-Big: ${'a'.repeat(20_000)}\r\n`);
      expect((await exchange(big, huge)).status).toBe(431);
      big.destroy();

      const slow = await tunnelTls('api.rule.test', moatCa.cert);
      const started = Date.now();
      slow.write('GET / HTTP/1.1\r\nHost: api.rule.test\r\n');
      const drip = setInterval(() => slow.writable && slow.write('X-Drip: 1\r\n'), 100);
      const answer = await readUntil(slow, () => false, 5000);
      clearInterval(drip);
      expect(answer).toContain('408');
      expect(Date.now() - started).toBeLessThan(3000);
      slow.destroy();

      // Not a ClientHello at all, and a TLS handshake never finished: closed.
      const { socket: notTls } = await connectThrough(moat.proxy, `api.rule.test:${port}`, {
        auth,
      });
      notTls.write('\x16\x03\x01\x00\x05hello-not-tls');
      await readUntil(notTls, () => false, 3000);
      expect(notTls.destroyed || notTls.readableEnded).toBe(true);

      const stalled = await connectThrough(moat.proxy, `api.rule.test:${port}`, { auth });
      const hello = tls.connect({ socket: stalled.socket, servername: 'api.rule.test' });
      hello.on('error', () => {});
      // The client never reads or answers the server's flight: dropped within the timeout.
      stalled.socket.pause();
      const closed = await new Promise<number>((resolve) => {
        const t0 = Date.now();
        stalled.socket.once('close', () => resolve(Date.now() - t0));
        setTimeout(() => resolve(-1), 5000);
      });
      expect(closed).toBeGreaterThanOrEqual(0);

      const { stdout } = await curlProxy(`https://api.rule.test:${port}/after`);
      expect((JSON.parse(stdout) as Echo).url).toBe('/after');
    });
  });

  it('records the rule key and header names (never values) in flow records, counts and logs each injection', async () => {
    const since = Date.now();
    const socket = await tunnelTls('api.rule.test', moatCa.cert);
    await exchange(socket, get('api.rule.test'));
    socket.destroy();
    const deadline = Date.now() + 2000;
    const closes = () =>
      moat.flows
        .query({ since }, 10_000)
        .filter((r) => r.event === 'close' && r.ruleKey === 'api.rule.test');
    while (!closes().some((r) => r.injectedHeaders!.length > 0) && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 20));
    // Connections of earlier tests may close meanwhile: this one is the one that injected.
    const close = closes().find((r) => r.injectedHeaders!.length > 0)!;
    expect(close.injectedHeaders).toEqual(['authorization', 'x-literal']);
    expect(close.destination.name).toBe('api.rule.test');

    const metrics = await moat.metrics.registry.getSingleMetricAsString(
      'moat_secret_injections_total',
    );
    for (const outcome of [
      'injected',
      'missing_secret',
      'store_error',
      'upstream_refused',
      'fronting',
      'leak',
      'upgrade_refused',
      'identity_error',
    ])
      expect(metrics).toMatch(new RegExp(`outcome="${outcome}"} [1-9]`));

    const logs = logLines.join('');
    expect(logs).toContain('secret headers injected');
    expect(logs).toContain('"rule":"api.rule.test"');
    const records = JSON.stringify(moat.flows.query({}, 10_000));
    for (const value of SECRET_VALUES) {
      expect(logs.includes(value), 'a secret value in the logs').toBe(false);
      expect(records.includes(value), 'a secret value in flow records').toBe(false);
    }
  });
});
