/**
 * The interceptor's UDP listener, both ways it can do I/O: batched system calls through
 * native/udp_batch.c and node:dgram. Real sockets on loopback; the responder here is a plain
 * function, as the interceptor's `answer` is to the listener.
 */
import { spawnSync } from 'node:child_process';
import dgram from 'node:dgram';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import {
  batchedUdpUnavailable,
  listenUdp,
  MAX_UDP_QUERY,
  type UdpIoSetting,
  type UdpListener,
  type UdpListenerOptions,
} from '../../src/dns/udp.js';
import { hasIpv6Loopback } from '../support/ipv6.js';

const unavailable = batchedUdpUnavailable();
if (unavailable !== undefined) console.warn(`batched UDP tests: skipped: ${unavailable}`);

/**
 * Sends `payload` over UDP from 127.0.0.1 source port 0 to 127.0.0.1:port, through a raw socket
 * (no socket API sends from port 0): python3 and root, or the reason it cannot.
 */
function sendFromPortZero(port: number, payload: Buffer): string | undefined {
  const script = [
    'import socket, struct, sys',
    'port, payload = int(sys.argv[1]), bytes.fromhex(sys.argv[2])',
    "udp = struct.pack('>HHHH', 0, port, 8 + len(payload), 0) + payload",
    's = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)',
    "s.sendto(udp, ('127.0.0.1', 0))",
  ].join('\n');
  const run = spawnSync('python3', ['-c', script, String(port), payload.toString('hex')], {
    encoding: 'utf8',
    timeout: 10_000,
  });
  if (run.error) return `python3: ${run.error.message}`;
  return run.status === 0 ? undefined : `raw socket: ${run.stderr.trim().split('\n').pop()}`;
}

/** A client socket bound on loopback that collects what comes back to it. */
async function client(family: 4 | 6 = 4): Promise<{
  socket: dgram.Socket;
  port: number;
  replies: Buffer[];
  waitFor(count: number, timeoutMs?: number): Promise<Buffer[]>;
}> {
  const socket = dgram.createSocket(family === 4 ? 'udp4' : 'udp6');
  const replies: Buffer[] = [];
  socket.on('message', (message) => replies.push(message));
  await new Promise<void>((resolve) => socket.bind(0, family === 4 ? '127.0.0.1' : '::1', resolve));
  return {
    socket,
    port: socket.address().port,
    replies,
    async waitFor(count, timeoutMs = 5000) {
      const deadline = Date.now() + timeoutMs;
      while (replies.length < count && Date.now() < deadline) await sleep(5);
      return replies;
    },
  };
}

const send = (socket: dgram.Socket, message: Buffer, port: number, host = '127.0.0.1') =>
  new Promise<void>((resolve, reject) =>
    socket.send(message, port, host, (error) => (error ? reject(error) : resolve())),
  );

/** An answer that says which message and which source it answers. */
const echo = (message: Buffer, source: string) =>
  Buffer.concat([Buffer.from(`${source}|`), message]);

