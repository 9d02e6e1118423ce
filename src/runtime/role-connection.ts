/**
 * One role of a sandbox (its launcher or its file agent for one user) as Moat holds it: a Unix
 * socket carrying frames. Whatever the role sends that breaks the frame rules closes this
 * connection (the role then ends: the sandbox loses that role, Moat goes on).
 *
 * While Moat waits on the role (a reply, the next batch of a stream, room in its socket), the
 * role must make progress within its deadline: send a frame or take bytes. One that does not
 * (stopped, or stuck) is closed with a RoleStalled error, which is what every call waiting on
 * it answers; its supervisor then ends it and the next call starts a new one. The deadline is
 * on progress, not on a call's whole time, so a long download or upload is never cut while it
 * moves.
 */
import type { Socket } from 'node:net';
import { drainedOrClosed } from '../net/index.js';
import { type Frame, FrameError, FrameReader, encodeFrame } from './frames.js';

/**
 * What Moat lets wait in a role's socket. Every sender waits for room long before (input
 * windows, drained()); past this the role has stopped reading, and holding more for it would
 * be Moat's memory spent at the sandbox's word.
 */
const MAX_UNREAD_BYTES = 32 << 20;

/** How long Moat waits for progress from a role, and whom it tells when one misses it. */
export interface RoleDeadline {
  readonly ms: number;
  readonly onMissed: () => void;
  /** True while the role cannot make progress through no fault of its own (its sandbox is frozen). */
  readonly excused: () => boolean;
}

/** A role made no progress within its deadline while Moat waited on it; it was replaced. */
export class RoleStalled extends Error {
  override readonly name = 'RoleStalled';
}

export class RoleConnection {
  private readonly reader = new FrameReader();
  private handler: (frame: Frame) => void = () => undefined;
  private ended: Error | undefined;
  private markClosed: (error: Error) => void = () => undefined;
  /** Resolves with why, once the connection is gone. */
  readonly closed = new Promise<Error>((resolve) => (this.markClosed = resolve));
  /** Waits of Moat's on the role not yet over; the deadline runs while there is one. */
  private waits = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly socket: Socket,
    /** For messages: `launcher of user in sandbox <id>`. */
    readonly label: string,
    private readonly deadline?: RoleDeadline,
  ) {
    socket.on('data', (chunk: Buffer) => this.receive(chunk));
    socket.on('drain', () => this.timer?.refresh());
    socket.on('error', (error) => this.end(error));
    socket.on('close', () => this.end(new Error(`the ${label} ended`)));
  }

  get alive(): boolean {
    return this.ended === undefined;
  }

  /** Why the connection ended, once it has. */
  get failure(): Error | undefined {
    return this.ended;
  }

  /** Frames from the role go to `handler` from now on (one handler per connection). */
  onFrame(handler: (frame: Frame) => void): void {
    this.handler = handler;
  }

  /**
   * Moat waits on the role from now until the returned function is called: meanwhile the role
   * must make progress within its deadline.
   */
  waitOn(): () => void {
    let over = false;
    if (this.ended) return () => undefined;
    this.waits += 1;
    if (this.deadline !== undefined && this.timer === undefined) {
      const { ms, onMissed, excused } = this.deadline;
      this.timer = setTimeout(() => {
        if (excused()) {
          this.timer?.refresh();
          return;
        }
        this.timer = undefined;
        onMissed();
        this.socket.destroy();
        this.end(
          new RoleStalled(
            `the ${this.label} made no progress within ${ms / 1000} s; it was ended and a new one starts on next use`,
          ),
        );
      }, ms);
      this.timer.unref();
    }
    return () => {
      if (over) return;
      over = true;
      this.waits -= 1;
      if (this.waits === 0) this.stopTimer();
    };
  }

  /** Sends a frame; false when the socket's buffer is full (wait for drain before more). */
  send(header: object, payload?: Buffer): boolean {
    if (this.ended) return false;
    if (this.socket.writableLength > MAX_UNREAD_BYTES) {
      this.protocolError(new Error(`it left ${this.socket.writableLength} bytes unread`));
      return false;
    }
    return this.socket.write(encodeFrame(header, payload));
  }

  /** Resolves when the socket can take more (at once when it can). */
  drained(): Promise<void> {
    if (this.ended || !this.socket.writableNeedDrain) return Promise.resolve();
    const over = this.waitOn();
    // Resolved by the end too: a stalled role's socket is destroyed, which closes it.
    return drainedOrClosed(this.socket).finally(over);
  }

  close(): void {
    this.socket.destroy();
    this.end(new Error(`the ${this.label} was closed`));
  }

  private receive(chunk: Buffer): void {
    if (this.ended) return;
    let frames: Frame[];
    try {
      frames = this.reader.push(chunk);
    } catch (error) {
      this.protocolError(error as Error);
      return;
    }
    if (frames.length > 0) this.timer?.refresh();
    for (const frame of frames) {
      try {
        this.handler(frame);
      } catch (error) {
        // A frame of the wrong shape (FrameError) or one no handler could take: either way the
        // role's word is void, and nothing it sent may take Moat down.
        this.protocolError(error as Error);
        return;
      }
      if (this.ended) return;
    }
  }

  private protocolError(error: Error): void {
    this.socket.destroy();
    this.end(
      new FrameError(`the ${this.label} broke the protocol (${error.message}); it was ended`),
    );
  }

  private stopTimer(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private end(error: Error): void {
    if (this.ended) return;
    this.ended = error;
    this.stopTimer();
    this.markClosed(error);
  }
}
