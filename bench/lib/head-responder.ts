/**
 * The request loop of the benches' hand-written HTTP/1.1 origins (cheaper than node:http, so
 * an origin costs little next to the proxy it serves): each bodiless request head, as it
 * completes, gets the answer `answer` gives for it (lower-cased); a head announcing a body gets
 * a 400 and the connection ends. Keep-alive unless the request says `Connection: close`.
 */
import type net from 'node:net';

const BAD = Buffer.from(
  'HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n',
  'latin1',
);
const CRLF2 = Buffer.from('\r\n\r\n');
/** A head that has not ended within this many bytes is no request of a bench. */
const MAX_HEAD_BYTES = 64 * 1024;

export function answerRequestHeads(
  socket: net.Socket,
  answer: (head: string, close: boolean) => Buffer,
  onRequest: () => void = () => undefined,
): void {
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
      onRequest();
      if (/\r\n(content-length:\s*[1-9]|transfer-encoding:)/.test(head)) {
        socket.end(BAD);
        return;
      }
      const close = /\r\nconnection:[^\r]*close/.test(head);
      const reply = answer(head, close);
      if (close) {
        socket.end(reply);
        return;
      }
      socket.write(reply);
    }
    if (data.length > 0) {
      if (data.length > MAX_HEAD_BYTES) return void socket.end(BAD);
      pending = data;
    }
  });
}
