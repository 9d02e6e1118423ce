/**
 * The SOCKS5 client against a real SOCKS5 server and against hostile ones that answer with
 * garbage, short replies, refusals, floods or nothing at all. Every exchange is on loopback.
 */
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseIP } from '../../src/policy/index.js';
import { socksConnect, SocksError } from '../../src/proxy/socks5-client.js';
import { SocksServer } from '../support/socks5-server.js';

const ip = (text: string) => {
  const parsed = parseIP(text);
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.value;
};

/** A server that runs `script` on each connection, and the bytes each client sent it. */
async function fakeProxy(
  script: (socket: net.Socket, received: () => Buffer) => void,
): Promise<{ port: number; received: Buffer[]; close: () => Promise<void> }> {
  const received: Buffer[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    const index = received.push(Buffer.alloc(0)) - 1;
    socket.on('data', (chunk) => (received[index] = Buffer.concat([received[index]!, chunk])));
    socket.on('error', () => socket.destroy());
    script(socket, () => received[index]!);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    received,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

async function connected(port: number): Promise<net.Socket> {
  const socket = net.connect({ host: '127.0.0.1', port });
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  return socket;
}

/** The handshake's outcome: 'ok' or the SocksError message. */
async function handshake(
  port: number,
  options: { username?: string; password?: string; timeoutMs?: number } = {},
  destination: Parameters<typeof socksConnect>[1]['destination'] = {
    host: 'origin.test',
    port: 443,
  },
): Promise<{ outcome: string; socket: net.Socket; ms: number }> {
  const socket = await connected(port);
  const started = performance.now();
  try {
    await socksConnect(socket, { destination, timeoutMs: 1000, ...options });
    return { outcome: 'ok', socket, ms: performance.now() - started };
  } catch (error) {
    expect(error).toBeInstanceOf(SocksError);
    socket.destroy();
    return { outcome: (error as Error).message, socket, ms: performance.now() - started };
  }
}

const SUCCESS = Buffer.from([5, 0, 0, 1, 127, 0, 0, 1, 0x04, 0x38]);

describe('socksConnect against hostile proxies', () => {
  it('refuses a proxy that answers garbage, and never buffers a flood', async () => {
    const proxy = await fakeProxy((socket) => {
      // 4 MiB of garbage at once: read two bytes of it, no more.
      socket.write(Buffer.alloc(4 << 20, 0x48));
    });
    const { outcome } = await handshake(proxy.port);
    expect(outcome).toBe('it does not speak SOCKS5 (version byte 72 in its first reply)');
    await proxy.close();
  });

  it('names each malformed reply: method, authentication, CONNECT, address type, reserved byte', async () => {
    const cases: [Buffer[], string, { username?: string; password?: string }?][] = [
      [[Buffer.from([5, 0xff])], 'it requires authentication and no username was configured'],
      [
        [Buffer.from([5, 0x02])],
        'it chose username/password authentication, which was not offered',
      ],
      [[Buffer.from([5, 0x01])], 'it chose authentication method 1, which was not offered'],
      [
        [Buffer.from([5, 0x02]), Buffer.from([1, 1])],
        'it rejected the username and password',
        { username: 'u', password: 'wrong-secret' },
      ],
      [
        [Buffer.from([5, 0x02]), Buffer.from([9, 0])],
        'its authentication reply has version 9, not 1',
        { username: 'u', password: 'p' },
      ],
      [
        [Buffer.from([5, 0]), Buffer.from([5, 5, 0, 1, 0, 0, 0, 0, 0, 0])],
        'it could not connect: connection refused (SOCKS reply 5)',
      ],
      [
        [Buffer.from([5, 0]), Buffer.from([5, 0x7f, 0, 1, 0, 0, 0, 0, 0, 0])],
        'it could not connect: reply code 127 (SOCKS reply 127)',
      ],
      [
        [Buffer.from([5, 0]), Buffer.from([4, 0, 0, 1, 0, 0, 0, 0, 0, 0])],
        'its reply to CONNECT has version 4, not 5',
      ],
      [
        [Buffer.from([5, 0]), Buffer.from([5, 0, 7, 1, 0, 0, 0, 0, 0, 0])],
        'its reply to CONNECT has reserved byte 7, not 0',
      ],
      [
        [Buffer.from([5, 0]), Buffer.from([5, 0, 0, 9, 0, 0, 0, 0, 0, 0])],
        'its reply to CONNECT has unknown address type 9',
      ],
    ];
    for (const [replies, expected, login] of cases) {
      // One reply per message the client sends (greeting, login, CONNECT), as a proxy would.
      const proxy = await fakeProxy((socket) => {
        let next = 0;
        socket.on('data', () => {
          if (next < replies.length) socket.write(replies[next++]!);
        });
      });
      const { outcome } = await handshake(proxy.port, login);
      expect(outcome, expected).toBe(expected);
      // The password is the proxy's business: it is in no message.
      expect(outcome).not.toContain('wrong-secret');
      await proxy.close();
    }
  });

  it('fails on a reply cut short by the proxy closing', async () => {
    const proxy = await fakeProxy((socket) => {
      socket.once('data', () => {
        socket.write(Buffer.from([5, 0]));
        socket.once('data', () => socket.end(Buffer.from([5, 0, 0, 1, 10, 0])));
      });
    });
    const { outcome } = await handshake(proxy.port);
    expect(outcome).toMatch(/was cut short \(2 of 6 bytes\)|closed the connection mid-handshake/);
    await proxy.close();
  });

  it('times out on a proxy that says nothing, or stops halfway, within the deadline', async () => {
    const silent = await fakeProxy(() => {});
    const quiet = await handshake(silent.port, { timeoutMs: 300 });
    expect(quiet.outcome).toBe('it did not finish the handshake within 300 ms');
    expect(quiet.ms).toBeGreaterThanOrEqual(290);
    expect(quiet.ms).toBeLessThan(1500);
    await silent.close();
    // A byte at a time, slower than the deadline allows for the whole.
    const trickle = await fakeProxy((socket) => {
      const bytes = [5, 0, ...SUCCESS];
      const timer = setInterval(() => {
        if (bytes.length === 0 || socket.destroyed) return clearInterval(timer);
        socket.write(Buffer.from([bytes.shift()!]));
      }, 60);
      socket.once('close', () => clearInterval(timer));
    });
    const slow = await handshake(trickle.port, { timeoutMs: 300 });
    expect(slow.outcome).toBe('it did not finish the handshake within 300 ms');
    await trickle.close();
  });

  it('sends a name as ATYP domain and addresses as IPv4 or IPv6, with the login', async () => {
    const proxy = await fakeProxy((socket, received) => {
      socket.on('data', () => {
        const bytes = received();
        if (bytes.length === 4) socket.write(Buffer.from([5, 2]));
        else if (bytes[4] === 1 && bytes.length === 4 + 3 + bytes[5]! + bytes[6 + bytes[5]!]!)
          socket.write(Buffer.from([1, 0]));
        else if (bytes.length > 4 + 3) socket.write(SUCCESS);
      });
    });
    const login = { username: 'user', password: 'pass' };
    for (const destination of [
      { host: 'origin.test', port: 443 },
      { ip: ip('198.18.0.7'), port: 80 },
      { ip: ip('2001:db8::1'), port: 8080 },
    ]) {
      const { outcome, socket } = await handshake(proxy.port, login, destination);
      expect(outcome).toBe('ok');
      socket.destroy();
    }
    const greeting = [5, 2, 0, 2];
    const auth = [1, 4, ...Buffer.from('user'), 4, ...Buffer.from('pass')];
    expect(proxy.received.map((b) => [...b])).toEqual([
      [...greeting, ...auth, 5, 1, 0, 3, 11, ...Buffer.from('origin.test'), 1, 187],
      [...greeting, ...auth, 5, 1, 0, 1, 198, 18, 0, 7, 0, 80],
      [...greeting, ...auth, 5, 1, 0, 4, 0x20, 1, 0x0d, 0xb8, ...Array(11).fill(0), 1, 0x1f, 0x90],
    ]);
    await proxy.close();
  });

  it('leaves what the proxy sent after its reply for the tunnel (a server speaking first)', async () => {
    const proxy = await fakeProxy((socket) => {
      let step = 0;
      socket.on('data', () => {
        // A domain-typed bound address of 255 bytes, then the origin's banner, in one write.
        if (step++ === 0) socket.write(Buffer.from([5, 0]));
        else
          socket.write(
            Buffer.concat([
              Buffer.from([5, 0, 0, 3, 255]),
              Buffer.alloc(255, 0x61),
              Buffer.from([0, 22]),
              Buffer.from('SSH-2.0-origin\r\n'),
            ]),
          );
      });
    });
    const { outcome, socket } = await handshake(proxy.port);
    expect(outcome).toBe('ok');
    const banner = await new Promise<string>((resolve) =>
      socket.once('data', (chunk: Buffer) => resolve(chunk.toString())),
    );
    socket.resume();
    expect(banner).toBe('SSH-2.0-origin\r\n');
    socket.destroy();
    await proxy.close();
  });
});

describe('socksConnect against a SOCKS5 server', () => {
  let origin: net.Server;
  let originPort: number;
  let open: SocksServer;
  let locked: SocksServer;

  beforeAll(async () => {
    origin = net.createServer((socket) => socket.pipe(socket));
    await new Promise<void>((resolve) => origin.listen(0, '127.0.0.1', resolve));
    originPort = (origin.address() as net.AddressInfo).port;
    const names = new Map([['origin.test', '127.0.0.1']]);
    open = await SocksServer.start({ host: '127.0.0.1', names });
    locked = await SocksServer.start({
      host: '127.0.0.1',
      names,
      credentials: { username: 'moat', password: 's3cret' },
    });
  });
  afterAll(async () => {
    await open?.close();
    await locked?.close();
    origin?.close();
  });

  const portOf = (server: SocksServer) => Number(server.address.split(':')[1]);

  async function echo(socket: net.Socket): Promise<string> {
    socket.write('ping');
    const answer = await new Promise<string>((resolve) =>
      socket.once('data', (chunk: Buffer) => resolve(chunk.toString())),
    );
    socket.destroy();
    return answer;
  }

  it('carries bytes both ways, with and without a login', async () => {
    const plain = await handshake(portOf(open), {}, { host: 'origin.test', port: originPort });
    expect(plain.outcome).toBe('ok');
    expect(await echo(plain.socket)).toBe('ping');
    const login = await handshake(
      portOf(locked),
      { username: 'moat', password: 's3cret' },
      { host: 'origin.test', port: originPort },
    );
    expect(login.outcome).toBe('ok');
    expect(await echo(login.socket)).toBe('ping');
    expect(locked.requests).toEqual([
      { kind: 'domain', host: 'origin.test', port: originPort, username: 'moat' },
    ]);
  });

  it('is refused with wrong credentials or none', async () => {
    const wrong = await handshake(portOf(locked), { username: 'moat', password: 'nope' });
    expect(wrong.outcome).toBe('it rejected the username and password');
    const none = await handshake(portOf(locked));
    expect(none.outcome).toBe('it requires authentication and no username was configured');
  });
});
