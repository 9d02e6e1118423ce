/**
 * One role of a sandbox (its launcher or its file agent for one user) as Moat holds it: a Unix
 * socket carrying frames. Whatever the role sends that breaks the frame rules closes this
 * connection (the role then ends: the sandbox loses that role, Moat goes on).
 */
import type { Socket } from 'node:net';
import { drainedOrClosed } from '../drained.js';
import { type Frame, FrameError, FrameReader, encodeFrame } from './frames.js';

/**
 * What Moat lets wait in a role's socket. Every sender waits for room long before (input
 * windows, drained()); past this the role has stopped reading, and holding more for it would
 * be Moat's memory spent at the sandbox's word.
 */
const MAX_UNREAD_BYTES = 32 << 20;

export class RoleConnection {
  private readonly reader = new FrameReader();
  private handler: (frame: Frame) => void = () => undefined;
  private ended: Error | undefined;
  private markClosed: (error: Error) => void = () => undefined;
  /** Resolves with why, once the connection is gone. */
  readonly closed = new Promise<Error>((resolve) => (this.markClosed = resolve));

  constructor(
    private readonly socket: Socket,
    /** For messages: `launcher of user in sandbox <id>`. */
    readonly label: string,
  ) {
    socket.on('data', (chunk: Buffer) => this.receive(chunk));
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
    return this.ended || !this.socket.writableNeedDrain
      ? Promise.resolve()
      : drainedOrClosed(this.socket);
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

  private end(error: Error): void {
    if (this.ended) return;
    this.ended = error;
    this.markClosed(error);
  }
}
