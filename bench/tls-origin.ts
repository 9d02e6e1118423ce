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
import { answerRequestHeads } from './lib/head-responder.js';
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
const INJECTED = `\r\n${INJECTED_HEADER.toLowerCase()}: ${INJECTED_PREFIX.toLowerCase()}${INJECTED_SECRET}`;

const seen = { connections: 0, resumed: 0, requests: 0, injected: 0 };

function connection(socket: tls.TLSSocket): void {
  seen.connections++;
  if (socket.isSessionReused()) seen.resumed++;
  answerRequestHeads(
    socket,
    (head, close) => {
      // The whole line: the header with exactly the value, nothing after it.
      const at = head.indexOf(INJECTED);
      const injected =
        at >= 0 && (head.length === at + INJECTED.length || head[at + INJECTED.length] === '\r');
      if (injected) seen.injected++;
      return ANSWERS[(injected ? 2 : 0) + (close ? 1 : 0)]!;
    },
    () => seen.requests++,
  );
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
