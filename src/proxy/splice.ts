import net from 'node:net';
import type { FlowEnd } from '../flows/index.js';

export interface SpliceOptions {
  readonly idleTimeoutMs: number;
  /**
   * Once the upstream has ended, how long the tunnel may stay silent (default 10 s): the client
   * may still finish an upload, but a pooled connection whose origin left must not hold its
   * slot for the whole idle timeout.
   */
  readonly finishedIdleMs?: number;
  /**
   * Called once when both sides are closed, with the bytes each way and, where the relay
   * knows it, how the tunnel ended (closed when not).
   */
  readonly onClose: (bytesUp: number, bytesDown: number, end?: FlowEnd) => void;
}

/** What a guard lets through now (possibly bytes it held before), or why the splice must close. */
export type Checked = { readonly pass: Buffer } | { readonly problem: string };

/** Watches a spliced connection's bytes for what the tunnel was not decided for. */
export interface TunnelGuard {
  /** Sees every client chunk (the initial bytes first) before the upstream does. */
  fromClient(chunk: Buffer): Checked;
  /** Sees every upstream chunk before the client does; may let held client bytes go on. */
  fromUpstream?(chunk: Buffer): Checked;
  /** True once it passes every byte as it is: a relay may stop showing it any. */
  readonly done?: boolean;
  /**
   * True while it awaits the upstream's answer (and may hold client bytes until it shows): a
   * relay shows it upstream bytes only then, and passes the client's end on only after. Read
   * again after every call.
   */
  readonly watchesUpstream?: boolean;
}

export interface Splice {
  /**
   * Starts client -> upstream, after sending `initial` (bytes already read from the client).
   * With a `guard`, every client byte (and every upstream byte, if it watches those) passes it
   * first; a problem closes the splice after `refused` was told.
   */
  release(initial?: Buffer, guard?: TunnelGuard, refused?: (problem: string) => void): void;
  /**
   * Shows the client bytes that arrive before `release` to `onData`; `onGone` is called once if
   * the client ends or the splice closes first. Returns the function that stops both.
   */
  hold(onData: (chunk: Buffer) => void, onGone: () => void): () => void;
  close(): void;
}

// Read buffers for upstream -> client. Node's own reads allocate a fresh 64 KiB buffer each and
// pipe() hands it on; most of a bulk tunnel's CPU went there. An upstream socket made by
// connectUpstream reads (`onread`) into buffers recycled across reads and tunnels instead, and
// their size follows the traffic:
// - a socket that is not streaming reads into LANDING, one buffer shared by all of them, and
//   its bytes are copied out at once (as Node would): an idle tunnel holds no buffer of its own;
// - a read that fills its buffer means the sender is ahead, so the next read gets a private
//   buffer twice as large (up to MAX_READ_BYTES), lent to the client write as it is, no copy;
// - a read that does not fill it means the tunnel caught up: back to LANDING. A write that meets
//   backpressure halves the next buffer, so a slow reader does not pin large ones.
// A private buffer goes back to the pool only in the callback of the write that took it (the
// kernel has its bytes then); recycled buffers hold other tunnels' old bytes, and only the
// [0, bytes read) view of one is ever written.

const KiB = 1024;
/** Node's own read size; reads into it are copied, so it is never referenced after its read. */
const LANDING_BYTES = 64 * KiB;
/** In the bulk benchmark 256 KiB was slower, and 2 MiB no faster. */
const MAX_READ_BYTES = 1024 * KiB;
/**
 * Private buffers of all tunnels together, read into or lent to a write. Past it tunnels read
 * into LANDING: slower, never more memory, whatever the number of tunnels.
 */
const PRIVATE_LIMIT_BYTES = 64 * 1024 * KiB;
/** Free buffers kept per size, enough for a few streaming tunnels to swap without allocating. */
const POOL_PER_SIZE = 4;

const landing = Buffer.allocUnsafeSlow(LANDING_BYTES);
const pool = new Map<number, Buffer[]>();
let privateBytes = 0;
let pooledBytes = 0;

function take(size: number): Buffer {
  privateBytes += size;
  const reused = pool.get(size)?.pop();
  if (reused === undefined) return Buffer.allocUnsafeSlow(size);
  pooledBytes -= size;
  return reused;
}

