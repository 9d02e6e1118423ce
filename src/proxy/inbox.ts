import type net from 'node:net';

/** Takes bytes; returns how many of them it used (the rest go back to the inbox). */
export type Reader = (chunk: Buffer) => number;

/**
 * The bytes a socket receives, handed to one reader at a time: the one reading the current
 * message's head or body. Bytes that arrive while nobody reads, or that a reader leaves over
 * (the start of the next message), wait here and the socket is paused, so a client pipelining
 * requests never gets more than one chunk ahead.
 */
export class Inbox {
  private waiting: Buffer | undefined;
  private reader: Reader | undefined;

  /** A reader paused the socket for backpressure; `read` must not resume it. */
  private throttled = false;
  /** Changes with every new reader, so a stale throttle's release does nothing. */
  private generation = 0;
  private readonly onData = (chunk: Buffer) => this.offer(chunk);

  /** `initial`: bytes already read from the socket (by the native relay), handed out first. */
  constructor(
    readonly socket: net.Socket,
    initial?: Buffer,
  ) {
    socket.on('data', this.onData);
    if (initial !== undefined && initial.length > 0) this.keep(initial);
  }

  /** Bytes are waiting that no reader has taken yet. */
  get pending(): boolean {
    return this.waiting !== undefined;
  }

  /** Hands waiting bytes, then what arrives, to `reader` until it stops (or another reads). */
  read(reader: Reader): void {
    this.reader = reader;
    this.generation++;
    this.throttled = false;
    const waiting = this.waiting;
    this.waiting = undefined;
    if (waiting !== undefined) this.offer(waiting);
    if (
      this.reader === reader &&
      this.waiting === undefined &&
      !this.throttled &&
      !this.socket.destroyed
    )
      this.socket.resume();
  }

  /** Stops handing bytes on; later ones wait, with the socket paused. */
  stop(): void {
    this.handOver();
    this.socket.pause();
  }

  /**
   * Stops handing bytes on without pausing the socket, for a reader expected before the next
   * bytes (a pooled connection taken for a request, a client connection between a head and
   * the next reader): resuming a paused socket costs a tick of stream work. Bytes that arrive
   * with no reader wait and pause it all the same.
   */
  handOver(): void {
    this.reader = undefined;
    this.generation++;
    this.throttled = false;
  }

  /**
   * Pauses the socket because what the reader writes is not being taken (backpressure);
   * returns the function that resumes it, which does nothing once another reader took over.
   */
  throttle(): () => void {
    this.throttled = true;
    this.socket.pause();
    const generation = this.generation;
    return () => {
      if (generation !== this.generation || !this.throttled) return;
      this.throttled = false;
      if (this.waiting === undefined && !this.socket.destroyed) this.socket.resume();
    };
  }

  /** Gives the socket up (to a tunnel, paused): returns the bytes no reader took. */
  detach(): Buffer {
    this.stop();
    this.socket.off('data', this.onData);
    const waiting = this.waiting ?? Buffer.alloc(0);
    this.waiting = undefined;
    return waiting;
  }

  private offer(chunk: Buffer): void {
    const reader = this.reader;
    if (reader === undefined) return this.keep(chunk);
    const used = reader(chunk);
    if (used < chunk.length) {
      // A reader that leaves bytes is done with them; it stops itself or another took over.
      if (this.reader === reader) this.stop();
      this.keep(chunk.subarray(used));
      if (this.reader !== undefined) this.read(this.reader);
    }
  }

  private keep(bytes: Buffer): void {
    this.waiting = this.waiting === undefined ? bytes : Buffer.concat([this.waiting, bytes]);
    this.socket.pause();
  }
}