describe.each<{ io: UdpIoSetting; skip: boolean }>([
  { io: 'auto', skip: unavailable !== undefined },
  { io: 'dgram', skip: false },
])('UDP listener, io=$io', ({ io, skip }) => {
  const open: Array<UdpListener | dgram.Socket> = [];
  afterEach(async () => {
    for (const thing of open.splice(0)) {
      if (thing instanceof dgram.Socket) thing.close();
      else await thing.close();
    }
  });

  const listen = async (
    host: string,
    overrides: Partial<UdpListenerOptions> = {},
    port = 0,
  ): Promise<UdpListener> => {
    const listener = await listenUdp(host, port, {
      io,
      respond: echo,
      onOversize: () => {},
      onSendError: (error) => {
        throw error;
      },
      ...overrides,
    });
    open.push(listener);
    return listener;
  };
  const openClient = async (family: 4 | 6 = 4) => {
    const c = await client(family);
    open.push(c.socket);
    return c;
  };

  it.skipIf(skip)('uses the I/O it was asked for', async () => {
    const listener = await listen('127.0.0.1');
    expect(listener.io).toBe(io === 'auto' ? 'batched' : 'dgram');
    expect(listener.port).toBeGreaterThan(0);
  });

  it.skipIf(skip)(
    'answers a burst from several clients, each its own messages, across batches',
    async () => {
      const listener = await listen('127.0.0.1');
      const clients = await Promise.all([openClient(), openClient()]);
      // Sent all at once, so the listener finds them queued and reads them in batches (of up to
      // 64 when batched); few enough to fit its receive buffer, where UDP would drop the rest.
      const perClient = 60;
      await Promise.all(
        clients.flatMap((c, n) =>
          Array.from({ length: perClient }, (_, i) =>
            send(c.socket, Buffer.from(`client ${n} message ${i}`), listener.port),
          ),
        ),
      );
      for (const [n, c] of clients.entries()) {
        const replies = (await c.waitFor(perClient)).map(String).sort();
        const expected = Array.from(
          { length: perClient },
          (_, i) => `127.0.0.1|client ${n} message ${i}`,
        ).sort();
        expect(replies).toEqual(expected);
      }
    },
  );

  it.skipIf(skip)(
    'sends an answer that comes later with the bytes and peer it was asked with',
    async () => {
      let release: () => void = () => {};
      const later = new Promise<void>((resolve) => (release = resolve));
      const listener = await listen('127.0.0.1', {
        respond: (message, source) =>
          message.toString().startsWith('slow')
            ? later.then(() => echo(message, source))
            : echo(message, source),
      });
      const slow = await openClient();
      const fast = await openClient();
      await send(slow.socket, Buffer.from('slow question'), listener.port);
      // Many more messages pass through the receive buffers while the slow one waits.
      for (let i = 0; i < 200; i++)
        await send(fast.socket, Buffer.from(`fast ${i} ${'x'.repeat(40)}`), listener.port);
      await fast.waitFor(200);
      expect(slow.replies).toEqual([]);
      release();
      expect((await slow.waitFor(1)).map(String)).toEqual(['127.0.0.1|slow question']);
      expect(fast.replies).toHaveLength(200);
    },
  );

  it.skipIf(skip)('sends nothing when the responder has no answer', async () => {
    const asked: string[] = [];
    const listener = await listen('127.0.0.1', {
      respond: (message, source) => {
        asked.push(String(message));
        return message.toString() === 'answer me' ? echo(message, source) : undefined;
      },
    });
    const c = await openClient();
    await send(c.socket, Buffer.from('stay silent'), listener.port);
    await send(c.socket, Buffer.from('answer me'), listener.port);
    expect((await c.waitFor(1)).map(String)).toEqual(['127.0.0.1|answer me']);
    await sleep(50);
    expect(c.replies).toHaveLength(1);
    expect(asked).toEqual(['stay silent', 'answer me']);
  });

  it.skipIf(skip)(
    `drops datagrams over ${MAX_UDP_QUERY} bytes unread and answers ones of exactly that`,
    async () => {
      const oversize: Array<{ source: string; length: number }> = [];
      const listener = await listen('127.0.0.1', {
        respond: (message) => Buffer.from(`${message.length}`),
        onOversize: (source, length) => oversize.push({ source, length }),
      });
      const c = await openClient();
      await send(c.socket, Buffer.alloc(MAX_UDP_QUERY + 1, 0x61), listener.port);
      await send(c.socket, Buffer.alloc(9000, 0x62), listener.port);
      await send(c.socket, Buffer.alloc(MAX_UDP_QUERY, 0x63), listener.port);
      expect((await c.waitFor(1)).map(String)).toEqual([String(MAX_UDP_QUERY)]);
      expect(oversize).toEqual([
        { source: '127.0.0.1', length: MAX_UDP_QUERY + 1 },
        { source: '127.0.0.1', length: 9000 },
      ]);
    },
  );

  it.skipIf(skip)('answers IPv6 peers, and IPv4 peers of an IPv6 socket', async (ctx) => {
    if (!(await hasIpv6Loopback())) {
      console.warn('IPv6 UDP test: skipped: no ::1 on this machine');
      return ctx.skip();
    }
    const v6 = await listen('::1');
    const c6 = await openClient(6);
    await send(c6.socket, Buffer.from('over six'), v6.port, '::1');
    expect((await c6.waitFor(1)).map(String)).toEqual(['::1|over six']);

    // A dual-stack socket (all addresses; only loopback traffic is sent to it).
    const dual = await listen('::');
    const c4 = await openClient(4);
    await send(c4.socket, Buffer.from('over four'), dual.port, '127.0.0.1');
    const mapped = io === 'dgram' ? '::ffff:127.0.0.1' : '127.0.0.1';
    expect((await c4.waitFor(1)).map(String)).toEqual([`${mapped}|over four`]);
  });

  it.skipIf(skip)('ignores a datagram from source port 0 and keeps answering', async (ctx) => {
    const errors: Error[] = [];
    const asked: string[] = [];
    const listener = await listen('127.0.0.1', {
      respond: (message, source) => {
        asked.push(String(message));
        return message.toString() === 'later'
          ? Promise.resolve(echo(message, source))
          : echo(message, source);
      },
      onSendError: (error) => errors.push(error),
    });
    for (const payload of ['now', 'later']) {
      const problem = sendFromPortZero(listener.port, Buffer.from(payload));
      if (problem !== undefined) {
        console.warn(`port-0 test: skipped: ${problem}`);
        return ctx.skip();
      }
    }
    const c = await openClient();
    await send(c.socket, Buffer.from('after'), listener.port);
    expect((await c.waitFor(1)).map(String)).toEqual(['127.0.0.1|after']);
    expect(asked).toEqual(['now', 'later', 'after']);
    expect(errors).toEqual([]);
  });

  it.skipIf(skip)('drops an answer that comes after close, and closes once', async () => {
    let release: () => void = () => {};
    const later = new Promise<void>((resolve) => (release = resolve));
    const errors: Error[] = [];
    const listener = await listen('127.0.0.1', {
      respond: (message, source) => later.then(() => echo(message, source)),
      onSendError: (error) => errors.push(error),
    });
    const c = await openClient();
    await send(c.socket, Buffer.from('too late'), listener.port);
    await sleep(50);
    const closing = [listener.close(), listener.close()];
    release();
    await Promise.all(closing);
    await listener.close();
    await sleep(50);
    expect(c.replies).toEqual([]);
    expect(errors).toEqual([]);
  });

  it.skipIf(skip)('frees its port on close, and says when a port is taken', async () => {
    const first = await listen('127.0.0.1');
    const port = first.port;
    await expect(listen('127.0.0.1', {}, port)).rejects.toMatchObject({ code: 'EADDRINUSE' });
    await first.close();
    const again = await listen('127.0.0.1', {}, port);
    expect(again.port).toBe(port);
    const c = await openClient();
    await send(c.socket, Buffer.from('still here'), port);
    expect((await c.waitFor(1)).map(String)).toEqual(['127.0.0.1|still here']);
  });
});

