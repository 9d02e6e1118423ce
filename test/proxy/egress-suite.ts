import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { TcpIoSetting } from '../../src/proxy/index.js';
import { nativeTcp, nativeTcpUnavailable } from '../../src/proxy/native-tcp.js';
import { type RunningMoat, startMoat } from '../../src/app/index.js';
import { scratchMoatFlags } from '../../bench/lib/scratch.js';
import { loadConfig } from '../../src/config.js';
import { compilePolicy, parseIP, parseNetworkConfig } from '../../src/policy/index.js';
import { udpQuery } from '../support/dns-client.js';
import { kernelBufferedMax } from '../support/kernel-buffers.js';
import { FakeDns } from '../support/fake-dns.js';
import { clientHello, inRecords, record, serverHello } from '../support/tls-records.js';
import {
  connectThrough,
  httpEchoOrigin,
  type Origin,
  readUntil,
  tcpEchoOrigin,
  tlsEchoOrigin,
} from '../support/origins.js';
import type { HostPort } from '../../src/net/index.js';
import { LOOPBACK_IS_OUTSIDE } from '../../bench/lib/loopback-outside.js';

/**
 * The egress proxy's behaviour, run once per way of carrying connections (egress.test.ts: the
 * native relay where it loads; egress-node.test.ts: Node's sockets).
 */
/**
 * How long the fake upstream takes to answer slowweb.allowed.test: within one upstream try
 * (a third of --dns-timeout-ms), and long enough that a Moat stopping, or a sandbox replaced,
 * once the name is upstream finishes first on a loaded host too.
 */
const SLOW_ANSWER_MS = 600;

