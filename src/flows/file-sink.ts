import { type FileHandle, open, rename } from 'node:fs/promises';
import { type FlowRecord, flowView } from './record.js';

/** Lines waiting for the disk before new ones are dropped: a slow disk never grows memory. */
export const MAX_PENDING_BYTES = 4 << 20;

/**
 * The JSON Lines file sink (`--flow-log FILE`): one record per line, appended without fsync.
 * `add` never waits: it queues the line (dropping it, and counting, when the queue is full)
 * and one writer drains the queue. Once the file reaches `maxBytes` it becomes FILE.1 (the
 * previous FILE.1 is replaced) and a new FILE is begun.
 */
export class FlowFileSink {
  private pending: string[] = [];
  private pendingBytes = 0;
  private writing: Promise<void> | undefined;
  private handle: FileHandle | undefined;
  private size = 0;
  private closed = false;

  private constructor(
    readonly path: string,
    private readonly maxBytes: number,
    private readonly onDropped: () => void,
    private readonly onError: (error: Error) => void,
  ) {}

  /** Opens (appends to) `path`; fails when it cannot be opened, naming it. */
  static async open(
    path: string,
    maxBytes: number,
    onDropped: () => void,
    onError: (error: Error) => void,
  ): Promise<FlowFileSink> {
    const sink = new FlowFileSink(path, maxBytes, onDropped, onError);
    await sink.reopen();
    return sink;
  }

  /** Queues a record's line, or drops it (counted) when the queue is full. */
  add(record: FlowRecord): void {
    if (this.closed) return;
    const line = `${JSON.stringify(flowView(record))}\n`;
    if (this.pendingBytes + line.length > MAX_PENDING_BYTES) {
      this.onDropped();
      return;
    }
    this.pending.push(line);
    this.pendingBytes += line.length;
    this.writing ??= this.drain().finally(() => {
      this.writing = undefined;
    });
  }

  /** Writes what is queued, then closes the file. */
  async close(): Promise<void> {
    this.closed = true;
    await this.writing;
    await this.handle?.close();
    this.handle = undefined;
  }

  private async reopen(): Promise<void> {
    this.handle = await open(this.path, 'a', 0o600).catch((error: Error) => {
      throw new Error(`--flow-log ${this.path}: ${error.message}`);
    });
    this.size = (await this.handle.stat()).size;
  }

  private async drain(): Promise<void> {
    while (this.pending.length > 0) {
      const text = this.pending.join('');
      this.pending = [];
      this.pendingBytes = 0;
      try {
        if (this.handle === undefined) await this.reopen();
        await this.handle!.write(text);
        this.size += Buffer.byteLength(text);
        if (this.size >= this.maxBytes) await this.rotate();
      } catch (error) {
        // The lines are lost (counted); the next ones try again on a reopened file.
        for (let i = text.indexOf('\n'); i >= 0; i = text.indexOf('\n', i + 1)) this.onDropped();
        this.onError(error as Error);
        await this.handle?.close().catch(() => {});
        this.handle = undefined;
      }
    }
  }

  private async rotate(): Promise<void> {
    await this.handle!.close();
    this.handle = undefined;
    await rename(this.path, `${this.path}.1`);
    // Begun even while closing: FILE always exists after a rotation, holding the newest lines.
    await this.reopen();
  }
}