describe.skipIf(unavailable !== undefined)('the native addon itself', () => {
  const addon = createRequire(import.meta.url)(
    join(import.meta.dirname, '..', '..', 'build', 'Release', 'moat_udp_batch.node'),
  ) as {
    open(
      host: string,
      port: number,
      onBatch: () => void,
    ): { handle: unknown; port: number; replyMeta: Buffer };
    send(handle: unknown, count: number): unknown;
    close(handle: unknown, onClosed: () => void): void;
  };

  it('refuses a handle whose socket closed, and anything that is not its handle', async () => {
    const socket = addon.open('127.0.0.1', 0, () => {});
    await new Promise<void>((resolve) => addon.close(socket.handle, resolve));
    // The socket's memory is gone; the handle must say so rather than reach it.
    expect(() => addon.send(socket.handle, 0)).toThrow(/closed/);
    expect(() => addon.close(socket.handle, () => {})).toThrow(/closed/);
    expect(() => addon.send({}, 0)).toThrow();
    expect(() => addon.send(socket, 0)).toThrow();
  });

  it('checks what it is asked to send against its buffers', async () => {
    const socket = addon.open('127.0.0.1', 0, () => {});
    const meta = new Int32Array(socket.replyMeta.buffer, socket.replyMeta.byteOffset, 16);
    meta.set([64 * 4096 + 1, 4, 53, 0x0100007f]);
    expect(() => addon.send(socket.handle, 1)).toThrow(/overrun/);
    meta.set([-1, 4, 53, 0x0100007f]);
    expect(() => addon.send(socket.handle, 1)).toThrow(/overrun/);
    expect(() => addon.send(socket.handle, 65)).toThrow(/count/);
    await new Promise<void>((resolve) => addon.close(socket.handle, resolve));
  });
});
