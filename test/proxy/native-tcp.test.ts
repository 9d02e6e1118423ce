import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import {
  type NativeClient,
  nativeTcp,
  nativeTcpUnavailable,
  type NativeUpstream,
} from '../../src/proxy/native-tcp.js';
import { hasIpv6Loopback } from '../support/ipv6.js';
import { everyClient, expectNativeRelayEmpty, sleep, until } from '../support/native-relay.js';

const HOST = '127.0.0.1';
const native = nativeTcp('auto');
if (native === undefined) console.warn(`native relay tests skipped: ${nativeTcpUnavailable()}`);

const closers: Array<() => void> = [];
/** Closes each client handed to a test, in case it failed before passing the client on. */
const clientClosers: Array<() => void> = [];
// Nothing a test opened outlives it: listeners, parked clients, dials, tunnels.
afterEach(async () => {
  for (const close of closers.splice(0)) close();
  try {
    await expectNativeRelayEmpty();
  } finally {
    // After the check, not before: closing the client of a live tunnel closes the tunnel at
    // once, which would hide a relay that does not free a tunnel whose sockets went. Closing one
    // adopted, closed or whose tunnel ended does nothing (its id is gone); one a failed test
    // left parked is closed here, so the next test's check does not fail for it too.
    for (const close of clientClosers.splice(0)) close();
  }
});

/** A native listener whose clients queue up for the test to take. */
function listenNative(handshakeMs = 10_000) {
  const arrived: NativeClient[] = [];
  const listener = native!.listen(
    HOST,
    0,
    handshakeMs,
    everyClient((client) => arrived.push(client)),
  );
  closers.push(() => listener.close());
  const next = async () => {
    await until(() => arrived.length > 0, 3000);
    const client = arrived.shift();
    if (client === undefined) throw new Error('no client arrived within 3 s');
    clientClosers.push(() => native!.close(client));
    return client;
  };
  return { listener, arrived, next };
}

const connect = (port: number) =>
  new Promise<net.Socket>((resolve, reject) => {
    const socket = net.connect({ host: HOST, port }, () => resolve(socket));
    socket.once('error', reject);
    closers.push(() => socket.destroy());
  });

function dial(port: number): Promise<NativeUpstream> {
  return new Promise((resolve, reject) => {
    native!.dial(HOST, port, (error, upstream) => (error ? reject(error) : resolve(upstream!)));
  });
}

/** A port nothing listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function echoOrigin(): Promise<number> {
  const server = net.createServer((socket) => {
    socket.on('error', () => socket.destroy());
    socket.pipe(socket);
  });
  await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
  closers.push(() => server.close());
  return (server.address() as net.AddressInfo).port;
}

/** A tunnel from a test client through the relay to a fresh origin connection. */
async function tunnelToOrigin() {
  const { listener, next } = listenNative();
  let originSide!: (socket: net.Socket) => void;
  const accepted = new Promise<net.Socket>((resolve) => (originSide = resolve));
  const origin = net.createServer({ allowHalfOpen: true }, (socket) => {
    socket.on('error', () => {});
    originSide(socket);
  });
  await new Promise<void>((resolve) => origin.listen(0, HOST, resolve));
  closers.push(() => origin.close());
  const socket = await connect(listener.port);
  socket.on('error', () => {});
  socket.write('x');
  const client = await next();
  const upstream = await dial((origin.address() as net.AddressInfo).port);
  const originSocket = await accepted;
  closers.push(() => originSocket.destroy());
  const closes: Array<[number, number]> = [];
  const spliced = native!.splice(client, upstream, Buffer.alloc(0), {
    idleTimeoutMs: 60_000,
    onClose: (up, down) => closes.push([up, down]),
  });
  return { socket, originSocket, spliced, closes };
}

