/**
 * The fake upstream resolver of `npm run bench:dns`, run as its own process (forked by
 * bench/dns.ts). It must never be the bottleneck, so it answers by pattern with hand-written
 * bytes instead of a zone map or a DNS library: every A question gets NOERROR with one A record
 * whose address is derived from the name (so distinct names get distinct addresses, all outside
 * Moat's internal deny list), every other type gets NOERROR with no records. Long TTL (1 hour).
 *
 * argv: <port (0 = any free port)> <lifetime seconds> [distinct|shared]; with `shared`, every
 * name gets the same address (23.0.0.1). Listens on 127.0.0.1 only and tells the parent the
 * bound port over IPC. Exits when the parent disconnects, on SIGTERM, or after the lifetime.
 */
import dgram from 'node:dgram';
import { endWithParent } from './lib/procs.js';

const HEADER = 12;
const TTL = 3600;
const ANSWER_LENGTH = 16;

/** FNV-1a over the question name's wire bytes, folded to lower case. */
function nameHash(message: Buffer, start: number, end: number): number {
  let hash = 0x811c9dc5;
  for (let i = start; i < end; i++) {
    const byte = message[i]!;
    hash ^= byte >= 65 && byte <= 90 ? byte | 0x20 : byte;
    hash = Math.imul(hash, 0x01000193);
  }
  return hash >>> 0;
}

/** The reply to one query, or undefined when it is not a query we can parse. */
function fakeAnswer(message: Buffer, shared: boolean): Buffer | undefined {
  if (message.length < HEADER + 5 || (message[2]! & 0x80) !== 0) return undefined;
  if (message.readUInt16BE(4) !== 1) return undefined;
  let i = HEADER;
  for (;;) {
    if (i >= message.length) return undefined;
    const length = message[i]!;
    if (length === 0) break;
    if (length > 63) return undefined;
    i += 1 + length;
  }
  const questionEnd = i + 5;
  if (questionEnd > message.length) return undefined;
  const isA = message.readUInt16BE(i + 1) === 1;
  const out = Buffer.allocUnsafe(questionEnd + (isA ? ANSWER_LENGTH : 0));
  message.copy(out, 0, 0, questionEnd);
  out[2] = 0x80 | (message[2]! & 0x79); // QR, opcode and RD kept, AA/TC clear
  out[3] = 0x80; // RA, rcode NOERROR
  out.writeUInt16BE(isA ? 1 : 0, 6);
  out.writeUInt32BE(0, 8); // no authority, no additional (any OPT is dropped)
  if (isA) {
    const hash = shared ? 1 : nameHash(message, HEADER, i);
    let o = questionEnd;
    out.writeUInt16BE(0xc00c, o); // pointer to the question name
    out.writeUInt16BE(1, o + 2); // A
    out.writeUInt16BE(1, o + 4); // IN
    out.writeUInt32BE(TTL, o + 6);
    out.writeUInt16BE(4, o + 10);
    o += 12;
    // 23.0.0.0/8: public unicast, far from every range of the internal deny list.
    out[o] = 23;
    out[o + 1] = (hash >>> 16) & 0xff;
    out[o + 2] = (hash >>> 8) & 0xff;
    out[o + 3] = hash & 0xff;
  }
  return out;
}

function main(): void {
  const port = Number(process.argv[2] ?? 0);
  const lifetimeSeconds = Number(process.argv[3] ?? 900);
  const shared = process.argv[4] === 'shared';
  const socket = dgram.createSocket({
    type: 'udp4',
    recvBufferSize: 8 * 1024 * 1024,
    sendBufferSize: 8 * 1024 * 1024,
  });
  let answered = 0;
  socket.on('message', (message, from) => {
    const reply = fakeAnswer(message, shared);
    if (reply === undefined) return;
    answered++;
    socket.send(reply, from.port, from.address);
  });
  socket.on('error', (error) => {
    process.stderr.write(`bench upstream: ${error.message}\n`);
  });
  // Bounded in time whatever happens to the parent.
  endWithParent(lifetimeSeconds, () => socket.close());
  process.on('message', (message) => {
    if (message === 'count') process.send?.({ answered });
  });
  socket.bind(port, '127.0.0.1', () => {
    process.send?.({ ready: socket.address().port });
  });
}

main();