export function egressSuite(io: TcpIoSetting): void {
  // Port 80 is one per address: each relay's file (they may run at once) has its own address.
  const port80Host = io === 'node' ? '127.0.0.24' : '127.0.0.14';
  const SANDBOX = 'iproxysandbox00000001';
  const SECRET = 'egress-secret-1';
  const SOURCE = '127.77.0.2';

  const parseNetworkConfigOrThrow = (config: object) => {
    const parsed = parseNetworkConfig(config);
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
    return parsed.value;
  };
  const policy = (config: object) =>
    compilePolicy(parseNetworkConfigOrThrow(config), moat.internal);
  const ip = (text: string) => {
    const parsed = parseIP(text);
    if (!parsed.ok) throw new Error(parsed.error);
    return parsed.value;
  };
  const ALLOW_TEST = { allowOut: ['allowed.test', '*.allowed.test'], denyOut: ['0.0.0.0/0'] };

  let upstream: FakeDns;
  let web: Origin & { requests: http.IncomingHttpHeaders[] };
  let secure: Origin;
  let ssh: Origin;
  let moat: RunningMoat;
  let proxy: HostPort;
  const scratch = scratchMoatFlags();

  /**
   * Moat on free loopback ports, resolving through the fake upstream, origins behind its
   * transparent listener. The origins are on this host's loopback, so unless `host` is
   * 'this host', Moat is told the host has no interfaces (the suite is about everything else;
   * 'the host is never a destination' below is about this).
   */
  async function startTestMoat(
    flags: Record<string, string>,
    host: 'no interfaces' | 'this host' = 'no interfaces',
  ): Promise<RunningMoat> {
    const config = loadConfig({
      flags: {
        'dns-listen': '127.0.0.1:0',
        'dns-upstream': `127.0.0.1:${upstream.port}`,
        'proxy-listen': '127.0.0.1:0',
        'transparent-listen': '127.0.0.1:0',
        'log-level': 'silent',
        'proxy-io': io,
        ...flags,
      },
    });
    if (!config.ok) throw new Error(config.error);
    return startMoat(config.value, pino({ level: 'silent' }), {
      defaultMetrics: false,
      hostAddresses: host === 'this host' ? undefined : LOOPBACK_IS_OUTSIDE,
      transparentPorts: { tls: secure.port, http: web.port },
    });
  }

  beforeAll(async () => {
    web = await httpEchoOrigin('127.0.0.10');
    secure = await tlsEchoOrigin('127.0.0.11');
    ssh = await tcpEchoOrigin('127.0.0.12', 'SSH-2.0-origin\r\n');
    upstream = await new FakeDns(
      new Map([
        ['allowed.test', { A: ['127.0.0.10'] }],
        ['www.allowed.test', { A: ['127.0.0.10'] }],
        ['tls.allowed.test', { A: ['127.0.0.11'] }],
        ['ssh.allowed.test', { A: ['127.0.0.12'] }],
        ['slow.allowed.test', { A: ['127.0.0.12'] }],
        ['slowweb.allowed.test', { A: ['127.0.0.10'] }],
        ['denied.test', { A: ['127.0.0.10'] }],
        ['meta.allowed.test', { A: ['127.0.0.99'] }],
        ['closed.allowed.test', { A: ['127.0.0.13'] }],
        ['port80.allowed.test', { A: [port80Host] }],
        ['retry.allowed.test', { A: ['127.0.0.15'] }],
      ]),
    ).start();
    upstream.slow.set('slow.allowed.test', 150);
    upstream.slow.set('slowweb.allowed.test', SLOW_ANSWER_MS);
    moat = await startTestMoat({
      'internal-deny': '10.0.0.0/8,169.254.0.0/16,127.0.0.99/32',
      'proxy-max-tunnels': '8',
      'metrics-per-sandbox': 'true',
      ...scratch.flags,
    });
    proxy = moat.listening.proxy;
  });

  afterAll(async () => {
    await moat.stop();
    scratch.remove();
    await Promise.all([web.close(), secure.close(), ssh.close(), upstream.stop()]);
  });

  beforeEach(() => {
    moat.table.remove(SANDBOX);
    moat.table.register(
      SANDBOX,
      { sourceAddress: ip(SOURCE), egressSecret: SECRET },
      policy(ALLOW_TEST),
    );
    web.requests.length = 0;
  });

  const auth = `${SANDBOX}:${SECRET}`;

  /** Polls `condition` every 10 ms for up to 2 s. */
  async function waitFor(condition: () => Promise<boolean>): Promise<void> {
    const deadline = Date.now() + 2000;
    while (!(await condition())) {
      if (Date.now() > deadline) throw new Error(`not true within 2 s: ${condition}`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  /** Absolute-form GET through the proxy; resolves status, headers and parsed JSON body. */
  function proxyGet(
    url: string,
    options: { auth?: string; agent?: http.Agent; headers?: Record<string, string> } = {},
  ) {
    return new Promise<{
      status: number;
      headers: http.IncomingHttpHeaders;
      body: Record<string, unknown>;
    }>((resolve, reject) => {
      const headers: Record<string, string> = { ...options.headers };
      if (options.auth)
        headers['proxy-authorization'] = `Basic ${Buffer.from(options.auth).toString('base64')}`;
      const req = http.request({
        host: proxy.host,
        port: proxy.port,
        path: url,
        headers,
        agent: options.agent ?? false,
      });
      req.on('response', (res) => {
        let text = '';
        res.on('data', (chunk) => {
          text += chunk;
        });
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            body: text ? JSON.parse(text) : {},
          }),
        );
      });
      req.on('error', reject);
      req.end();
    });
  }

  it(`carries connections ${io === 'node' ? "on Node's sockets" : 'natively where the addon loads'}`, () => {
    const expected = io === 'node' || nativeTcpUnavailable() !== undefined ? 'node' : 'native';
    expect(moat.proxy.io.io).toBe(expected);
    if (expected === 'node' && io !== 'node')
      console.warn(`egress tests run on Node's sockets: ${nativeTcpUnavailable()}`);
  });

  describe('CONNECT', () => {
    it('outlives clients that reset as soon as they are refused', async () => {
      for (let i = 0; i < 20; i++) {
        const socket = net.connect(proxy);
        socket.on('error', () => {});
        socket.write('CONNECT allowed.test:80 HTTP/1.1\r\n\r\n');
        socket.resetAndDestroy();
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
      const { status } = await proxyGet(`http://allowed.test:${web.port}/after`, { auth });
      expect(status).toBe(200);
    });

    it('opens a tunnel to an allowed name and carries bytes both ways', async () => {
      const { socket, status } = await connectThrough(proxy, `ssh.allowed.test:${ssh.port}`, {
        auth,
      });
      expect(status).toBe(200);
      expect(await readUntil(socket, (t) => t.includes('\r\n'))).toBe('SSH-2.0-origin\r\n');
      // A whole line: bytes that could still begin an HTTP request line wait until it ends.
      socket.write('ping\n');
      expect(await readUntil(socket, (t) => t.includes('ping'))).toBe('ping\n');
      socket.destroy();
    });

    it('keeps the bytes a client sends while its tunnel is still being set up', async () => {
      // The name resolves only after 150 ms: "LATE" arrives while Moat is resolving it.
      const socket = net.connect({ host: proxy.host, port: proxy.port });
      await new Promise((resolve) => socket.once('connect', resolve));
      const authority = `slow.allowed.test:${ssh.port}`;
      const credentials = Buffer.from(auth).toString('base64');
      socket.write(
        `CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n` +
          `Proxy-Authorization: Basic ${credentials}\r\n\r\nEARLY-`,
      );
      setTimeout(() => socket.write('LATE\n'), 30);
      const seen = await readUntil(socket, (text) => text.includes('EARLY-LATE\n'));
      expect(seen).toMatch(/^HTTP\/1\.1 200 [^]*SSH-2\.0-origin\r\nEARLY-LATE\n$/);
      socket.destroy();
    });

    it('identifies the sandbox by its source address when there is no Proxy-Authorization', async () => {
      const { socket, status } = await connectThrough(proxy, `ssh.allowed.test:${ssh.port}`, {
        localAddress: SOURCE,
      });
      expect(status).toBe(200);
      socket.destroy();
    });

    it('answers 403 with a JSON body naming the rule, and X-Moat-Decision', async () => {
      const { status, head, body } = await connectThrough(proxy, `denied.test:${web.port}`, {
        auth,
      });
      expect(status).toBe(403);
      expect(JSON.parse(body)).toEqual({
        code: 403,
        message: `egress to denied.test:${web.port} denied by denyOut rule 0.0.0.0/0: no allowOut name rule covers the name; 0.0.0.0/0 denies it`,
      });
      expect(head).toMatch(/X-Moat-Decision: deny; list=denyOut; rule="0.0.0.0\/0"/i);
      // A denied name is never even looked up.
      expect(upstream.asked('denied.test')).toHaveLength(0);
    });

    it('denies an allowed name whose address is in the internal list', async () => {
      const { status, body } = await connectThrough(proxy, `meta.allowed.test:${web.port}`, {
        auth,
      });
      expect(status).toBe(403);
      expect(JSON.parse(body).message).toContain('denied by internal rule 127.0.0.99/32');
    });

    it('allows a bare address only after the sandbox learned it from DNS, and never for another name', async () => {
      expect((await connectThrough(proxy, `127.0.0.12:${ssh.port}`, { auth })).status).toBe(403);
      await udpQuery(moat.listening.dns.port, SOURCE, 'ssh.allowed.test');
      const learned = await connectThrough(proxy, `127.0.0.12:${ssh.port}`, { auth });
      expect(learned.status).toBe(200);
      learned.socket.destroy();
      // denied.test shares 127.0.0.10 with allowed.test: the name decides, not the shared address.
      await udpQuery(moat.listening.dns.port, SOURCE, 'allowed.test');
      expect((await connectThrough(proxy, `denied.test:${web.port}`, { auth })).status).toBe(403);
    });

    it.each([
      ['a hexadecimal IPv4 spelling', () => `0x7f.0.0.10:${web.port}`, 400],
      ['a short IPv4 spelling', () => `127.10:${web.port}`, 400],
      ['a decimal IPv4 spelling', () => `2130706442:${web.port}`, 400],
      ['userinfo', () => `user@allowed.test:${web.port}`, 400],
      ['a port with a leading zero', () => `allowed.test:0${web.port}`, 400],
      ['port 0', () => 'allowed.test:0', 400],
      ['port 65536', () => 'allowed.test:65536', 400],
      ['no port', () => 'allowed.test', 400],
      ['a zone ID', () => `[fe80::1%25eth0]:${web.port}`, 400],
      ['an empty label', () => `a..allowed.test:${web.port}`, 400],
      ['a label-boundary lookalike', () => `notallowed.test:${web.port}`, 403],
      ['the allowed name as a prefix', () => `allowed.test.evil.test:${web.port}`, 403],
      ['an IPv4-mapped internal address', () => `[::ffff:127.0.0.99]:${web.port}`, 403],
    ])('refuses an authority with %s', async (_, authority, expected) => {
      const { status } = await connectThrough(proxy, authority(), { auth });
      expect(status).toBe(expected);
    });

    it('accepts case and a trailing dot as the same name', async () => {
      const { socket, status } = await connectThrough(proxy, `SSH.Allowed.TEST.:${ssh.port}`, {
        auth,
      });
      expect(status).toBe(200);
      socket.destroy();
    });

    it('answers 407 without identity, and for a wrong secret', async () => {
      const anonymous = await connectThrough(proxy, `allowed.test:${web.port}`, {
        localAddress: '127.77.0.200',
      });
      expect(anonymous.status).toBe(407);
      expect(anonymous.head).toMatch(/Proxy-Authenticate: Basic realm="moat"/i);
      const wrong = await connectThrough(proxy, `allowed.test:${web.port}`, {
        auth: `${SANDBOX}:not-the-secret`,
        localAddress: SOURCE,
      });
      expect(wrong.status).toBe(407);
    });

    it('answers 502 when the destination refuses the connection', async () => {
      const closed = net.createServer();
      const port = await new Promise<number>((resolve) =>
        closed.listen(0, '127.0.0.13', () => resolve((closed.address() as net.AddressInfo).port)),
      );
      await new Promise((resolve) => closed.close(resolve));
      const { status, body } = await connectThrough(proxy, `closed.allowed.test:${port}`, { auth });
      expect(status).toBe(502);
      expect(JSON.parse(body).message).toContain(`closed.allowed.test:${port}`);
    });

    it('opens no tunnel for a client that ended while its destination was being resolved', async () => {
      const socket = net.connect({ ...proxy });
      socket.on('error', () => {});
      await new Promise((resolve) => socket.once('connect', resolve));
      const basic = Buffer.from(auth).toString('base64');
      // slow.allowed.test is answered after 150 ms; the client is gone long before.
      socket.end(
        `CONNECT slow.allowed.test:${ssh.port} HTTP/1.1\r\nProxy-Authorization: Basic ${basic}\r\n\r\n`,
      );
      await new Promise((resolve) => setTimeout(resolve, 400));
      expect(moat.tunnels.count(SANDBOX)).toBe(0);
      socket.destroy();
    });

    it('gives no tunnel to a sandbox removed while its destination was being resolved', async () => {
      // slow.allowed.test is answered 150 ms after it is asked; the sandbox goes once it is.
      const asked = upstream.asked('slow.allowed.test').length;
      const pending = connectThrough(proxy, `slow.allowed.test:${ssh.port}`, { auth });
      await waitFor(async () => upstream.asked('slow.allowed.test').length > asked);
      moat.table.remove(SANDBOX);
      const { status, body, socket } = await pending;
      socket.destroy();
      expect(status).toBe(403);
      expect(JSON.parse(body).message).toContain('was removed');
      expect(moat.tunnels.count(SANDBOX)).toBe(0);
    });

    it("answers HEAD with its refusal's header fields and no body, and the connection goes on", async () => {
      const socket = net.connect({ ...proxy });
      socket.on('error', () => {});
      await new Promise((resolve) => socket.once('connect', resolve));
      const credentials = `Proxy-Authorization: Basic ${Buffer.from(auth).toString('base64')}\r\n`;
      socket.write(
        `HEAD http://denied.test:${web.port}/ HTTP/1.1\r\nHost: denied.test\r\n${credentials}\r\n`,
      );
      const refused = await readUntil(socket, (text) => text.includes('\r\n\r\n'), 2000);
      expect(refused).toMatch(/^HTTP\/1\.1 403/);
      expect(refused).toMatch(/Content-Length: [1-9]/);
      expect(refused.endsWith('\r\n\r\n')).toBe(true);
      socket.write(
        `GET http://allowed.test:${web.port}/next HTTP/1.1\r\nHost: allowed.test\r\n${credentials}\r\n`,
      );
      expect(await readUntil(socket, (text) => text.includes('}'), 2000)).toMatch(
        /^HTTP\/1\.1 200/,
      );
      socket.destroy();
    });

    it('forwards no request decided for a sandbox paused and resumed while its name was resolved', async () => {
      const socket = net.connect({ ...proxy });
      socket.on('error', () => {});
      await new Promise((resolve) => socket.once('connect', resolve));
      const basic = Buffer.from(auth).toString('base64');
      // slowweb.allowed.test is answered SLOW_ANSWER_MS after it is asked.
      const asked = upstream.asked('slowweb.allowed.test').length;
      socket.write(
        `GET http://slowweb.allowed.test:${web.port}/secret HTTP/1.1\r\nHost: slowweb.allowed.test\r\n` +
          `Proxy-Authorization: Basic ${basic}\r\n\r\n`,
      );
      const answer = readUntil(socket, (text) => text.includes('}'), SLOW_ANSWER_MS + 2000);
      await waitFor(async () => upstream.asked('slowweb.allowed.test').length > asked);
      // Paused and resumed: a new record, which its owner then narrows.
      moat.table.remove(SANDBOX);
      moat.table.register(
        SANDBOX,
        { sourceAddress: ip(SOURCE), egressSecret: SECRET },
        policy(ALLOW_TEST),
      );
      moat.table.publish(
        SANDBOX,
        policy({ allowOut: ['www.allowed.test'], denyOut: ['0.0.0.0/0'] }),
      );
      const text = await answer;
      socket.destroy();
      expect(text).toMatch(/^HTTP\/1\.1 403/);
      expect(text).toContain('was removed');
      expect(web.requests).toEqual([]);
    });
  });

  describe('server name checks inside CONNECT tunnels', () => {
    const tlsThrough = (authority: string, servername: string | undefined) =>
      connectThrough(proxy, authority, { auth }).then(
        ({ socket }) =>
          new Promise<string>((resolve) => {
            const client = tls.connect({ socket, servername, rejectUnauthorized: false });
            let text = '';
            client.on('data', (chunk) => {
              text += chunk;
              if (text.includes('\n')) {
                client.destroy();
                resolve(text.trim());
              }
            });
            client.on('error', () => resolve(`closed:${text}`));
            client.on('close', () => resolve(`closed:${text}`));
          }),
      );

    it('lets a ClientHello whose SNI matches the CONNECT host through', async () => {
      expect(await tlsThrough(`tls.allowed.test:${secure.port}`, 'tls.allowed.test')).toBe(
        'sni=tls.allowed.test',
      );
    });

    it('closes the tunnel when the SNI names another host (domain fronting)', async () => {
      expect(await tlsThrough(`tls.allowed.test:${secure.port}`, 'denied.test')).toBe('closed:');
    });

    it('passes a TLS 1.3 handshake that the server retries (HelloRetryRequest)', async () => {
      const retrying = await tlsEchoOrigin('127.0.0.15', 0, { helloRetry: true });
      try {
        const { socket } = await connectThrough(proxy, `retry.allowed.test:${retrying.port}`, {
          auth,
        });
        const client = tls.connect({
          socket,
          servername: 'retry.allowed.test',
          rejectUnauthorized: false,
        });
        const line = await new Promise<string>((resolve, reject) => {
          client.on('data', (chunk: Buffer) => resolve(chunk.toString().trim()));
          client.on('error', reject);
        });
        expect(line).toBe('sni=retry.allowed.test');
        // The key share the client offered first was not taken: the server asked again.
        expect(client.getEphemeralKeyInfo()).toMatchObject({ name: 'secp384r1' });
        client.destroy();
      } finally {
        await retrying.close();
      }
    });

    it('checks the second ClientHello after a HelloRetryRequest (domain fronting on the retry)', async () => {
      // An origin that answers any ClientHello with a HelloRetryRequest and records what it gets.
      const received: Buffer[] = [];
      const accepted: net.Socket[] = [];
      const origin = net.createServer((socket) => {
        accepted.push(socket);
        socket.on('error', () => socket.destroy());
        socket.once('data', () => socket.write(inRecords(serverHello(true))));
        socket.on('data', (chunk: Buffer) => received.push(chunk));
      });
      await new Promise<void>((resolve) => origin.listen(0, '127.0.0.15', resolve));
      const port = (origin.address() as net.AddressInfo).port;
      try {
        const first = inRecords(clientHello('retry.allowed.test'));
        const { socket, status } = await connectThrough(proxy, `retry.allowed.test:${port}`, {
          auth,
        });
        expect(status).toBe(200);
        socket.write(first);
        const retry = inRecords(serverHello(true));
        await readUntil(socket, (text) => text.length >= retry.length, 2000);
        socket.write(Buffer.concat([record('ccs'), inRecords(clientHello('denied.test'))]));
        expect(await readUntil(socket, () => false, 1000)).toBe('');
        expect(socket.destroyed).toBe(true);
        // The origin got the first ClientHello and not one byte after it.
        expect(Buffer.concat(received)).toEqual(first);
      } finally {
        for (const socket of accepted) socket.destroy();
        await new Promise((resolve) => origin.close(resolve));
      }
    });

    it('closes the tunnel when its first TLS record is not a ClientHello (an alert, say)', async () => {
      const { socket, status } = await connectThrough(proxy, `tls.allowed.test:${secure.port}`, {
        auth,
      });
      expect(status).toBe(200);
      // A warning alert (user_canceled): some TLS stacks skip it and read a ClientHello after it.
      socket.write(Buffer.from([0x15, 0x03, 0x01, 0x00, 0x02, 0x01, 0x5a]));
      expect(await readUntil(socket, () => false, 1000)).toBe('');
      expect(socket.destroyed).toBe(true);
    });

    it('passes a first message that merely starts with a TLS record type byte (a database, say)', async () => {
      const { socket, status } = await connectThrough(proxy, `ssh.allowed.test:${ssh.port}`, {
        auth,
      });
      expect(status).toBe(200);
      // A length-prefixed message whose length starts with 0x15: no TLS version follows.
      socket.write(Buffer.from([0x15, 0x01, 0x00, 0x00, 0x61, 0x62]));
      expect(await readUntil(socket, (t) => t.includes('ab'))).toContain('ab');
      socket.destroy();
    });

    it('checks the Host header of plain HTTP on any port, as origins route it by Host there too', async () => {
      const fronted = await connectThrough(proxy, `allowed.test:${web.port}`, { auth });
      expect(fronted.status).toBe(200);
      fronted.socket.write('GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n');
      expect(await readUntil(fronted.socket, () => false, 500)).toBe('');
      expect(fronted.socket.destroyed).toBe(true);
      expect(web.requests).toEqual([]);
      const named = await connectThrough(proxy, `allowed.test:${web.port}`, { auth });
      named.socket.write(`GET / HTTP/1.1\r\nHost: allowed.test:${web.port}\r\n\r\n`);
      expect(await readUntil(named.socket, (t) => t.includes('}'))).toContain('200 OK');
      named.socket.destroy();
    });

    it('passes other plain protocols unchecked once their first line shows they are not HTTP', async () => {
      const { socket, status } = await connectThrough(proxy, `ssh.allowed.test:${ssh.port}`, {
        auth,
      });
      expect(status).toBe(200);
      await readUntil(socket, (t) => t.includes('\r\n'));
      // A command line of a text protocol, then what would be a request: the tunnel is not
      // HTTP, and an origin that speaks HTTP refused its first line already.
      socket.write('SET key value\r\nGET / HTTP/1.1\r\nHost: denied.test\r\n\r\n');
      expect(await readUntil(socket, (t) => t.includes('denied.test'))).toContain('SET key value');
      socket.destroy();
    });

    it('checks the Host header of plain HTTP in tunnels to port 80', async (context) => {
      let port80: Awaited<ReturnType<typeof httpEchoOrigin>>;
      try {
        port80 = await httpEchoOrigin(port80Host, 80);
      } catch (error) {
        console.log(
          `skipped: cannot listen on port 80 (${(error as NodeJS.ErrnoException).code}); needs root`,
        );
        return context.skip();
      }
      try {
        const fronted = await connectThrough(proxy, 'port80.allowed.test:80', { auth });
        fronted.socket.write('GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n');
        expect(await readUntil(fronted.socket, () => false, 1000)).toBe('');
        expect(fronted.socket.destroyed).toBe(true);
        const honest = await connectThrough(proxy, 'port80.allowed.test:80', { auth });
        honest.socket.write('GET / HTTP/1.1\r\nHost: port80.allowed.test\r\n\r\n');
        expect(await readUntil(honest.socket, (t) => t.includes('}'))).toContain(
          '"host":"port80.allowed.test"',
        );
        honest.socket.destroy();
        // Every request on the tunnel is checked, not only the first.
        const closedAfter = async (...writes: string[]) => {
          const tunnel = await connectThrough(proxy, 'port80.allowed.test:80', { auth });
          const text = readUntil(tunnel.socket, () => false, 1500);
          for (const bytes of writes) {
            tunnel.socket.write(bytes);
            await new Promise((resolve) => setTimeout(resolve, 100));
          }
          await text;
          return tunnel.socket.destroyed;
        };
        const good = 'GET /ok HTTP/1.1\r\nHost: port80.allowed.test\r\n\r\n';
        const later = 'GET /secret HTTP/1.1\r\nHost: denied.test\r\n\r\n';
        port80.requests.length = 0;
        expect(await closedAfter(good, later), 'a later request').toBe(true);
        expect(await closedAfter(good + later), 'a pipelined one').toBe(true);
        expect(
          await closedAfter(
            'GET http://denied.test/secret HTTP/1.1\r\nHost: port80.allowed.test\r\n\r\n',
          ),
          'an absolute-form target',
        ).toBe(true);
        expect(
          await closedAfter('GET / HTTP/1.1\r\nHost: port80.allowed.test\r\nUpgrade: x\r\n\r\n'),
          'an upgrade to another protocol than WebSocket',
        ).toBe(true);
        expect(port80.requests.map((headers) => headers.host)).toEqual(['port80.allowed.test']);
      } finally {
        await port80.close();
      }
    });

    it('lets a tunnel to port 80 switch to WebSocket, holding client bytes until the origin agrees', async (context) => {
      // An origin that answers each request 100 ms after it is asked: /ws with a real switch
      // (recording what reaches it meanwhile), then echoes; /canned with a 101 that proves
      // nothing, staying HTTP; anything else with 426.
      const heads: string[] = [];
      const early: Buffer[] = [];
      const REFUSED = 'HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n';
      const CANNED = 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n';
      const KEY = 'dGhlIHNhbXBsZSBub25jZQ==';
      const SWITCHED =
        'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
        'Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n';
      const origin = net.createServer({ allowHalfOpen: true }, (socket) => {
        socket.on('error', () => {});
        socket.on('end', () => setTimeout(() => socket.end(), 300));
        let state: 'http' | 'agreeing' | 'switched' = 'http';
        let buffered = Buffer.alloc(0);
        socket.on('data', (chunk: Buffer) => {
          if (state === 'switched') return void socket.write(chunk);
          if (state === 'agreeing') return void early.push(chunk);
          buffered = Buffer.concat([buffered, chunk]);
          for (let end; state === 'http' && (end = buffered.indexOf('\r\n\r\n')) >= 0;) {
            const head = buffered.toString('latin1', 0, end);
            buffered = buffered.subarray(end + 4);
            heads.push(head.split('\r\n')[0]!);
            const agrees = head.startsWith('GET /ws ');
            if (agrees) state = 'agreeing';
            if (agrees && buffered.length > 0) early.push(buffered);
            setTimeout(() => {
              if (agrees) state = 'switched';
              socket.write(agrees ? SWITCHED : head.startsWith('GET /canned ') ? CANNED : REFUSED);
            }, 100);
          }
        });
      });
      try {
        await new Promise<void>((resolve, reject) =>
          origin.once('error', reject).listen(80, port80Host, resolve),
        );
      } catch (error) {
        console.log(
          `skipped: cannot listen on port 80 (${(error as NodeJS.ErrnoException).code}); needs root`,
        );
        return context.skip();
      }
      const upgrade = (path: string, protocol = 'websocket') =>
        `GET ${path} HTTP/1.1\r\nHost: port80.allowed.test\r\nUpgrade: ${protocol}\r\n` +
        `Connection: Upgrade\r\nSec-WebSocket-Key: ${KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n`;
      const next = (path: string) => `GET ${path} HTTP/1.1\r\nHost: port80.allowed.test\r\n\r\n`;
      const fronted = 'GET /secret HTTP/1.1\r\nHost: denied.test\r\n\r\n';
      /** Everything a tunnel's socket reads until `bytes` have come, or it closes, or 3 s pass. */
      const received = (socket: net.Socket, bytes = Number.MAX_SAFE_INTEGER) =>
        new Promise<Buffer>((resolve) => {
          const chunks: Buffer[] = [];
          let length = 0;
          const done = () => {
            clearTimeout(timer);
            socket.off('data', onData);
            resolve(Buffer.concat(chunks));
          };
          const onData = (chunk: Buffer) => {
            chunks.push(chunk);
            length += chunk.length;
            if (length >= bytes) done();
          };
          const timer = setTimeout(done, 3000);
          socket.on('data', onData).once('close', done).resume();
        });
      const tunnel = async () =>
        (await connectThrough(proxy, 'port80.allowed.test:80', { auth })).socket;
      try {
        // Switched: the frame sent with the request reaches the origin only after its 101, and
        // what follows (4 MiB that are not HTTP) goes both ways unchecked.
        const switched = await tunnel();
        const frame = Buffer.from([0x82, 0x84, 1, 2, 3, 4, 5, 6, 7, 8]);
        const answer = received(switched, SWITCHED.length + frame.length);
        switched.write(Buffer.concat([Buffer.from(upgrade('/ws')), frame]));
        expect((await answer).toString('latin1')).toBe(SWITCHED + frame.toString('latin1'));
        expect(early).toEqual([]);
        const bulk = Buffer.alloc(4 * 1024 * 1024);
        for (let i = 0; i < bulk.length; i += 4) bulk.writeUInt32LE((i * 2654435761) >>> 0, i);
        const echoed = received(switched, bulk.length);
        switched.write(bulk);
        expect((await echoed).equals(bulk)).toBe(true);
        switched.destroy();

        // Refused by the origin: the tunnel stays HTTP. The request held meanwhile is checked
        // and goes on; a fronted one later closes the tunnel without reaching the origin.
        const declined = await tunnel();
        const refusals = received(declined, 2 * REFUSED.length);
        declined.write(upgrade('/no') + next('/next'));
        expect((await refusals).toString('latin1')).toBe(REFUSED + REFUSED);
        const closing = received(declined);
        declined.write(fronted);
        expect((await closing).length).toBe(0);
        expect(declined.destroyed).toBe(true);
        // A client that ends with bytes held: they go on before its end does.
        const ending = await tunnel();
        const last = received(ending);
        ending.end(upgrade('/no') + next('/last'));
        expect((await last).toString('latin1')).toBe(REFUSED + REFUSED);
        // A 101 that proves nothing (no Sec-WebSocket-Accept) from an origin that stays HTTP
        // ends no check.
        const canned = await tunnel();
        const cannedAnswer = received(canned);
        canned.write(upgrade('/canned') + fronted);
        expect((await cannedAnswer).length).toBe(0);
        expect(canned.destroyed).toBe(true);
        // Another protocol is refused before the origin sees it.
        const h2c = await tunnel();
        const closed = received(h2c);
        h2c.write(upgrade('/ws', 'h2c'));
        expect((await closed).length).toBe(0);
        expect(h2c.destroyed).toBe(true);
        expect(heads).toEqual(
          ['/ws', '/no', '/next', '/no', '/last', '/canned'].map((path) => `GET ${path} HTTP/1.1`),
        );
      } finally {
        await new Promise((resolve) => origin.close(resolve));
      }
    });
  });

  describe('absolute-form HTTP', () => {
    it('forwards with the Host of the absolute URI and strips proxy and hop-by-hop headers', async () => {
      const response = await proxyGet(`http://www.allowed.test:${web.port}/path?q=1`, {
        auth,
        headers: { host: 'denied.test', 'proxy-connection': 'keep-alive', 'x-custom': 'kept' },
      });
      expect(response.status).toBe(200);
      expect(response.body.host).toBe(`www.allowed.test:${web.port}`);
      expect(response.body.path).toBe('/path?q=1');
      const seen = web.requests[0]!;
      expect(seen['proxy-authorization']).toBeUndefined();
      expect(seen['proxy-connection']).toBeUndefined();
      expect(seen['x-custom']).toBe('kept');
    });

    it('decides every request on a keep-alive connection on its own', async () => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      const first = await proxyGet(`http://allowed.test:${web.port}/`, { auth, agent });
      const second = await proxyGet(`http://denied.test:${web.port}/`, { auth, agent });
      const third = await proxyGet(`http://allowed.test:${web.port}/again`, { auth, agent });
      agent.destroy();
      expect([first.status, second.status, third.status]).toEqual([200, 403, 200]);
      expect(second.headers['x-moat-decision']).toBe('deny; list=denyOut; rule="0.0.0.0/0"');
      expect(web.requests).toHaveLength(2);
    });

    it('reuses pooled upstream connections without piling listeners onto them', async () => {
      const warnings: string[] = [];
      const onWarning = (warning: Error) => warnings.push(warning.name);
      process.on('warning', onWarning);
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      for (let i = 0; i < 20; i++) {
        expect(
          (await proxyGet(`http://allowed.test:${web.port}/${i}`, { auth, agent })).status,
        ).toBe(200);
      }
      agent.destroy();
      await new Promise((resolve) => setImmediate(resolve));
      process.off('warning', onWarning);
      expect(warnings).not.toContain('MaxListenersExceededWarning');
    });

    it('refuses a header whose name folds into a framing one, before any byte leaves', async () => {
      // Beside the Content-Length Moat frames by, an origin that reads "_" as "-" would see a
      // chunked body end where Moat saw none, and the rest as a request of its own.
      const socket = net.connect(proxy);
      const credential = Buffer.from(auth).toString('base64');
      socket.write(
        `POST http://allowed.test:${web.port}/ HTTP/1.1\r\nHost: allowed.test\r\n` +
          `Proxy-Authorization: Basic ${credential}\r\nContent-Length: 5\r\n` +
          'Transfer_Encoding: chunked\r\n\r\n0\r\n\r\n',
      );
      const answer = await readUntil(socket, (t) => t.includes('}'));
      socket.destroy();
      expect(answer).toMatch(/^HTTP\/1\.1 400 /);
      expect(answer).toContain('Transfer_Encoding would read as transfer-encoding');
      expect(web.requests).toEqual([]);
    });

    it('answers 407 without identity and 400 for origin-form requests', async () => {
      const anonymous = await proxyGet(`http://allowed.test:${web.port}/`);
      expect(anonymous.status).toBe(407);
      const origin = await proxyGet('/just-a-path', { auth });
      expect(origin.status).toBe(400);
      expect(origin.body.message).toMatch(/absolute-form/);
    });
  });

  describe('live policy', () => {
    it('closes an open tunnel that a republished policy denies, within 100 ms', async () => {
      const { socket, status } = await connectThrough(proxy, `ssh.allowed.test:${ssh.port}`, {
        auth,
      });
      expect(status).toBe(200);
      await readUntil(socket, (t) => t.includes('\r\n'));
      const closed = new Promise<number>((resolve) =>
        socket.once('close', () => resolve(performance.now())),
      );
      const published = performance.now();
      moat.table.publish(
        SANDBOX,
        policy({ allowOut: ['www.allowed.test'], denyOut: ['0.0.0.0/0'] }),
      );
      expect((await closed) - published).toBeLessThan(100);
    });

    it('keeps tunnels the new policy still allows', async () => {
      const { socket } = await connectThrough(proxy, `ssh.allowed.test:${ssh.port}`, { auth });
      await readUntil(socket, (t) => t.includes('\r\n'));
      moat.table.publish(
        SANDBOX,
        policy({ allowOut: ['ssh.allowed.test'], denyOut: ['0.0.0.0/0'] }),
      );
      socket.write('still\n');
      expect(await readUntil(socket, (t) => t.includes('still'))).toBe('still\n');
      socket.destroy();
    });

    it('closes every connection of a sandbox that is removed', async () => {
      const tunnels = await Promise.all(
        [1, 2, 3].map(() => connectThrough(proxy, `ssh.allowed.test:${ssh.port}`, { auth })),
      );
      const closed = Promise.all(
        // Each client keeps reading, as a real one would, so it sees the close.
        tunnels.map(
          ({ socket }) => new Promise((resolve) => socket.once('close', resolve).resume()),
        ),
      );
      moat.table.remove(SANDBOX);
      await closed;
      expect(moat.tunnels.count(SANDBOX)).toBe(0);
    });
  });

  describe('limits', () => {
    it('refuses tunnels past the per-sandbox cap with 429', async () => {
      const open = await Promise.all(
        Array.from({ length: 8 }, () =>
          connectThrough(proxy, `ssh.allowed.test:${ssh.port}`, { auth }),
        ),
      );
      expect(open.every((t) => t.status === 200)).toBe(true);
      const extra = await connectThrough(proxy, `ssh.allowed.test:${ssh.port}`, { auth });
      expect(extra.status).toBe(429);
      // --metrics-per-sandbox: the open connections show under the sandbox's own label.
      const series = `moat_proxy_sandbox_active_tunnels{sandbox_id="${SANDBOX}"}`;
      expect(await moat.metrics.registry.metrics()).toContain(`${series} 8`);
      for (const t of [...open, extra]) t.socket.destroy();
      await waitFor(async () => !(await moat.metrics.registry.metrics()).includes(series));
    });

    it('holds the cap for tunnels still being resolved and dialled, not only open ones', async () => {
      // Every connection of the tests before is closed (a refused one stays charged to its
      // source address until it is), so each of the 20 is charged against the cap alone.
      await waitFor(async () => moat.connections.total === 0);
      // slow.allowed.test takes 150 ms to resolve: all 20 are read before any is open. Each is
      // charged from accept: to its source address (no sandbox's) until its credential names
      // the sandbox; past the cap, one is reset at accept or answered 429 once named.
      const tunnels = await Promise.all(
        Array.from({ length: 20 }, () =>
          connectThrough(proxy, `slow.allowed.test:${ssh.port}`, { auth }).catch(() => undefined),
        ),
      );
      const statuses = tunnels.map((t) => t?.status ?? 'reset');
      for (const t of tunnels) t?.socket.destroy();
      expect(statuses.filter((s) => s === 200)).toHaveLength(8);
      expect(statuses.filter((s) => s === 429 || s === 'reset')).toHaveLength(12);
    });

    it('counts transparent connections (even those still naming their host) against the cap', async () => {
      const transparent = moat.listening.transparent!;
      const open = await Promise.all(
        Array.from({ length: 9 }, () => {
          const socket = net.connect({ ...transparent, localAddress: SOURCE });
          socket.on('error', () => {});
          // The ninth may be reset before its client saw the connect.
          return new Promise<net.Socket>((resolve) => {
            socket.once('connect', () => resolve(socket));
            socket.once('close', () => resolve(socket));
          });
        }),
      );
      // Eight wait for their first bytes; the ninth is closed at once.
      await waitFor(async () => open.filter((s) => s.destroyed || s.readableEnded).length === 1);
      for (const socket of open) socket.destroy();
      await waitFor(async () => moat.connections.held(SANDBOX) === 0);
    });

    it('respects a slow reader: the origin cannot push far ahead of what the client reads', async () => {
      let written = 0;
      const chunk = Buffer.alloc(64 * 1024, 1);
      const firehose = net.createServer((socket) => {
        socket.on('error', () => {});
        const push = () => {
          while (written < 512 * 1024 * 1024 && socket.write(chunk)) written += chunk.length;
          if (written < 512 * 1024 * 1024) socket.once('drain', push);
        };
        push();
      });
      const port = await new Promise<number>((resolve) =>
        firehose.listen(0, '127.0.0.10', () =>
          resolve((firehose.address() as net.AddressInfo).port),
        ),
      );
      const { socket, status } = await connectThrough(proxy, `allowed.test:${port}`, { auth });
      expect(status).toBe(200);
      try {
        socket.pause();
        await new Promise((resolve) => setTimeout(resolve, 1000));
        const stalled = written;
        await new Promise((resolve) => setTimeout(resolve, 500));
        // The origin stopped, having filled the kernel buffers on two loopback connections and
        // Node's stream buffers: a few MiB (tens where tcp_rmem allows it), not 512.
        expect(written).toBe(stalled);
        expect(written).toBeLessThan(kernelBufferedMax(2) + 4 * 1024 * 1024);
      } finally {
        socket.destroy();
      }
      await new Promise((resolve) => firehose.close(resolve));
    });
  });

  describe('transparent listener', () => {
    const transparent = () => moat.listening.transparent!;
    /** A connection to the transparent listener from a sandbox (or another) source address. */
    const toTransparent = (localAddress = SOURCE) =>
      net.connect({ host: '127.0.0.1', port: transparent().port, localAddress });

    it('decides TLS by its SNI and splices to the named host', async () => {
      const text = await new Promise<string>((resolve, reject) => {
        const raw = toTransparent();
        const client = tls.connect({
          socket: raw,
          servername: 'tls.allowed.test',
          rejectUnauthorized: false,
        });
        client.on('data', (chunk) => {
          client.destroy();
          resolve(String(chunk).trim());
        });
        client.on('error', reject);
      });
      expect(text).toBe('sni=tls.allowed.test');
    });

    it('decides plain HTTP by its Host header', async () => {
      const socket = toTransparent();
      socket.write('GET /through HTTP/1.1\r\nHost: www.allowed.test\r\nConnection: close\r\n\r\n');
      const text = await readUntil(socket, (t) => t.includes('}'));
      expect(text).toContain('"path":"/through"');
      expect(text).toContain('"host":"www.allowed.test"');
    });

    it('checks every request on a plain HTTP connection, not only the first', async () => {
      const socket = toTransparent();
      socket.write('GET /first HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n');
      expect(await readUntil(socket, (t) => t.includes('}'))).toContain('"path":"/first"');
      web.requests.length = 0;
      socket.write('GET /second HTTP/1.1\r\nHost: denied.test\r\n\r\n');
      expect(await readUntil(socket, () => false, 1000)).toBe('');
      expect(socket.destroyed).toBe(true);
      expect(web.requests).toEqual([]);
    });

    it('lets a plain HTTP connection switch to WebSocket when the origin agrees', async () => {
      const socket = toTransparent();
      socket.write(
        'GET /ws HTTP/1.1\r\nHost: www.allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
          'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\nframe',
      );
      expect(await readUntil(socket, (t) => t.endsWith('frame'))).toMatch(
        /^HTTP\/1\.1 101 [^]*\r\n\r\nframe$/,
      );
      // Frames from now on, whatever they hold.
      socket.write('GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n');
      expect(await readUntil(socket, (t) => t.includes('denied'))).toContain('denied.test');
      socket.destroy();
    });

    it('closes connections that name a denied host, name no host, or come from no sandbox', async () => {
      /** How the connection ended with no answer: `reset` or `closed`; false if answered. */
      const closedWithout = async (payload: string, localAddress = SOURCE) => {
        const socket = toTransparent(localAddress);
        let reset = false;
        socket.on('error', (error: NodeJS.ErrnoException) => {
          reset = error.code === 'ECONNRESET';
        });
        socket.write(payload);
        const text = await readUntil(socket, () => false, 2000);
        return text === '' && socket.destroyed && (reset ? 'reset' : 'closed');
      };
      expect(await closedWithout('GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n')).toBe('closed');
      // Nothing to decide: refused as the firewall refuses, with a reset.
      expect(await closedWithout('GET / HTTP/1.1\r\n\r\n')).toBe('reset');
      expect(
        await closedWithout('GET / HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n', '127.77.0.201'),
      ).toBe('closed');
    });
  });

  describe('the host is never a destination', () => {
    // Loopback is this host's, and no longer internal here: what stands between a sandbox and
    // the host's own services (the origins of this suite among them) is the host check alone.
    const HOST_SANDBOX = 'ihostsandbox000000001';
    const hostAuth = `${HOST_SANDBOX}:host-secret`;
    let own: ReturnType<typeof scratchMoatFlags>;
    let guarded: RunningMoat;
    const hostPolicy = (config: object) =>
      compilePolicy(parseNetworkConfigOrThrow(config), guarded.internal);

    beforeAll(async () => {
      own = scratchMoatFlags();
      guarded = await startTestMoat(
        { 'internal-deny': '10.0.0.0/8', 'source-pool': '127.79.0.0/16', ...own.flags },
        'this host',
      );
    });
    afterAll(async () => {
      await guarded.stop();
      own.remove();
    });
    beforeEach(() => {
      guarded.table.remove(HOST_SANDBOX);
      guarded.table.register(
        HOST_SANDBOX,
        { sourceAddress: ip('127.79.0.2'), egressSecret: 'host-secret' },
        hostPolicy({}),
      );
      web.requests.length = 0;
    });

    const refusedAsHost = (status: number, body: string) => {
      expect(status).toBe(403);
      expect(JSON.parse(body).message).toMatch(/denied by host: the address is the host itself/);
    };

    it('refuses CONNECT to a service of the host, whatever the policy allows', async () => {
      for (const rules of [{}, { allowOut: ['127.0.0.0/8'], denyOut: ['0.0.0.0/0'] }]) {
        guarded.table.publish(HOST_SANDBOX, hostPolicy(rules));
        const { status, body, head } = await connectThrough(
          guarded.listening.proxy,
          `127.0.0.12:${ssh.port}`,
          { auth: hostAuth },
        );
        refusedAsHost(status, body);
        expect(head).toMatch(/X-Moat-Decision: deny; list=host(\r\n|$)/i);
      }
    });

    it('refuses an allowed name whose DNS answer is the host, on CONNECT and absolute-form', async () => {
      guarded.table.publish(HOST_SANDBOX, hostPolicy(ALLOW_TEST));
      const tunnel = await connectThrough(guarded.listening.proxy, `ssh.allowed.test:${ssh.port}`, {
        auth: hostAuth,
      });
      refusedAsHost(tunnel.status, tunnel.body);
      const credential = Buffer.from(hostAuth).toString('base64');
      for (const url of [
        `http://allowed.test:${web.port}/`,
        `http://127.0.0.10:${web.port}/`,
        `http://[::ffff:127.0.0.10]:${web.port}/`,
      ]) {
        const socket = net.connect(guarded.listening.proxy);
        socket.write(
          `GET ${url} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic ${credential}\r\n\r\n`,
        );
        const answer = await readUntil(socket, (t) => t.includes('}'));
        socket.destroy();
        expect(answer, url).toMatch(/^HTTP\/1\.1 403 /);
        expect(answer, url).toContain('the host itself');
      }
      expect(web.requests).toEqual([]);
    });

    it("refuses Moat's own listeners, through any address that reaches them", async () => {
      for (const authority of [
        `127.0.0.1:${guarded.listening.api.port}`,
        `127.0.0.1:${guarded.listening.proxy.port}`,
        `0.0.0.0:${guarded.listening.proxy.port}`,
        `[::ffff:0.0.0.0]:${guarded.listening.dns.port}`,
        `[::]:${guarded.listening.api.port}`,
      ]) {
        const { status, body } = await connectThrough(guarded.listening.proxy, authority, {
          auth: hostAuth,
        });
        expect(status, authority).toBe(403);
        expect(JSON.parse(body).message, authority).toContain('the host itself');
      }
    });

    it('closes a transparent connection whose name resolves to the host', async () => {
      guarded.table.publish(HOST_SANDBOX, hostPolicy(ALLOW_TEST));
      const socket = net.connect({
        host: '127.0.0.1',
        port: guarded.listening.transparent!.port,
        localAddress: '127.79.0.2',
      });
      socket.on('error', () => {});
      socket.write('GET / HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n');
      expect(await readUntil(socket, () => false, 1000)).toBe('');
      expect(socket.destroyed).toBe(true);
      expect(web.requests).toEqual([]);
    });

    it('strips the host from DNS answers for an allowed name, and learns nothing', async () => {
      guarded.table.publish(HOST_SANDBOX, hostPolicy(ALLOW_TEST));
      const reply = await udpQuery(guarded.listening.dns.port, '127.79.0.2', 'allowed.test');
      expect(reply.rcode).toBe('NOERROR');
      expect(reply.answers).toEqual([]);
      expect(guarded.table.get(HOST_SANDBOX)!.learned.size).toBe(0);
    });

    it('opens only the host ports the operator names, to what the policy allows', async () => {
      const flags = scratchMoatFlags();
      const opened = await startTestMoat(
        {
          'internal-deny': '10.0.0.0/8',
          'allow-host-ports': String(web.port),
          'source-pool': '127.79.0.0/16',
          ...flags.flags,
        },
        'this host',
      );
      try {
        const rules = parseNetworkConfigOrThrow({
          allowOut: ['127.0.0.10'],
          denyOut: ['0.0.0.0/0'],
        });
        opened.table.register(
          HOST_SANDBOX,
          { egressSecret: 'host-secret' },
          compilePolicy(rules, opened.internal),
        );
        const through = (authority: string) =>
          connectThrough(opened.listening.proxy, authority, { auth: hostAuth });
        const allowed = await through(`127.0.0.10:${web.port}`);
        expect(allowed.status).toBe(200);
        allowed.socket.destroy();
        // The policy still decides: the opened port of an address it denies stays shut.
        expect((await through(`127.0.0.12:${web.port}`)).status).toBe(403);
        // Another port of the same host address stays shut whatever the policy says.
        const other = await through(`127.0.0.10:${ssh.port}`);
        refusedAsHost(other.status, other.body);
      } finally {
        await opened.stop();
        flags.remove();
      }
    });

    it('refuses to start with a host port opened where Moat itself listens', async () => {
      const free = net.createServer();
      await new Promise<void>((resolve) => free.listen(0, '127.0.0.1', resolve));
      const port = (free.address() as net.AddressInfo).port;
      await new Promise((resolve) => free.close(resolve));
      const flags = scratchMoatFlags();
      await expect(
        startTestMoat(
          { 'proxy-listen': `127.0.0.1:${port}`, 'allow-host-ports': String(port), ...flags.flags },
          'this host',
        ),
      ).rejects.toThrow(`--allow-host-ports names ${port}, where Moat itself listens`);
      flags.remove();
    });
  });

  describe('shutdown', () => {
    it('closes CONNECT clients still being resolved, dials none of them after, and keeps no socket', async () => {
      const own = scratchMoatFlags();
      const relay = nativeTcp('auto');
      const before = relay?.stats().sockets ?? 0;
      const other = await startTestMoat({ 'internal-deny': '10.0.0.0/8', ...own.flags });
      try {
        other.table.register(
          'ishutdownsandbox00002',
          { sourceAddress: ip('127.78.0.3'), egressSecret: 's2' },
          compilePolicy(parseNetworkConfigOrThrow({}), other.internal),
        );
        const socket = net.connect(other.listening.proxy);
        socket.on('error', () => {});
        const credential = Buffer.from('ishutdownsandbox00002:s2').toString('base64');
        // Resolved SLOW_ANSWER_MS after it is asked: Moat stops while the name is upstream.
        const asked = upstream.asked('slowweb.allowed.test').length;
        socket.write(
          `CONNECT slowweb.allowed.test:${web.port} HTTP/1.1\r\nProxy-Authorization: Basic ${credential}\r\n\r\n`,
        );
        const answer = readUntil(socket, () => false, SLOW_ANSWER_MS + 1000);
        await waitFor(async () => upstream.asked('slowweb.allowed.test').length > asked);
        await other.stop();
        expect(await answer).toBe('');
        expect(socket.destroyed).toBe(true);
        // The dial that finished after shutdown left nothing open in the relay.
        if (other.proxy.io.io === 'native') {
          await new Promise((resolve) => setTimeout(resolve, 400));
          expect(relay!.stats().sockets).toBeLessThanOrEqual(before);
        }
      } finally {
        own.remove();
      }
    });

    it('closes transparent connections still being resolved, and splices none of them after', async () => {
      const own = scratchMoatFlags();
      const other = await startTestMoat({
        'internal-deny': '10.0.0.0/8',
        'source-pool': '127.78.0.0/16',
        ...own.flags,
      });
      try {
        other.table.register(
          'ishutdownsandbox00001',
          { sourceAddress: ip('127.78.0.2'), egressSecret: 's' },
          compilePolicy(parseNetworkConfigOrThrow({}), other.internal),
        );
        const socket = net.connect({ ...other.listening.transparent!, localAddress: '127.78.0.2' });
        socket.on('error', () => {});
        // Named at once, resolved SLOW_ANSWER_MS after: Moat stops while the name is upstream.
        const asked = upstream.asked('slowweb.allowed.test').length;
        socket.write('GET /late HTTP/1.1\r\nHost: slowweb.allowed.test\r\n\r\n');
        const answer = readUntil(socket, () => false, SLOW_ANSWER_MS + 1000);
        await waitFor(async () => upstream.asked('slowweb.allowed.test').length > asked);
        web.requests.length = 0;
        await other.stop();
        expect(await answer).toBe('');
        expect(socket.destroyed).toBe(true);
        expect(web.requests).toEqual([]);
      } finally {
        own.remove();
      }
    });
  });
}
