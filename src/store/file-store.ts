/**
 * The embedded store: all state in one folder, durable before a commit resolves.
 *
 * Why a write-ahead log rather than write-temp-fsync-rename per record: a rename-based write
 * costs two fsyncs (the file, then its folder) and one file per record, and concurrent writers
 * cannot share them. An append-only log costs one fdatasync per *batch*: commits that arrive
 * while a sync is in flight are written and synced together (group commit), so the cost per
 * acknowledged write falls as load rises. The log is folded into a state file (written
 * temp-fsync-rename) when it grows, so start-up replays a bounded amount.
 *
 * Files: `state` (header line, then the JSON of every record as of sequence number N) and
 * `log` (header line, then one line per commit: `<crc32> {"seq":n,"changes":[...]}`).
 * Replay skips log entries already folded into `state`. A torn last entry (the process or the
 * machine died mid-append, so that commit was never acknowledged) is cut off with a warning; a
 * damaged entry followed by valid ones, a checksum mismatch in `state`, a sequence gap or a file
 * that is not ours stops start-up with an error naming the file: state is never dropped silently.
 */
import { constants, existsSync, readFileSync } from 'node:fs';
import { type FileHandle, mkdir, open, readFile, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { crc32 } from 'node:zlib';
import { type JsonValue, type Store, type StoreChange, StoreUnavailableError } from './store.js';
import { processRuns } from '../process/index.js';

const LOG_HEADER = 'moat-store-log v1';
const STATE_HEADER = 'moat-store-state v1';

export interface FileStoreOptions {
  /** Fold the log into the state file once it is this large and twice the state (bytes). */
  readonly compactAfterBytes?: number;
  /** Things recovery did that an operator should hear about (a torn entry cut off). */
  readonly onWarning?: (message: string) => void;
  /** Seconds each batch took to reach the disk. */
  readonly onSync?: (seconds: number, commits: number) => void;
}

/** A start-up failure: the folder holds something we must not overwrite or guess about. */
export class StoreOpenError extends Error {
  override readonly name = 'StoreOpenError';
}

interface PendingCommit {
  /** The changes as they go into the log. */
  readonly text: string;
  readonly resolve: () => void;
  readonly reject: (error: Error) => void;
}

type Collections = Map<string, Map<string, JsonValue>>;

const checksum = (text: string) => crc32(text).toString(16).padStart(8, '0');

/** Folders open in this process: a lock file naming our own pid is stale unless listed here. */
const openHere = new Set<string>();

export class FileStore implements Store {
  private pending: PendingCommit[] = [];
  private flushing = false;
  private failure: Error | undefined;
  private closed = false;

  private constructor(
    readonly location: string,
    private readonly data: Collections,
    private log: FileHandle,
    private seq: number,
    private logBytes: number,
    private stateBytes: number,
    private readonly options: FileStoreOptions,
  ) {}

  /** Opens (creating when absent) the store in `dir`, replaying what is on disk. */
  static async open(dir: string, options: FileStoreOptions = {}): Promise<FileStore> {
    const location = path.resolve(dir);
    await mkdir(location, { recursive: true, mode: 0o700 });
    await takeLock(location);
    try {
      const statePath = path.join(location, 'state');
      const logPath = path.join(location, 'log');
      const state = existsSync(statePath)
        ? parseState(statePath, await readFile(statePath, 'utf8'))
        : { seq: 0, data: new Map() as Collections, bytes: 0 };
      if (!existsSync(logPath)) await writeDurably(logPath, `${LOG_HEADER}\n`);
      const replayed = await replayLog(logPath, state.seq, state.data, options.onWarning);
      const log = await open(logPath, constants.O_WRONLY | constants.O_APPEND);
      return new FileStore(
        location,
        state.data,
        log,
        replayed.seq,
        replayed.bytes,
        state.bytes,
        options,
      );
    } catch (error) {
      await releaseLock(location);
      throw error;
    }
  }

  async get(collection: string, key: string): Promise<JsonValue | undefined> {
    return this.data.get(collection)?.get(key);
  }

  async list(collection: string): Promise<Array<[string, JsonValue]>> {
    return [...(this.data.get(collection) ?? [])];
  }

  commit(changes: readonly StoreChange[]): Promise<void> {
    if (this.closed) return Promise.reject(new StoreUnavailableError('the store is closed'));
    if (this.failure) return Promise.reject(this.unavailable());
    if (changes.length === 0) return Promise.resolve();
    const text = JSON.stringify(changes);
    return new Promise((resolve, reject) => {
      this.pending.push({ text, resolve, reject });
      if (!this.flushing) void this.flush();
    });
  }

  async notReady(): Promise<string | undefined> {
    if (this.closed) return `the store in ${this.location} is closed`;
    return this.failure ? this.unavailable().message : undefined;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    while (this.flushing) await new Promise((resolve) => setImmediate(resolve));
    await this.log.close();
    await releaseLock(this.location);
  }

  private unavailable(): StoreUnavailableError {
    return new StoreUnavailableError(
      `the store in ${this.location} stopped taking writes after a disk error: ${this.failure?.message}`,
    );
  }

  /** Writes and syncs everything queued, one batch per sync, until the queue is empty. */
  private async flush(): Promise<void> {
    this.flushing = true;
    while (this.pending.length > 0) {
      const batch = this.pending;
      this.pending = [];
      const lines = batch.map((commit, i) => {
        const json = `{"seq":${this.seq + i + 1},"changes":${commit.text}}`;
        return `${checksum(json)} ${json}\n`;
      });
      const bytes = Buffer.from(lines.join(''));
      const started = process.hrtime.bigint();
      try {
        await writeAll(this.log, bytes);
        await this.log.datasync();
      } catch (error) {
        await this.undoPartialWrite(error as Error);
        for (const commit of batch) commit.reject(this.unavailable());
        continue;
      }
      this.options.onSync?.(Number(process.hrtime.bigint() - started) / 1e9, batch.length);
      this.seq += batch.length;
      this.logBytes += bytes.length;
      for (const commit of batch) {
        // What was written, read back: memory then holds exactly what a restart would load (a value
        // that JSON cannot carry, such as -0, must not look different before and after).
        applyChanges(this.data, JSON.parse(commit.text) as StoreChange[]);
        commit.resolve();
      }
      if (
        this.logBytes > Math.max(this.options.compactAfterBytes ?? 8 << 20, 2 * this.stateBytes)
      ) {
        await this.compact();
      }
    }
    this.flushing = false;
  }

  /** A failed append may leave half an entry: cut it off so later entries stay readable. */
  private async undoPartialWrite(cause: Error): Promise<void> {
    this.failure = cause;
    try {
      await this.log.truncate(this.logBytes);
      await this.log.datasync();
      this.failure = undefined;
    } catch {
      // The store stays failed: further commits get 503 until an operator looks.
    }
  }

  /** Folds the log into a new state file, then starts an empty log. */
  private async compact(): Promise<void> {
    const body = JSON.stringify({ seq: this.seq, collections: collectionsToJson(this.data) });
    const text = `${STATE_HEADER} ${checksum(body)}\n${body}`;
    const logPath = path.join(this.location, 'log');
    try {
      await writeDurably(path.join(this.location, 'state'), text);
      // A crash here leaves the new state and the old log: replay skips what state holds.
      await writeDurably(logPath, `${LOG_HEADER}\n`);
      await this.log.close();
      this.log = await open(logPath, constants.O_WRONLY | constants.O_APPEND);
      this.logBytes = LOG_HEADER.length + 1;
      this.stateBytes = text.length;
    } catch (error) {
      this.options.onWarning?.(
        `could not fold the store log into ${this.location}/state (${(error as Error).message}); the log keeps growing until it can`,
      );
    }
  }
}

function applyChanges(data: Collections, changes: readonly StoreChange[]): void {
  for (const { collection, key, value } of changes) {
    let records = data.get(collection);
    if (value === null) {
      records?.delete(key);
      continue;
    }
    if (records === undefined) data.set(collection, (records = new Map()));
    records.set(key, value);
  }
}

function collectionsToJson(data: Collections): Record<string, Record<string, JsonValue>> {
  // No prototype: a collection named `__proto__` must be a property like any other.
  const out = Object.create(null) as Record<string, Record<string, JsonValue>>;
  for (const [name, records] of data) out[name] = Object.fromEntries(records);
  return out;
}

function parseState(file: string, text: string): { seq: number; data: Collections; bytes: number } {
  const newline = text.indexOf('\n');
  const header = text.slice(0, newline);
  const body = text.slice(newline + 1);
  if (newline < 0 || !header.startsWith(`${STATE_HEADER} `)) {
    throw new StoreOpenError(
      `${file} is not a Moat store state file (it does not start with "${STATE_HEADER}"); point --data-dir at Moat's own folder`,
    );
  }
  if (header.slice(STATE_HEADER.length + 1) !== checksum(body)) {
    throw new StoreOpenError(
      `${file} is damaged (checksum mismatch); restore it from a backup, or move the folder aside to start empty`,
    );
  }
  const parsed = JSON.parse(body) as { seq: number; collections: Record<string, object> };
  const data: Collections = new Map();
  for (const [name, records] of Object.entries(parsed.collections)) {
    data.set(name, new Map(Object.entries(records) as Array<[string, JsonValue]>));
  }
  return { seq: parsed.seq, data, bytes: text.length };
}

/** Reads one log entry; undefined when the line is damaged. */
function parseEntry(line: string): { seq: number; changes: StoreChange[] } | undefined {
  const space = line.indexOf(' ');
  const json = line.slice(space + 1);
  if (space !== 8 || line.slice(0, 8) !== checksum(json)) return undefined;
  try {
    const entry = JSON.parse(json) as { seq: unknown; changes: unknown };
    if (!Number.isSafeInteger(entry.seq) || !Array.isArray(entry.changes)) return undefined;
    return entry as { seq: number; changes: StoreChange[] };
  } catch {
    return undefined;
  }
}

async function replayLog(
  file: string,
  stateSeq: number,
  data: Collections,
  onWarning: ((message: string) => void) | undefined,
): Promise<{ seq: number; bytes: number }> {
  const text = await readFile(file, 'utf8');
  if (!text.startsWith(`${LOG_HEADER}\n`)) {
    throw new StoreOpenError(
      `${file} is not a Moat store log (it does not start with "${LOG_HEADER}"); point --data-dir at Moat's own folder`,
    );
  }
  let seq = stateSeq;
  let offset = LOG_HEADER.length + 1;
  let damagedAt: { line: number; offset: number } | undefined;
  const lines = text.slice(offset).split('\n');
  for (const [index, line] of lines.entries()) {
    const complete = index < lines.length - 1;
    const entry = complete ? parseEntry(line) : undefined;
    if (entry === undefined) {
      if (line !== '' || complete) damagedAt ??= { line: index + 2, offset };
    } else if (damagedAt !== undefined) {
      throw new StoreOpenError(
        `${file} line ${damagedAt.line} is damaged but later entries are intact; refusing to guess. Restore the folder from a backup, or remove the damaged line by hand if you accept losing that change`,
      );
    } else if (entry.seq > seq) {
      if (entry.seq !== seq + 1) {
        throw new StoreOpenError(
          `${file} line ${index + 2} has sequence ${entry.seq} after ${seq}: entries are missing; restore the folder from a backup`,
        );
      }
      applyChanges(data, entry.changes);
      seq = entry.seq;
    }
    offset += Buffer.byteLength(line) + (complete ? 1 : 0);
  }
  if (damagedAt !== undefined) {
    // Only the tail is damaged: an append that never completed, so never acknowledged.
    onWarning?.(
      `${file}: cut off an incomplete entry at line ${damagedAt.line} (a write interrupted by a crash; it was never acknowledged)`,
    );
    const handle = await open(file, 'r+');
    await handle.truncate(damagedAt.offset);
    await handle.sync();
    await handle.close();
    return { seq, bytes: damagedAt.offset };
  }
  return { seq, bytes: offset };
}

async function writeAll(handle: FileHandle, bytes: Buffer): Promise<void> {
  let written = 0;
  while (written < bytes.length) {
    const { bytesWritten } = await handle.write(bytes, written, bytes.length - written);
    written += bytesWritten;
  }
}

/** Replaces `file` so that a crash leaves either the old or the new content, never a mix. */
async function writeDurably(file: string, text: string): Promise<void> {
  const temporary = `${file}.tmp`;
  const handle = await open(temporary, 'w', 0o600);
  try {
    await writeAll(handle, Buffer.from(text));
    await handle.sync();
  } finally {
    await handle.close();
  }
  await rename(temporary, file);
  const folder = await open(path.dirname(file), 'r');
  try {
    await folder.sync();
  } finally {
    await folder.close();
  }
}

/** One Moat per folder: two writers appending to one log would interleave entries. */
async function takeLock(dir: string): Promise<void> {
  const lockPath = path.join(dir, 'lock');
  try {
    await writeFile(lockPath, `${process.pid}\n`, { flag: 'wx', mode: 0o600 });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    const holder = Number.parseInt(readFileSync(lockPath, 'utf8'), 10);
    if (processRuns(holder) && (holder !== process.pid || openHere.has(dir))) {
      throw new StoreOpenError(
        `the data folder ${dir} is in use by process ${holder}; stop that Moat or choose another --data-dir`,
      );
    }
    await writeFile(lockPath, `${process.pid}\n`, { mode: 0o600 });
  }
  openHere.add(dir);
}

async function releaseLock(dir: string): Promise<void> {
  openHere.delete(dir);
  await rm(path.join(dir, 'lock'), { force: true });
}
