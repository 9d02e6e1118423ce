/**
 * endAndLinger: how long a connection Moat has answered and closed may stay, on real loopback
 * sockets. A client that keeps reading keeps it; one that only sends does not.
 */
import net from 'node:net';
import { afterEach, expect, it } from 'vitest';
import { endAndLinger } from '../../src/proxy/http-errors.js';

const LINGER_MS = 300;
const KiB = 1024;

let cleanup: Array<() => void> = [];
afterEach(() => {
  for (const step of cleanup) step();
  cleanup = [];
});

/** A connected pair: Moat's side (accepted) and the client's. */
async function pair(): Promise<{ moat: net.Socket; client: net.Socket }> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const accepted = new Promise<net.Socket>((resolve) => server.once('connection', resolve));
  const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  const moat = await accepted;
  await new Promise((resolve) =>
    client.connecting ? client.once('connect', resolve) : resolve(0),
  );
  for (const socket of [moat, client]) socket.on('error', () => {});
  cleanup.push(() => {
    client.destroy();
    moat.destroy();
    server.close();
  });
  return { moat, client };
}

const closedWithin = (socket: net.Socket, ms: number) =>
  new Promise<boolean>((resolve) => {
    if (socket.destroyed) return resolve(true);
    const timer = setTimeout(() => resolve(false), ms);
    socket.once('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });

it('drops a client that never reads its answers but keeps sending, within the linger', async () => {
  const { moat, client } = await pair();
  client.pause(); // never reads
  // Earlier answers the client has not read: more than the loopback buffers hold, so the last
  // byte never leaves and 'finish' never comes.
  moat.write(Buffer.alloc(32 * KiB * KiB, 0x41));
  endAndLinger(moat, 'HTTP/1.1 400 Bad Request\r\n\r\n', LINGER_MS);
  const trickle = setInterval(() => client.write('x'), LINGER_MS / 4);
  cleanup.push(() => clearInterval(trickle));
  // Its bytes keep the idle timer from firing; the limit (six lingers after the end) holds.
  expect(await closedWithin(moat, 8 * LINGER_MS)).toBe(true);
});

// The client takes about three lingers to read it all, whether Moat queued the answer as one
// write (only partial progress shows) or as many. A longer linger here: on a loaded host this
// process (both ends) may stall for a few hundred ms, which says nothing of a reader's pace.
const SLOW_LINGER_MS = 1000;
it.each([
  ['one write', [6 * KiB * KiB]],
  ['many writes', Array.from({ length: 96 }, () => 64 * KiB)],
])(
  'keeps a client that reads a long answer slowly but steadily, to its last byte: %s',
  async (_, writes) => {
    const { moat, client } = await pair();
    for (const size of writes) moat.write(Buffer.alloc(size, 0x42));
    const text = 'HTTP/1.1 400 Bad Request\r\n\r\n';
    endAndLinger(moat, text, SLOW_LINGER_MS);
    let received = 0;
    client.on('data', (chunk: Buffer) => {
      received += chunk.length;
      // About 2 MiB per linger: pause after each chunk for a little while.
      client.pause();
      setTimeout(() => client.resume(), (chunk.length / (2 * KiB * KiB)) * SLOW_LINGER_MS);
    });
    await new Promise((resolve) => client.once('end', resolve));
    const total = writes.reduce((a, b) => a + b, 0);
    expect(received).toBe(total + text.length);
  },
  20_000,
);