describe.skipIf(native === undefined)('native TCP relay', () => {
  it('answers events for a tunnel the relay already closed without throwing (a reset meets bytes)', async () => {
    // Client bytes (shown to JavaScript: a guard) and an upstream reset in one turn: the bytes'
    // event is answered after the relay closed the tunnel. That answer used to throw inside the
    // addon's callback, which ends the process.
    for (let round = 0; round < 20; round++) {
      const tunnel = await tunnelToOrigin();
      tunnel.spliced.release(Buffer.alloc(0), { fromClient: (chunk) => ({ pass: chunk }) });
      await sleep(10);
      tunnel.socket.write('hello');
      tunnel.originSocket.resetAndDestroy();
      await until(() => tunnel.closes.length > 0, 2000);
      expect(tunnel.closes.length).toBe(1);
      tunnel.socket.destroy();
    }
  });

  it("tells hold()'s onGone once when the client ends and the tunnel is closed for it", async () => {
    const tunnel = await tunnelToOrigin();
    let gone = 0;
    tunnel.spliced.hold(
      () => {},
      () => {
        gone++;
        tunnel.spliced.close();
      },
    );
    tunnel.socket.end();
    await until(() => tunnel.closes.length === 1, 2000);
    await sleep(50);
    expect(gone).toBe(1);
    expect(tunnel.closes.length).toBe(1);
  });

  it('stops showing a guard bytes once it is done, and relays the rest natively', async () => {
    const tunnel = await tunnelToOrigin();
    let shown = 0;
    const guard = {
      done: false,
      fromClient(chunk: Buffer) {
        shown += chunk.length;
        this.done = true;
        return { pass: chunk };
      },
    };
    tunnel.spliced.release(Buffer.alloc(0), guard);
    let received = 0;
    tunnel.originSocket.on('data', (chunk: Buffer) => (received += chunk.length));
    tunnel.socket.write('first');
    await until(() => received === 5, 2000);
    tunnel.socket.write(Buffer.alloc(4 * 1024 * 1024));
    await until(() => received === 5 + 4 * 1024 * 1024, 5000);
    expect(received).toBe(5 + 4 * 1024 * 1024);
    expect(shown).toBe(5);
  });

  it('shows a guard the bytes of an upstream that streamed (through a pipe) before release', async () => {
    const tunnel = await tunnelToOrigin();
    let received = 0;
    tunnel.socket.on('data', (chunk: Buffer) => (received += chunk.length));
    // Server-first and fast: reads fill the buffer, so the upstream side moves to a pipe.
    tunnel.originSocket.write(Buffer.alloc(8 * 1024 * 1024, 1));
    await until(() => received === 8 * 1024 * 1024, 5000);
    let seen = 0;
    tunnel.spliced.release(Buffer.alloc(0), {
      fromClient: (chunk) => ({ pass: chunk }),
      fromUpstream: (chunk) => {
        seen += chunk.length;
        return { pass: Buffer.alloc(0) };
      },
      // Watching until it has seen what it waits for, as a guard awaiting an answer does.
      get watchesUpstream() {
        return seen < 1024 * 1024;
      },
    });
    tunnel.originSocket.write(Buffer.alloc(1024 * 1024, 2));
    await until(() => received === 9 * 1024 * 1024, 5000);
    expect(received).toBe(9 * 1024 * 1024);
    expect(seen).toBe(1024 * 1024);
  });

  it("hands over each connection with its first bytes and the client's address", async () => {
    const { listener, next } = listenNative();
    const socket = await connect(listener.port);
    socket.write('CONNECT a:1 HTTP/1.1\r\n\r\n');
    const client = await next();
    expect(client.firstBytes.toString()).toBe('CONNECT a:1 HTTP/1.1\r\n\r\n');
    expect(client.remoteAddress).toBe(HOST);
    expect(client.waitedMs).toBeGreaterThanOrEqual(0);
    native!.close(client);
  });

  it('tells its listener of each client at accept and when it lets go of it; one refused then is reset unread', async () => {
    const opened: Array<[number, string | undefined]> = [];
    const gone: number[] = [];
    const arrived: NativeClient[] = [];
    const listener = native!.listen(HOST, 0, 10_000, {
      // The second client is refused (over its budget, in the proxy).
      opened: (id, address) => opened.push([id, address]) === 1,
      client: (client) => arrived.push(client),
      gone: (id) => gone.push(id),
    });
    closers.push(() => listener.close());
    const kept = await connect(listener.port);
    await until(() => opened.length === 1, 2000);
    // Told before any byte came.
    expect(opened[0]![1]).toBe(HOST);
    expect(arrived).toEqual([]);
    const refused = net.connect({ host: HOST, port: listener.port });
    closers.push(() => refused.destroy());
    const ended = new Promise<string>((resolve) => {
      refused.once('error', (error: NodeJS.ErrnoException) => resolve(error.code ?? 'error'));
      refused.once('close', () => resolve('closed'));
    });
    refused.resume();
    expect(await ended).toBe('ECONNRESET');
    expect(opened).toHaveLength(2);
    // Nothing is said of a client it refused: it was never kept.
    expect(gone).toEqual([]);
    kept.write('x');
    await until(() => arrived.length === 1, 2000);
    native!.close(arrived[0]!);
    await until(() => gone.length === 1, 2000);
    expect(gone).toEqual([opened[0]![0]]);
  });

  it('hands over a silent connection with no bytes once the handshake time has passed', async () => {
    const { listener, next } = listenNative(150);
    const started = performance.now();
    await connect(listener.port);
    const client = await next();
    expect(client.firstBytes.length).toBe(0);
    expect(client.waitedMs).toBeGreaterThanOrEqual(150);
    expect(performance.now() - started).toBeGreaterThanOrEqual(140);
    native!.close(client);
  });

  it('tells nobody of a client that leaves before its first byte, and keeps no socket for it', async () => {
    const { listener, arrived } = listenNative();
    const socket = await connect(listener.port);
    await until(() => native!.stats().sockets === 2, 1000);
    socket.end();
    await until(() => native!.stats().sockets === 1, 2000);
    expect(native!.stats().sockets).toBe(1);
    expect(arrived).toEqual([]);
  });

  it('closes the connections still waiting for first bytes when their listener closes', async () => {
    const { listener } = listenNative();
    const socket = await connect(listener.port);
    const closed = new Promise((resolve) => socket.once('close', resolve));
    socket.resume();
    await until(() => native!.stats().sockets === 2, 1000);
    listener.close();
    await closed;
  });

  it('adopts a client into a working net.Socket, first bytes read and later ones not lost', async () => {
    const { listener, next } = listenNative();
    const socket = await connect(listener.port);
    socket.write('first');
    const client = await next();
    socket.write(' second');
    await sleep(20);
    const adopted = native!.adopt(client);
    closers.push(() => adopted.destroy());
    expect(adopted.remoteAddress).toBe(HOST);
    expect(adopted.remotePort).toBe(socket.localPort);
    const later = await new Promise<string>((resolve) =>
      adopted.once('data', (chunk) => resolve(String(chunk))),
    );
    expect(later).toBe(' second');
    adopted.end('answer');
    const answer = await new Promise<string>((resolve) => {
      let text = '';
      socket.on('data', (chunk) => (text += chunk));
      socket.on('end', () => resolve(text));
    });
    expect(answer).toBe('answer');
    // Adopted and closed: the relay holds nothing of it, and its id is gone.
    expect(() => native!.adopt(client)).toThrow(/no such native socket/);
    expect(() => native!.close(client)).not.toThrow();
  });

  it('closes the connection whose handling threw, and tells the defect listeners', async () => {
    const defects: unknown[] = [];
    closers.push(native!.onDefect((error) => defects.push(error)));
    const listener = native!.listen(
      HOST,
      0,
      10_000,
      everyClient(() => {
        throw new Error('a defect');
      }),
    );
    closers.push(() => listener.close());
    const socket = await connect(listener.port);
    socket.write('hello');
    await new Promise((resolve) => socket.once('close', resolve));
    expect(defects).toEqual([new Error('a defect')]);
  });

  it('closes a tunnel whose guard threw through its owner: counted, unregistered, reported', async () => {
    const defects: unknown[] = [];
    closers.push(native!.onDefect((error) => defects.push(error)));
    const tunnel = await tunnelToOrigin();
    tunnel.spliced.release(Buffer.alloc(0), {
      fromClient: () => {
        // Not even an Error: the report must cope with any thrown value.
        throw 'a guard defect';
      },
    });
    tunnel.socket.write('bytes');
    await new Promise((resolve) => tunnel.socket.once('close', resolve));
    expect(tunnel.closes).toHaveLength(1);
    expect(defects).toEqual([new Error('a guard defect')]);
  });

  it('reports a refused dial by its code, and an aborted one never', async () => {
    await expect(dial(await closedPort())).rejects.toThrow('ECONNREFUSED');
    let called = false;
    const attempt = native!.dial(HOST, await echoOrigin(), () => (called = true));
    attempt.abort();
    await sleep(100);
    expect(called).toBe(false);
  });

  it('refuses what is not an IP address or a port, naming the call', () => {
    expect(() =>
      native!.listen(
        'localhost',
        0,
        1000,
        everyClient(() => {}),
      ),
    ).toThrow(/not an IP address/);
    let failure: Error | undefined;
    native!.dial(HOST, 0, (error) => (failure = error));
    expect(failure?.message).toMatch(/dial\(ip, port\)/);
  });

  it('refuses a port in use with EADDRINUSE', () => {
    const { listener } = listenNative();
    expect(() =>
      native!.listen(
        HOST,
        listener.port,
        1000,
        everyClient(() => {}),
      ),
    ).toThrow(expect.objectContaining({ code: 'EADDRINUSE' }));
  });

  it('closes a tunnel quiet both ways for the idle time, and counts its bytes', async () => {
    const { listener, next } = listenNative();
    const socket = await connect(listener.port);
    socket.write('x');
    const client = await next();
    const upstream = await dial(await echoOrigin());
    let closed: { up: number; down: number } | undefined;
    const tunnel = native!.splice(client, upstream, Buffer.from('200\n'), {
      idleTimeoutMs: 200,
      onClose: (up, down) => (closed = { up, down }),
    });
    tunnel.release(Buffer.from('hello'));
    let echoed = '';
    socket.on('data', (chunk) => (echoed += chunk));
    const started = performance.now();
    await new Promise((resolve) => socket.once('close', resolve));
    expect(echoed).toBe('200\nhello');
    expect(performance.now() - started).toBeGreaterThanOrEqual(150);
    expect(closed).toEqual({ up: 5, down: 9 });
  });

  it('closes the tunnel when a guard finds a problem, after telling why', async () => {
    const { listener, next } = listenNative();
    const socket = await connect(listener.port);
    socket.write('x');
    const client = await next();
    const upstream = await dial(await echoOrigin());
    let closed = false;
    const tunnel = native!.splice(client, upstream, Buffer.alloc(0), {
      idleTimeoutMs: 60_000,
      onClose: () => (closed = true),
    });
    const problems: string[] = [];
    tunnel.release(
      Buffer.from('fine '),
      {
        fromClient: (chunk) =>
          chunk.includes('evil') ? { problem: 'evil bytes' } : { pass: chunk },
      },
      (problem) => problems.push(problem),
    );
    let echoed = '';
    socket.on('data', (chunk) => (echoed += chunk));
    await until(() => echoed === 'fine ', 2000);
    socket.write('evil');
    await new Promise((resolve) => socket.once('close', resolve));
    expect(problems).toEqual(['evil bytes']);
    expect(closed).toBe(true);
    expect(echoed).toBe('fine ');
  });

  it('carries 200 tunnels at once, each its own bytes', async () => {
    const { listener, next } = listenNative();
    const origin = await echoOrigin();
    const runs = Array.from({ length: 200 }, async (_, i) => {
      const socket = await connect(listener.port);
      socket.write(`tunnel ${i};`);
      let text = '';
      socket.on('data', (chunk) => (text += chunk));
      await until(() => text.endsWith('end;'), 5000);
      socket.destroy();
      return text;
    });
    for (let i = 0; i < 200; i++) {
      const client = await next();
      const upstream = await dial(origin);
      native!
        .splice(client, upstream, Buffer.alloc(0), { idleTimeoutMs: 60_000, onClose: () => {} })
        .release(Buffer.concat([client.firstBytes, Buffer.from(' end;')]));
    }
    const texts = await Promise.all(runs);
    texts.forEach((text, i) => expect(text).toBe(`tunnel ${i}; end;`));
  });
});