function give(buffer: Buffer): void {
  privateBytes -= buffer.length;
  let free = pool.get(buffer.length);
  if (free === undefined) pool.set(buffer.length, (free = []));
  if (free.length >= POOL_PER_SIZE) return;
  free.push(buffer);
  pooledBytes += buffer.length;
}

/** Bytes of private read buffers: held by tunnels (read into or being written), and pooled. */
export function readBufferBytes(): { inUse: number; pooled: number } {
  return { inUse: privateBytes, pooled: pooledBytes };
}

/** Receives one read: writes it on, calls `done` once the bytes are no longer needed. */
type Deliver = (chunk: Buffer, done: () => void) => boolean;

interface Reader {
  deliver: Deliver;
  /** Where the socket's next read lands. */
  current: Buffer;
  nextBytes: number;
}

const readers = new WeakMap<net.Socket, Reader>();

/**
 * net.connect for an upstream that splice() will join to a client: it reads into the recycled
 * buffers above. It reads nothing until spliced (so no byte can arrive before there is somewhere
 * to put it).
 */
export function connectUpstream(options: net.TcpNetConnectOpts): net.Socket {
  const reader: Reader = {
    deliver: (_, done) => {
      done();
      socket.destroy(
        new Error(`${options.host}:${options.port} was read from before it was spliced`),
      );
      return false;
    },
    current: landing,
    nextBytes: LANDING_BYTES,
  };
  const socket = net.connect({
    ...options,
    // The origin may finish sending before the client does: its end must not cut the upload.
    allowHalfOpen: true,
    onread: {
      buffer: () => {
        const size = reader.nextBytes;
        reader.current =
          size > LANDING_BYTES && privateBytes + size <= PRIVATE_LIMIT_BYTES ? take(size) : landing;
        return reader.current;
      },
      callback: (bytes, buffer) => {
        const read = buffer as Buffer;
        const own = read !== landing;
        // LANDING is read into by every idle socket: copy out before any other read.
        const chunk = own ? read.subarray(0, bytes) : Buffer.from(read.subarray(0, bytes));
        // Lent to the write now; the socket's next buffer comes from `buffer` right after.
        reader.current = landing;
        const keptUp = reader.deliver(chunk, own ? () => give(read) : () => {});
        reader.nextBytes =
          bytes < read.length
            ? LANDING_BYTES
            : keptUp
              ? Math.min(2 * read.length, MAX_READ_BYTES)
              : Math.max(read.length / 2, LANDING_BYTES);
        return true;
      },
    },
  });
  readers.set(socket, reader);
  // Before net's own first read, which starts right after 'connect' unless paused.
  socket.once('connect', () => socket.pause());
  socket.once('close', () => {
    if (reader.current !== landing) give(reader.current);
    reader.current = landing;
  });
  return socket;
}

/**
 * Joins two sockets. Upstream -> client flows at once (server-first protocols such as SSH
 * must see their banner); client -> upstream waits for `release`, so the caller can inspect
 * the client's first bytes. Both ways respect backpressure: a slow reader pauses the fast
 * writer and nothing buffers without bound. Either side ending, failing or idling out closes
 * both (after an end, once the other side has written what it was given). An upstream from
 * connectUpstream is read into recycled buffers; any other socket, and the client (accepted by
 * a server, which offers no `onread`), is relayed chunk by chunk as Node reads it.
 */
