/**
 * The origin of `npm run bench:proxy`, run as its own process (forked by bench/proxy.ts), so
 * it never shares an event loop with a proxy or the load client. Two listeners on
 * 127.0.0.20 (loopback only):
 * - a small HTTP/1.1 responder: every bodiless request head gets one fixed 200 answer with a
 *   64-byte body and a Content-Length; keep-alive unless the request says `Connection: close`
 *   (then it answers and closes). Hand-written rather than node:http so that the origin costs
 *   little next to the proxies it serves;
 * - a bulk source: a raw TCP server that reads one line `<bytes>\n`, writes that many bytes
 *   (a repeated 256 KiB buffer, respecting backpressure) and closes.
 *
 * argv: <lifetime seconds>. Tells the parent its ports over IPC; exits when the parent
 * disconnects, on SIGTERM/SIGINT, or after the lifetime.
 */
import net from 'node:net';
import { ORIGIN_IP, SMALL_BODY_BYTES } from './proxy-common.js';
import { answerRequestHeads } from './lib/head-responder.js';
import { endWithParent } from './lib/procs.js';

const BODY = Buffer.alloc(SMALL_BODY_BYTES, 'm');
BODY[SMALL_BODY_BYTES - 1] = 0x0a;
const answer = (close: boolean) =>
  Buffer.concat([
    Buffer.from(
      'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n' +
        `Content-Length: ${SMALL_BODY_BYTES}\r\n${close ? 'Connection: close\r\n' : ''}\r\n`,
      'latin1',
    ),
    BODY,
  ]);
const KEEP = answer(false);
const CLOSE = answer(true);
const MAX_BULK = 64 * 2 ** 30;
const BULK_CHUNK = Buffer.alloc(256 * 1024, 'b');

/** Connections and requests the HTTP responder has seen (the parent asks for them). */
const seen = { connections: 0, requests: 0 };

/** Answers request heads as they complete; requests carry no body (a body gets a 400). */
function httpConnection(socket: net.Socket): void {
  seen.connections++;
  answerRequestHeads(
    socket,
    (_head, close) => (close ? CLOSE : KEEP),
    () => seen.requests++,
  );
}

/** Reads `<bytes>\n`, then streams that many bytes and ends. */
function bulkConnection(socket: net.Socket): void {
  socket.on('error', () => socket.destroy());
  let line = '';
  const onData = (chunk: Buffer) => {
    line += chunk.toString('latin1');
    const eol = line.indexOf('\n');
    if (eol < 0) {
      if (line.length > 64) socket.destroy();
      return;
    }
    socket.off('data', onData);
    const total = Number(line.slice(0, eol).trim());
    if (!Number.isInteger(total) || total < 0 || total > MAX_BULK) return void socket.destroy();
    let left = total;
    const pump = () => {
      while (left > 0) {
        const n = Math.min(left, BULK_CHUNK.length);
        left -= n;
        const more = socket.write(n === BULK_CHUNK.length ? BULK_CHUNK : BULK_CHUNK.subarray(0, n));
        if (!more) return void socket.once('drain', pump);
      }
      socket.end();
    };
    pump();
  };
  socket.on('data', onData);
}

const listen = (server: net.Server): Promise<number> =>
  new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen({ port: 0, host: ORIGIN_IP, backlog: 4096 }, () =>
      resolve((server.address() as net.AddressInfo).port),
    );
  });

async function main(): Promise<void> {
  const lifetime = Number(process.argv[2] ?? '900');
  const http = net.createServer(httpConnection);
  const bulk = net.createServer(bulkConnection);
  const httpPort = await listen(http);
  const bulkPort = await listen(bulk);
  endWithParent(lifetime);
  process.on('message', (message) => {
    if (message === 'stats') process.send?.({ stats: { ...seen } });
  });
  process.send?.({ ready: { ip: ORIGIN_IP, httpPort, bulkPort } });
}

main().catch((error: unknown) => {
  process.stderr.write(`bench origin: ${(error as Error).stack ?? String(error)}\n`);
  process.exit(1);
});
