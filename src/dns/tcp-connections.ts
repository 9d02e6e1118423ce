/**
 * DNS over TCP for the interceptor (RFC 7766): each connection's length-prefixed messages,
 * pipelined and answered as each completes, with bounds a hostile client cannot get past: open
 * connections per sandbox, the time a begun message has to arrive whole, queries in progress and
 * answers waiting unsent per connection.
 */
import type net from 'node:net';
import type { ConnectionBudget } from '../enforce/index.js';
import { ArrivingBytes } from '../net/index.js';

/**
 * TCP connections one sandbox (or one unknown source) may hold at once, within its budget of
 * connections to all of Moat's listeners (ConnectionBudget's per-listener cap), so that no
 * sandbox can crowd the others out of DNS over TCP (their fallback for truncated answers).
 */
export const MAX_TCP_CONNECTIONS_PER_SOURCE = 32;
/** A TCP message that has begun must arrive whole within this: a trickle holds no connection. */
export const TCP_MESSAGE_TIMEOUT_MS = 2_000;
/**
 * Queries of one TCP connection in progress at once, and answers waiting unsent, before it is
 * read no further. Answers in progress are written whatever waits, so a connection holds at most
 * about 256 KiB + 16 x 64 KiB (1.3 MiB) of answers, a sandbox's 32 connections about 41 MiB.
 */
const MAX_PIPELINED = 16;
const MAX_UNSENT_BYTES = 256 * 1024;

export interface DnsTcpOptions {
  /** Where each connection is charged to its sandbox from accept to close (or refused). */
  readonly connections: ConnectionBudget;
  /** Connections idle longer than this are closed (RFC 7766 section 6.2.3). */
  readonly idleTimeoutMs: number;
  /** The answer to one query message from `source` (undefined: none is sent). */
  readonly answer: (
    message: Buffer,
    source: string,
  ) => Buffer | undefined | Promise<Buffer | undefined>;
}

export class DnsTcpConnections {
  private readonly connections = new Set<net.Socket>();

  constructor(private readonly options: DnsTcpOptions) {}

  closeAll(): void {
    for (const socket of this.connections) socket.destroy();
  }

  /**
   * RFC 7766: length-prefixed messages, pipelined, answered as each completes. Reading stops
   * while too many queries are in progress or too many answers wait unsent (a client that
   * never reads must not grow our memory), and resumes when both drain.
   */
  serve(socket: net.Socket): void {
    socket.on('error', () => socket.destroy());
    const hold = this.options.connections.admit('dns_tcp', socket.remoteAddress);
    if (hold === undefined) return void socket.resetAndDestroy();
    this.connections.add(socket);
    socket.setTimeout(this.options.idleTimeoutMs, () => socket.destroy());
    let partial: NodeJS.Timeout | undefined;
    socket.on('close', () => {
      clearTimeout(partial);
      this.connections.delete(socket);
      hold.release();
    });
    // A message sent a byte at a time must not be copied whole once per byte.
    const arriving = new ArrivingBytes();
    let buffered = arriving.bytes;
    let pending = 0;
    const busy = () => pending >= MAX_PIPELINED || socket.writableLength >= MAX_UNSENT_BYTES;
    const pump = (): void => {
      while (!busy() && buffered.length >= 2 && buffered.length >= 2 + buffered.readUInt16BE(0)) {
        const length = buffered.readUInt16BE(0);
        const message = Buffer.from(buffered.subarray(2, 2 + length));
        buffered = arriving.restart(buffered.subarray(2 + length));
        clearTimeout(partial);
        partial = undefined;
        pending++;
        void Promise.resolve(this.options.answer(message, socket.remoteAddress ?? '')).then(
          (reply) => {
            pending--;
            if (reply !== undefined && !socket.destroyed) {
              const framed = Buffer.allocUnsafe(2 + reply.length);
              framed.writeUInt16BE(reply.length, 0);
              reply.copy(framed, 2);
              socket.write(framed);
            }
            pump();
          },
        );
      }
      if (busy()) {
        // Not reading: whatever waits is ours to get to, not the client's to finish.
        socket.pause();
        clearTimeout(partial);
        partial = undefined;
      } else {
        socket.resume();
        // Part of a message is here: the rest must follow soon.
        if (buffered.length > 0)
          partial ??= setTimeout(() => socket.destroy(), TCP_MESSAGE_TIMEOUT_MS);
      }
    };
    socket.on('drain', pump);
    socket.on('data', (chunk: Buffer) => {
      buffered = arriving.append(chunk);
      pump();
    });
  }
}