export function splice(client: net.Socket, upstream: net.Socket, options: SpliceOptions): Splice {
  let closed = false;
  const close = (end: FlowEnd = 'closed') => {
    if (closed) return;
    closed = true;
    client.destroy();
    upstream.destroy();
    options.onClose(upstream.bytesWritten, client.bytesWritten, end);
  };
  const idle = () => close('idle');
  const failed = (error: NodeJS.ErrnoException) =>
    close(error.code === 'ECONNRESET' ? 'reset' : 'error');
  for (const [socket, other] of [
    [client, upstream],
    [upstream, client],
  ] as const) {
    socket.setTimeout(options.idleTimeoutMs, idle);
    socket.on('error', failed);
    // One side is done: the other may not have written all it was given yet (a slow reader),
    // and destroying it would drop that tail. It closes once flushed, or idles out.
    socket.on('close', () => {
      if (closed) return;
      if (other.writableLength === 0) return close();
      other.end();
      other.once('finish', close);
    });
  }
  upstream.once('end', () => {
    const finished = Math.min(options.idleTimeoutMs, options.finishedIdleMs ?? 10_000);
    client.setTimeout(finished);
    upstream.setTimeout(finished);
  });
  // Set once released with a guard that watches upstream bytes.
  let watchUpstream: ((chunk: Buffer) => void) | undefined;
  /** Shows an upstream chunk to the guard; false when that closed the splice. */
  const watch = (chunk: Buffer) => {
    watchUpstream?.(chunk);
    return !closed;
  };
  const reader = readers.get(upstream);
  if (reader === undefined) relay(upstream, client, (chunk) => (watch(chunk) ? chunk : undefined));
  else writeReads(reader, upstream, client, watch);
  return {
    release(initial, guard, refused) {
      if (closed) return;
      const checked = (result: Checked): Buffer | undefined => {
        if ('pass' in result) return result.pass;
        refused?.(result.problem);
        close();
        return undefined;
      };
      const fromClient = guard && ((chunk: Buffer) => checked(guard.fromClient(chunk)));
      const first = initial !== undefined && fromClient ? fromClient(initial) : initial;
      if (closed) return;
      if (first !== undefined && first.length > 0) upstream.write(first);
      // The client's end, while the guard holds its bytes for an answer: it goes after them.
      let endHeld = false;
      const endUpstream = () => {
        endHeld = guard?.watchesUpstream === true;
        if (!endHeld) upstream.end();
      };
      if (guard?.fromUpstream !== undefined) {
        const fromUpstream = guard.fromUpstream.bind(guard);
        watchUpstream = (chunk) => {
          if (guard.watchesUpstream !== true) return;
          const held = checked(fromUpstream(chunk));
          if (held !== undefined && held.length > 0) upstream.write(held);
          if (endHeld && !closed) endUpstream();
        };
      }
      relay(client, upstream, fromClient, endUpstream);
    },
    hold(onData, onGone) {
      const stop = () => {
        client.off('data', onData).off('end', gone).off('close', gone);
      };
      const gone = () => {
        stop();
        onGone();
      };
      client.on('data', onData);
      client.once('end', gone);
      client.once('close', gone);
      // Paused since its head was read: bytes sent before the tunnel existed waited there.
      client.resume();
      return stop;
    },
    close,
  };
}

/**
 * What pipe() does for two sockets, without its generality (one listener instead of seven; a
 * tunnel's life is short and most carry a request or two).
 */
function relay(
  from: net.Socket,
  to: net.Socket,
  inspect?: (chunk: Buffer) => Buffer | undefined,
  onEnd: () => void = () => void to.end(),
): void {
  let waiting = false;
  const resume = () => {
    waiting = false;
    from.resume();
  };
  from.on('data', (received: Buffer) => {
    const chunk = inspect === undefined ? received : inspect(received);
    if (chunk === undefined || chunk.length === 0) return;
    if (to.write(chunk) || waiting) return;
    waiting = true;
    from.pause();
    to.once('drain', resume);
  });
  // The end may have come and gone before the relay began (a client that wrote and half-closed).
  if (from.readableEnded) onEnd();
  else from.once('end', onEnd);
  from.resume();
}

/**
 * What pipe() does, for the reads of a connectUpstream socket; `watch` sees each read first and
 * says whether to write it on.
 */
function writeReads(
  reader: Reader,
  upstream: net.Socket,
  client: net.Socket,
  watch: (chunk: Buffer) => boolean,
): void {
  let waiting = false;
  const resume = () => {
    waiting = false;
    upstream.resume();
  };
  reader.deliver = (chunk, done) => {
    if (!watch(chunk)) {
      done();
      return true;
    }
    // The callback runs when the kernel took the bytes, or the write failed: either way once.
    if (client.write(chunk, done)) return true;
    if (!waiting) {
      waiting = true;
      // An onread socket stops reading at its handle.
      upstream.pause();
      client.once('drain', resume);
    }
    return false;
  };
  upstream.once('end', () => client.end());
  // Starts reading; flowing mode is also what lets an onread socket emit 'end'.
  upstream.resume();
}