describe.skipIf(native === undefined)('native TCP relay over IPv6', () => {
  it('listens, reports the peer and dials on ::1', async (context) => {
    if (!(await hasIpv6Loopback())) {
      console.warn('IPv6 relay test skipped: no ::1 on this machine');
      return context.skip();
    }
    const arrived: NativeClient[] = [];
    const listener = native!.listen(
      '::1',
      0,
      10_000,
      everyClient((client) => arrived.push(client)),
    );
    closers.push(() => listener.close());
    const origin = net.createServer((socket) => socket.end('from v6'));
    await new Promise<void>((resolve) => origin.listen(0, '::1', resolve));
    closers.push(() => origin.close());
    const socket = net.connect({ host: '::1', port: listener.port });
    closers.push(() => socket.destroy());
    socket.write('hi');
    await until(() => arrived.length === 1, 3000);
    const client = arrived[0]!;
    clientClosers.push(() => native!.close(client));
    expect(client.remoteAddress).toBe('::1');
    const upstream = await new Promise<NativeUpstream>((resolve, reject) =>
      native!.dial('::1', (origin.address() as net.AddressInfo).port, (error, connected) =>
        error ? reject(error) : resolve(connected!),
      ),
    );
    native!
      .splice(client, upstream, Buffer.alloc(0), { idleTimeoutMs: 60_000, onClose: () => {} })
      .release();
    const heard = await new Promise<string>((resolve) => {
      let text = '';
      socket.on('data', (chunk) => (text += chunk));
      socket.on('end', () => resolve(text));
    });
    expect(heard).toBe('from v6');
  });
});
