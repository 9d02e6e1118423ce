/**
 * EXPERIMENT for `npm run bench:proxy` -- not Moat's code path, and never loaded by Moat
 * itself. A copy of src/proxy/splice.ts whose upstream -> client direction reads into large,
 * recycled buffers instead of letting Node allocate a fresh 64 KiB buffer per read and pipe()
 * it; bench/proxy-experiment.ts swaps it in for dist/src/proxy/splice.js (a module resolve
 * hook) and makes Dialer's upstream sockets read this way (socket `onread`), in a second Moat
 * process, so that the benchmark can show what the buffer strategy is worth.
 *
 * What changes, against splice.ts:
 * - upstream sockets are created with `onread`: each read lands in a buffer from a small pool
 *   (MOAT_EXPERIMENT_READ_KIB, default 1024 KiB), is written to the client as it is, and the
 *   buffer goes back to the pool when that write completes (no copy, no allocation per read,
 *   the same few buffers stay in cache). Bytes that arrive before the splice are copied and
 *   held, then flushed first (server-first protocols);
 * - backpressure as pipe() does it: a write that returns false pauses the upstream socket
 *   until the client drains (an onread socket's pause() stops reading at the handle);
 * - upstream 'end' ends the client (pipe's default); everything else -- timeouts, closing
 *   both sides on 'close' or 'error', release() for the client -> upstream direction, the byte
 *   counts -- is as in splice.ts.
 * Cost: every open upstream socket holds one read buffer (1 MiB by default; back to the pool
 * when it closes), where Node holds none between reads; a real change would size it
 * adaptively (start small, grow while reads fill the buffer) or share one read buffer and copy
 * only what a write leaves queued.
 */
import type net from 'node:net';

export interface SpliceOptions {
  readonly idleTimeoutMs: number;
  readonly onClose: (bytesUp: number, bytesDown: number) => void;
}

export interface Splice {
  release(initial?: Buffer): void;
  close(): void;
}

const READ_BYTES = Number(process.env.MOAT_EXPERIMENT_READ_KIB ?? '1024') * 1024;
const POOL_LIMIT = 64;
const pool: Buffer[] = [];
const take = () => pool.pop() ?? Buffer.allocUnsafeSlow(READ_BYTES);
const recycle = (buffer: Buffer) => {
  if (pool.length < POOL_LIMIT) pool.push(buffer);
};

interface LargeReader {
  /** Where reads go once spliced; until then they are held (copied). */
  sink: ((chunk: Buffer, done: () => void) => void) | undefined;
  held: Buffer[];
  /** The buffer the socket's next read goes into (back to the pool when the socket closes). */
  current: Buffer | undefined;
}

const readers = new WeakMap<net.Socket, LargeReader>();

/**
 * `onread` options for an upstream socket that is to be spliced; call `bind` with the socket
 * once it exists.
 */
export function largeReads(): {
  onread: net.OnReadOpts;
  bind(socket: net.Socket): void;
} {
  const reader: LargeReader = { sink: undefined, held: [], current: undefined };
  const onread: net.OnReadOpts = {
    buffer: () => (reader.current = take()),
    callback: (bytes, buffer) => {
      const filled = buffer as Buffer;
      if (reader.sink === undefined) {
        reader.held.push(Buffer.from(filled.subarray(0, bytes)));
        recycle(filled);
      } else {
        reader.sink(filled.subarray(0, bytes), () => recycle(filled));
      }
      return true;
    },
  };
  return {
    onread,
    bind(socket) {
      readers.set(socket, reader);
      socket.once('close', () => {
        if (reader.current !== undefined) recycle(reader.current);
        reader.current = undefined;
      });
      // An onread socket emits no 'data'; flowing mode is what lets it emit 'end'.
      socket.resume();
    },
  };
}

export function splice(client: net.Socket, upstream: net.Socket, options: SpliceOptions): Splice {
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    client.destroy();
    upstream.destroy();
    options.onClose(upstream.bytesWritten, client.bytesWritten);
  };
  for (const socket of [client, upstream]) {
    socket.setTimeout(options.idleTimeoutMs, close);
    socket.on('error', close);
    socket.on('close', close);
  }
  const reader = readers.get(upstream);
  if (reader === undefined) {
    upstream.pipe(client);
  } else {
    let waiting = false;
    const resume = () => {
      waiting = false;
      upstream.resume();
    };
    reader.sink = (chunk, done) => {
      if (!client.write(chunk, done) && !waiting) {
        waiting = true;
        upstream.pause();
        client.once('drain', resume);
      }
    };
    for (const chunk of reader.held.splice(0)) reader.sink(chunk, () => {});
    upstream.once('end', () => client.end());
  }
  return {
    release(initial) {
      if (closed) return;
      if (initial !== undefined && initial.length > 0) upstream.write(initial);
      client.pipe(upstream);
    },
    close,
  };
}
