/**
 * Methods and paths in `network.rules`, at the doors that read each request: TLS Moat
 * intercepts (through CONNECT) and the proxy's absolute-form plain HTTP. Attacker first: a
 * sandbox sends a method or a path the rules deny, spelt so a lenient origin would read it as
 * an allowed one, or plain HTTP where Moat does not read each request. Real curl, real origins
 * on loopback, the real policy compiled from the configuration.
 */
import { execFile } from 'node:child_process';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import { promisify } from 'node:util';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  type InterceptingProxy,
  startInterceptingProxy,
} from '../../bench/lib/intercepting-proxy.js';
import { destinationRulesFor } from '../../src/policy/index.js';
import { connectThrough, readUntil } from '../support/origins.js';
import { TestCa } from '../support/test-ca.js';

const run = promisify(execFile);

const SANDBOX = 'irequestrulessandbox1';
const SECRET = 'egress-secret-request-rules';
const SOURCE = '127.77.0.4';
const ORIGIN_IP = '127.0.0.41';
const TOKEN = 'tok-5ecret-request-rules';

const NAMES = new Map<string, string[]>([
  ['api.rules.test', [ORIGIN_IP]],
  ['plain.rules.test', [ORIGIN_IP]],
  ['open.rules.test', [ORIGIN_IP]],
  ['tunnel.rules.test', [ORIGIN_IP]],
]);

const READ_ACME = [
  { match: { methods: ['GET', 'HEAD'], paths: ['/repos/acme/*'] }, action: 'allow' },
  { action: 'deny' },
];

const NETWORK = {
  allowOut: ['api.rules.test', 'plain.rules.test', 'open.rules.test', 'tunnel.rules.test'],
  denyOut: ['0.0.0.0/0'],
  rules: {
    'api.rules.test': READ_ACME,
    'plain.rules.test': READ_ACME,
    // The form E2B SDK 2.51 sends on: match and action inside transform.
    'open.rules.test': [{ transform: { match: { methods: ['DELETE'] }, action: 'deny' } }],
  },
};

