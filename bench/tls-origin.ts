/**
 * The HTTPS origin of `npm run bench:tls`, run as its own process (forked by bench/tls.ts): a
 * TLS listener on 127.0.0.21 (loopback only) with a certificate from the benchmark's origin CA,
 * and a small hand-written HTTP/1.1 responder behind it: every bodiless request head gets a
 * 200 with a 64-byte body, a Content-Length and `X-Injected: yes|no` (whether the request
 * carried the header both proxies inject); keep-alive unless the request says
 * `Connection: close`.
 *
 * argv: <key file> <certificate file> <lifetime seconds>. Tells the parent its port over IPC,
 * answers `stats` (TLS connections, resumed ones, requests, requests with the header); exits
 * when the parent disconnects, on SIGTERM/SIGINT, or after the lifetime.
 */
import { readFileSync } from 'node:fs';
import tls from 'node:tls';
import {
  INJECTED_HEADER,
  INJECTED_PREFIX,
  INJECTED_SECRET,
  ORIGIN_IP,
  SEEN_HEADER,
} from './tls-common.js';
import { endWithParent } from './lib/procs.js';

const [keyFile = '', certFile = '', lifetimeText = '900'] = process.argv.slice(2);
const BODY = Buffer.alloc(64, 'o');
const answer = (injected: boolean, close: boolean) =>
  Buffer.concat([
    Buffer.from(
      `HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: ${BODY.length}\r\n` +
        `${SEEN_HEADER}: ${injected ? 'yes' : 'no'}\r\n${close ? 'Connection: close\r\n' : ''}\r\n`,
      'latin1',
    ),
    BODY,
  ]);
const ANSWERS = [
  answer(false, false),
  answer(false, true),
  answer(true, false),
  answer(true, true),
];
const BAD = Buffer.from(
  'HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n',
  'latin1',
);
const CRLF2 = Buffer.from('\r\n\r\n');
const INJECTED = `\r\n${INJECTED_HEADER.toLowerCase()}: ${INJECTED_PREFIX.toLowerCase()}${INJECTED_SECRET}`;

const seen = { connections: 0, resumed: 0, requests: 0, injected: 0 };

function connection(socket: tls.TLSSocket): void {
  seen.connections++;
  if (socket.isSessionReused()) seen.resumed++;
  socket.setNoDelay(true);
  socket.on('error', () => socket.destroy());
  let pending: Buffer | undefined;
  socket.on('data', (chunk: Buffer) => {
    let data = pending === undefined ? chunk : Buffer.concat([pending, chunk]);
    pending = undefined;
    for (;;) {
      const end = data.indexOf(CRLF2);
      if (end < 0) break;
      const head = data.toString('latin1', 0, end).toLowerCase();
      data = data.subarray(end + 4);
      seen.requests++;
      if (/\r\n(content-length:\s*[1-9]|transfer-encoding:)/.test(head)) {
        socket.end(BAD);
        return;
      }
      // The whole line: the header with exactly the value, nothing after it.
      const at = head.indexOf(INJECTED);
      const injected =
        at >= 0 && (head.length === at + INJECTED.length || head[at + INJECTED.length] === '\r');
      if (injected) seen.injected++;
      const close = /\r\nconnection:[^\r]*close/.test(head);
      const reply = ANSWERS[(injected ? 2 : 0) + (close ? 1 : 0)]!;
      if (close) {
        socket.end(reply);
        return;
      }
      socket.write(reply);
    }
    if (data.length > 0) {
      if (data.length > 64 * 1024) return void socket.destroy();
      pending = data;
    }
  });
}

const server = tls.createServer(
  { key: readFileSync(keyFile), cert: readFileSync(certFile) },
  connection,
);
server.on('tlsClientError', () => {});
server.listen(0, ORIGIN_IP, () => {
  const { port } = server.address() as { port: number };
  process.send?.({ ready: { port } });
});

process.on('message', (message: unknown) => {
  if (message === 'stats') process.send?.({ stats: { ...seen } });
});
endWithParent(Number(lifetimeText));
