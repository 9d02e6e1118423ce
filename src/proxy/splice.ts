import type net from 'node:net';

export interface SpliceOptions {
  readonly idleTimeoutMs: number;
  /** Called once when both sides are closed, with the bytes each way. */
  readonly onClose: (bytesUp: number, bytesDown: number) => void;
}

export interface Splice {
  /** Starts client -> upstream, after sending `initial` (bytes already read from the client). */
  release(initial?: Buffer): void;
  close(): void;
}

/**
 * Joins two sockets. Upstream -> client flows at once (server-first protocols such as SSH
 * must see their banner); client -> upstream waits for `release`, so the caller can inspect
 * the client's first bytes. pipe() respects backpressure both ways: a slow reader pauses the
 * fast writer and nothing buffers without bound. Either side ending, failing or idling out
 * closes both.
 */
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
  upstream.pipe(client);
  return {
    release(initial) {
      if (closed) return;
      if (initial !== undefined && initial.length > 0) upstream.write(initial);
      client.pipe(upstream);
    },
    close,
  };
}