describe('methods and paths at the doors that read requests', () => {
  const moatCa = new TestCa('moat-rules-ca');
  const originCa = new TestCa('origin-rules-ca');
  /** Every request an origin answered: `METHOD path`. */
  const reached: string[] = [];
  /** Every Authorization an origin was sent. */
  const authorizations: string[] = [];
  let tlsOrigin: https.Server;
  let plainOrigin: http.Server;
  let tlsPort = 0;
  let plainPort = 0;
  let moat: InterceptingProxy;

  beforeAll(async () => {
    const answer = (req: http.IncomingMessage, res: http.ServerResponse) => {
      reached.push(`${req.method} ${req.url}`);
      // An origin that echoes what it was sent before (a request log).
      if (req.url === '/log') return void res.end(JSON.stringify(authorizations));
      if (req.headers.authorization !== undefined) authorizations.push(req.headers.authorization);
      res.end('origin');
    };
    tlsOrigin = https.createServer(originCa.issue(['*.rules.test']), answer);
    plainOrigin = http.createServer(answer);
    await new Promise<void>((resolve) => tlsOrigin.listen(0, ORIGIN_IP, resolve));
    await new Promise<void>((resolve) => plainOrigin.listen(0, ORIGIN_IP, resolve));
    tlsPort = (tlsOrigin.address() as net.AddressInfo).port;
    plainPort = (plainOrigin.address() as net.AddressInfo).port;
    const leaves = new Map<string, tls.SecureContext>();
    moat = await startInterceptingProxy({
      names: NAMES,
      upstreamCa: originCa.cert,
      transparentPorts: { tls: tlsPort, http: plainPort },
      injection: {
        transformFor: (sandboxID, name) => {
          const sandbox = moat.table.get(sandboxID);
          return sandbox === undefined ? undefined : destinationRulesFor(sandbox.policy, name);
        },
        leafContext: async (name) => {
          let context = leaves.get(name);
          if (context === undefined)
            leaves.set(name, (context = tls.createSecureContext(moatCa.issue([name]))));
          return context;
        },
        secretValue: async (name) => (name === 'tok' ? TOKEN : undefined),
      },
      redactSecretsInResponses: true,
    });
  }, 60_000);

  afterAll(async () => {
    await moat?.close();
    for (const server of [tlsOrigin, plainOrigin]) {
      server?.closeAllConnections();
      await new Promise((resolve) => server?.close(resolve));
    }
    moatCa.remove();
    originCa.remove();
  });

  beforeEach(() => {
    moat.register(SANDBOX, SECRET, SOURCE, NETWORK);
    reached.length = 0;
  });

  /** curl through Moat: the status, Moat's decision header and the body. */
  async function curl(method: string, url: string, ...args: string[]) {
    const { stdout } = await run(
      'curl',
      [
        '-sS',
        '--max-time',
        '10',
        '--path-as-is',
        '--proxy',
        `http://${moat.proxy.host}:${moat.proxy.port}`,
        '--proxy-user',
        `${SANDBOX}:${SECRET}`,
        '--cacert',
        moatCa.certFile(),
        '-X',
        method,
        '-D',
        '-',
        ...args,
        url,
      ],
      { timeout: 15_000 },
    );
    // The CONNECT's own answer comes first over HTTPS: the response is the last head.
    const parts = stdout.split('\r\n\r\n');
    const last = parts.findLastIndex((part) => part.startsWith('HTTP/'));
    const head = parts[last] ?? '';
    const body = parts.slice(last + 1).join('\r\n\r\n');
    return {
      status: Number(/^HTTP\/1\.1 (\d+)/.exec(head)?.[1]),
      decision: /^x-moat-decision: (.*)$/im.exec(head)?.[1],
      body,
    };
  }

  /** TLS to `name` through a CONNECT tunnel of the sandbox's, trusting `ca`. */
  async function tlsThrough(name: string, ca: string): Promise<tls.TLSSocket> {
    const { socket, status } = await connectThrough(moat.proxy, `${name}:${tlsPort}`, {
      auth: `${SANDBOX}:${SECRET}`,
    });
    expect(status).toBe(200);
    return new Promise((resolve, reject) => {
      const secure = tls.connect({ socket, servername: name, ca });
      secure.once('secureConnect', () => resolve(secure));
      secure.once('error', reject);
    });
  }

  const https_ = (path: string) => `https://api.rules.test:${tlsPort}${path}`;
  const http_ = (path: string) => `http://plain.rules.test:${plainPort}${path}`;

  for (const [door, url] of [
    ['intercepted TLS', https_],
    ['absolute-form plain HTTP', http_],
  ] as const) {
    describe(door, () => {
      it('sends what the rules allow, and answers 403 naming the rule, method and path otherwise', async () => {
        expect(await curl('GET', url('/repos/acme/x?page=2'))).toMatchObject({
          status: 200,
          body: 'origin',
        });
        const refused = await curl('POST', url('/repos/acme/x?token=not-recorded'));
        expect(refused.status).toBe(403);
        const key = url === https_ ? 'api.rules.test' : 'plain.rules.test';
        expect(refused.decision).toBe(`deny; list=rules; rule="${key} #2"`);
        expect(JSON.parse(refused.body)).toEqual({
          code: 403,
          message: `POST /repos/acme/x to ${key} is denied by rule ${key} #2 of network.rules`,
        });
        expect(reached).toEqual(['GET /repos/acme/x?page=2']);
        const record = moat.flows
          .query({ sandboxID: SANDBOX }, 100)
          .find((r) => r.request !== undefined);
        expect(record).toMatchObject({
          kind: 'http',
          verdict: 'deny',
          list: 'rules',
          rule: `${key} #2`,
          request: { method: 'POST', path: '/repos/acme/x' },
          destination: { name: key, protocol: url === https_ ? 'tls' : 'http' },
        });
        expect(JSON.stringify(record)).not.toContain('not-recorded');
      });

      it.each([
        ['/repos/acme/../../admin', 400],
        ['/repos/acme/%2e%2e/%2e%2e/admin', 400],
        ['/repos/acme%2F..%2F..%2Fadmin', 400],
        ['/repos//acme/x', 400],
        ['/repos/acme;x/../../admin', 400],
        ['/repos/acme/x%3Adelete', 400],
        ['/repos/acme/%C0%AE%C0%AE/admin', 400],
        // An allow fits the path as written.
        ['/Repos/Acme/x', 403],
        ['/repos/acme/caf%C3%A9', 200],
        ['/repos/other', 403],
      ])('GET %s: %i, and the origin reads only what was decided', async (path, status) => {
        const answered = await curl('GET', url(path));
        expect(answered.status).toBe(status);
        expect(reached).toEqual(status === 200 ? [`GET ${path}`] : []);
        if (status === 400) expect(JSON.parse(answered.body).message).toContain('path');
      });
    });
  }

  it('keeps an intercepted connection open after a refusal: the next request is decided on its own', async () => {
    const secure = await tlsThrough('api.rules.test', moatCa.cert);
    const host = `Host: api.rules.test:${tlsPort}\r\n`;
    secure.write(`DELETE /repos/acme/x HTTP/1.1\r\n${host}\r\n`);
    expect(await readUntil(secure, (text) => text.includes('}'))).toMatch(/^HTTP\/1\.1 403/);
    secure.write(`GET /repos/acme/x HTTP/1.1\r\n${host}Connection: close\r\n\r\n`);
    expect(await readUntil(secure, (text) => text.endsWith('origin'))).toMatch(/^HTTP\/1\.1 200/);
    secure.destroy();
    expect(reached).toEqual(['GET /repos/acme/x']);
  });

  it('refuses plain HTTP in a CONNECT tunnel to a destination with request rules, naming the way that works', async () => {
    const { socket, status } = await connectThrough(moat.proxy, `plain.rules.test:${plainPort}`, {
      auth: `${SANDBOX}:${SECRET}`,
    });
    expect(status).toBe(200);
    socket.write(`GET /repos/acme/x HTTP/1.1\r\nHost: plain.rules.test\r\n\r\n`);
    const answer = await readUntil(socket, (text) => text.includes('}'));
    expect(answer).toMatch(/^HTTP\/1\.1 403/);
    expect(answer).toContain("checked only as the proxy's absolute-form requests");
    socket.destroy();
    expect(reached).toEqual([]);
  });

  it('decides by the form E2B SDK 2.51 sends (match and action inside transform)', async () => {
    const open = (path: string) => `https://open.rules.test:${tlsPort}${path}`;
    expect((await curl('GET', open('/anything'))).status).toBe(200);
    expect((await curl('DELETE', open('/anything'))).decision).toBe(
      'deny; list=rules; rule="open.rules.test #1"',
    );
    // A rule with no path match reads any path as sent.
    expect((await curl('GET', open('/a/../b'))).status).toBe(200);
    expect(reached).toEqual(['GET /anything', 'GET /a/../b']);
  });

  it('applies a PUT at the next request, on a connection opened before it', async () => {
    moat.publish(SANDBOX, {
      ...NETWORK,
      rules: { ...NETWORK.rules, 'api.rules.test': [{ action: 'deny' }] },
    });
    expect((await curl('GET', https_('/repos/acme/x'))).decision).toBe(
      'deny; list=rules; rule="api.rules.test #1"',
    );
  });

  it('redacts from every answer each credential the rules may send, not only the request’s own', async () => {
    moat.publish(SANDBOX, {
      ...NETWORK,
      rules: {
        ...NETWORK.rules,
        'api.rules.test': [
          {
            match: { paths: ['/write/*'] },
            action: 'allow',
            transform: { headers: { Authorization: 'Bearer ${e2b.secrets.tok}' } },
          },
          { action: 'allow' },
        ],
      },
    });
    expect((await curl('GET', https_('/write/x'))).status).toBe(200);
    const log = await curl('GET', https_('/log'));
    expect(log.status).toBe(200);
    expect(authorizations).toEqual([`Bearer ${TOKEN}`]);
    expect(log.body).toContain('Bearer ');
    expect(log.body).not.toContain(TOKEN);
  });

  it('in report mode sends what the rules deny, and no credential where only report mode let the connection through', async () => {
    const credential = [{ transform: { headers: { Authorization: 'Bearer ${e2b.secrets.tok}' } } }];
    moat.publish(SANDBOX, {
      mode: 'report',
      allowOut: ['api.rules.test'],
      denyOut: ['0.0.0.0/0'],
      rules: {
        'api.rules.test': [
          { match: { methods: ['GET'] }, action: 'allow', ...credential[0] },
          { action: 'deny' },
        ],
        // Not in allowOut: only report mode lets a connection to it through.
        'open.rules.test': credential,
      },
    });
    authorizations.length = 0;
    const denied = await curl('POST', https_('/repos/acme/x'));
    expect(denied.status).toBe(200);
    expect(reached).toEqual(['POST /repos/acme/x']);
    expect((await curl('GET', https_('/repos/acme/x'))).status).toBe(200);
    expect((await curl('GET', `https://open.rules.test:${tlsPort}/`)).status).toBe(200);
    // Only the GET its rule allows, on a connection allowOut allows, carried the credential.
    expect(authorizations).toEqual([`Bearer ${TOKEN}`]);
    expect(reached).toEqual(['POST /repos/acme/x', 'GET /repos/acme/x', 'GET /']);
  });

  it('refuses a method not in upper case, or overridden by a header, where rules match methods', async () => {
    const lower = await curl('get', https_('/repos/acme/x'));
    expect(lower.status).toBe(400);
    expect(JSON.parse(lower.body).message).toContain('is not upper case');
    const overridden = await curl(
      'GET',
      https_('/repos/acme/x'),
      '-H',
      'X-HTTP-Method-Override: DELETE',
    );
    expect(overridden.status).toBe(400);
    expect(JSON.parse(overridden.body).message).toContain('x-http-method-override');
    expect(reached).toEqual([]);
  });

  it('closes a tunnel it does not read when rules that decide requests come for its name', async () => {
    // The origin's own certificate: an opaque tunnel.
    const secure = await tlsThrough('tunnel.rules.test', originCa.cert);
    const closed = new Promise<void>((resolve) => secure.once('close', () => resolve()));
    secure.on('error', () => undefined);
    moat.publish(SANDBOX, {
      ...NETWORK,
      rules: {
        ...NETWORK.rules,
        'tunnel.rules.test': [{ match: { methods: ['POST'] }, action: 'deny' }],
      },
    });
    await closed;
    const record = moat.flows
      .query({ sandboxID: SANDBOX }, 100)
      .find((r) => r.event === 'close' && r.destination.name === 'tunnel.rules.test');
    expect(record).toMatchObject({ end: 'policy', list: 'rules', rule: 'tunnel.rules.test' });
  });

  it('decides each request the same way through the transparent listener (TLS by SNI; plain HTTP refused)', async () => {
    const transparent = (method: string, path: string) =>
      run(
        'curl',
        [
          ...['-sS', '--max-time', '10', '--interface', SOURCE, '-X', method],
          ...['-o', '/dev/null', '-w', '%{http_code}'],
          ...['--connect-to', `api.rules.test:${tlsPort}:127.0.0.1:${moat.transparent.port}`],
          ...['--cacert', moatCa.certFile(), https_(path)],
        ],
        { timeout: 15_000 },
      );
    expect((await transparent('GET', '/repos/acme/x')).stdout).toBe('200');
    expect((await transparent('POST', '/repos/acme/x')).stdout).toBe('403');
    expect(reached).toEqual(['GET /repos/acme/x']);
    const record = moat.flows
      .query({ sandboxID: SANDBOX }, 100)
      .find((r) => r.request !== undefined);
    expect(record).toMatchObject({ rule: 'api.rules.test #2', request: { method: 'POST' } });
    // Plain HTTP straight to the listener: read at its start only, so refused.
    const plain = net.connect({ ...moat.transparent, localAddress: SOURCE });
    plain.write('GET /repos/acme/x HTTP/1.1\r\nHost: plain.rules.test\r\n\r\n');
    const answer = await readUntil(plain, (text) => text.includes('}'));
    plain.destroy();
    expect(answer).toMatch(/^HTTP\/1\.1 403/);
    expect(answer).toContain("checked only as the proxy's absolute-form requests");
  });
});
