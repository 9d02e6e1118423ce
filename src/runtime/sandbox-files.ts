/**
 * A sandbox's files as the sandbox API reaches them: every operation is carried out inside the
 * sandbox by the file agent of the user asking (supervisor/files.py), so the kernel resolves
 * each path in the sandbox's own view with that user's permissions (a write the user may not
 * create is created for the user by root's agent: see upload). Moat never opens a path a
 * sandbox controls.
 *
 * Replies are checked before use: an agent that answers out of shape is closed.
 */
import { randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import { field, FrameError, type Frame, type FrameHeader } from './frames.js';
import { USERS } from './confinement.js';
import type { RoleConnection } from './role-connection.js';

/** EntryInfo as envd answers it (proto3 JSON: int64 as a string, zero values left out). */
export interface EntryInfo {
  name: string;
  type?: 'FILE_TYPE_FILE' | 'FILE_TYPE_DIRECTORY' | 'FILE_TYPE_SYMLINK';
  path: string;
  size?: string;
  mode?: number;
  permissions: string;
  owner: string;
  group: string;
  modifiedTime: string;
  symlinkTarget?: string;
  metadata?: Record<string, string>;
}

export type FileEventType =
  | 'EVENT_TYPE_CREATE'
  | 'EVENT_TYPE_WRITE'
  | 'EVENT_TYPE_REMOVE'
  | 'EVENT_TYPE_RENAME'
  | 'EVENT_TYPE_CHMOD';

export interface FileEvent {
  /** Relative to the watched folder. */
  name: string;
  type: FileEventType;
  entry?: EntryInfo;
}

/** A failed operation: an errno name (ENOENT...) or `invalid`, `exists`, `exhausted`. */
export class FileAgentError extends Error {
  override readonly name = 'FileAgentError';
  constructor(
    readonly code: string,
    message: string,
    /** The path at fault when it is not the one the operation named first (a compose source). */
    readonly path?: string,
  ) {
    super(message);
  }
}

const TYPES = new Set(['FILE_TYPE_FILE', 'FILE_TYPE_DIRECTORY', 'FILE_TYPE_SYMLINK']);
const EVENT_TYPES = new Set([
  'EVENT_TYPE_CREATE',
  'EVENT_TYPE_WRITE',
  'EVENT_TYPE_REMOVE',
  'EVENT_TYPE_RENAME',
  'EVENT_TYPE_CHMOD',
]);

const isString = (value: unknown): value is string => typeof value === 'string';

function entryOf(value: unknown): EntryInfo {
  const entry = value as Record<string, unknown>;
  const valid =
    typeof entry === 'object' &&
    entry !== null &&
    ['name', 'path', 'permissions', 'owner', 'group', 'modifiedTime'].every((k) =>
      isString(entry[k]),
    ) &&
    (entry.type === undefined || TYPES.has(entry.type as string)) &&
    (entry.size === undefined || (isString(entry.size) && /^[0-9]{1,20}$/.test(entry.size))) &&
    (entry.mode === undefined || Number.isSafeInteger(entry.mode)) &&
    (entry.symlinkTarget === undefined || isString(entry.symlinkTarget)) &&
    (entry.metadata === undefined ||
      (typeof entry.metadata === 'object' &&
        entry.metadata !== null &&
        Object.values(entry.metadata).every(isString)));
  if (!valid) throw new FrameError('file agent sent an entry out of shape');
  return entry as unknown as EntryInfo;
}

function eventOf(value: unknown): FileEvent {
  const event = value as Record<string, unknown>;
  if (
    typeof event !== 'object' ||
    event === null ||
    !isString(event.name) ||
    !EVENT_TYPES.has(event.type as string)
  ) {
    throw new FrameError('file agent sent an event out of shape');
  }
  return {
    name: event.name,
    type: event.type as FileEventType,
    ...(event.entry === undefined ? {} : { entry: entryOf(event.entry) }),
  };
}

interface Request {
  readonly onFrame: (frame: Frame) => void;
  readonly fail: (error: Error) => void;
}

export interface WatchHandle {
  /** The watched folder as the sandbox names it. */
  readonly path: string;
  close(): void;
}

export interface StagedFile {
  /** Where it will land, as the sandbox names it. */
  readonly path: string;
  write(bytes: Buffer): Promise<void>;
  /** All bytes are written (and the metadata set); resolves once the agent has them. */
  end(): Promise<void>;
}

/** Which agent to use: the file agent of one user, started on demand. */
export type FileAgentSource = (user: string) => Promise<RoleConnection>;

/** The file agent of one user, as a set of typed calls. */
class FileAgent {
  private nextId = 1;
  private readonly requests = new Map<number, Request>();
  private readonly watches = new Map<string, (frame: Frame) => void>();

  constructor(readonly connection: RoleConnection) {
    connection.onFrame((frame) => this.route(frame));
    void connection.closed.then((error) => {
      for (const request of this.requests.values()) request.fail(error);
      this.requests.clear();
      for (const onFrame of this.watches.values()) {
        onFrame({
          header: { error: { code: 'EIO', message: error.message } },
          payload: Buffer.alloc(0),
          size: 0,
        });
      }
      this.watches.clear();
    });
  }

  private route(frame: Frame): void {
    if (frame.header.wid !== undefined) {
      this.watches.get(field.string(frame.header, 'wid'))?.(frame);
      return;
    }
    // A long operation's sign of life: progress for the connection's deadline, nothing more.
    if (frame.header.working === true) return;
    this.requests.get(field.int(frame.header, 'rid'))?.onFrame(frame);
  }

  /**
   * Sends a request; `onFrame` sees every frame answering it until it calls done(). Until
   * then Moat waits on the agent (its deadline runs), unless `waits` is false: the caller
   * then says itself when it waits (a download waits only while its reader wants more).
   */
  open(
    header: object,
    onFrame: (frame: Frame, done: () => void) => void,
    fail: (error: Error) => void,
    waits = true,
  ): number {
    const rid = this.nextId++;
    if (!this.connection.alive) {
      fail(this.connection.failure ?? new Error(`the ${this.connection.label} ended`));
      return rid;
    }
    const over = waits ? this.connection.waitOn() : () => undefined;
    const done = () => {
      over();
      this.requests.delete(rid);
    };
    this.requests.set(rid, {
      onFrame: (frame) => onFrame(frame, done),
      fail: (error) => {
        done();
        fail(error);
      },
    });
    this.connection.send({ ...header, rid });
    return rid;
  }

  /** One request, one reply. */
  call(header: object): Promise<FrameHeader> {
    return new Promise((resolve, reject) => {
      this.open(
        header,
        ({ header: reply }, done) => {
          done();
          const error = failureOf(reply);
          if (error) reject(error);
          else resolve(reply);
        },
        reject,
      );
    });
  }

  watch(wid: string, onFrame: (frame: Frame) => void): void {
    this.watches.set(wid, onFrame);
  }

  unwatch(wid: string): void {
    if (this.watches.delete(wid)) this.connection.send({ op: 'unwatch', wid });
  }
}

function failureOf(header: FrameHeader): FileAgentError | undefined {
  if (header.error === undefined) return undefined;
  const error = header.error as Record<string, unknown>;
  if (typeof error !== 'object' || error === null || !isString(error.code)) {
    throw new FrameError('file agent sent an error out of shape');
  }
  return new FileAgentError(
    error.code,
    isString(error.message) ? error.message.slice(0, 1000) : '',
    isString(error.path) ? error.path.slice(0, 4096) : undefined,
  );
}

/** Stages one file of an upload with `agent`: its bytes follow as data frames. */
async function staged(agent: FileAgent, request: object): Promise<StagedFile> {
  const sid = randomUUID();
  const reply = await agent.call({ ...request, sid });
  return {
    path: field.string(reply, 'path'),
    async write(bytes) {
      for (let offset = 0; offset < bytes.length; offset += 1 << 20) {
        if (
          !agent.connection.send({ op: 'data', sid }, bytes.subarray(offset, offset + (1 << 20)))
        ) {
          await agent.connection.drained();
        }
        if (!agent.connection.alive) throw agent.connection.failure!;
      }
    },
    async end() {
      await agent.call({ op: 'staged', sid });
    },
  };
}

/** What one listing may bring into Moat's memory, as the agent sent it. */
export const MAX_LIST_BYTES = 16 << 20;

export class SandboxFiles {
  private readonly agents = new Map<RoleConnection, FileAgent>();

  constructor(private readonly source: FileAgentSource) {}

  private async agent(user: string): Promise<FileAgent> {
    const connection = await this.source(user);
    let agent = this.agents.get(connection);
    if (agent === undefined) {
      agent = new FileAgent(connection);
      this.agents.set(connection, agent);
      void connection.closed.then(() => this.agents.delete(connection));
    }
    return agent;
  }

  /** The entry at `path`; with `follow`, what a final symlink points to. */
  async stat(user: string, path: string, follow = false): Promise<EntryInfo> {
    const reply = await (await this.agent(user)).call({ op: 'stat', path, follow });
    return entryOf(reply.entry);
  }

  async makeDir(user: string, path: string): Promise<EntryInfo> {
    return entryOf((await (await this.agent(user)).call({ op: 'mkdir', path })).entry);
  }

  async move(user: string, source: string, destination: string): Promise<EntryInfo> {
    return entryOf(
      (await (await this.agent(user)).call({ op: 'move', source, destination })).entry,
    );
  }

  async remove(user: string, path: string): Promise<void> {
    await (await this.agent(user)).call({ op: 'remove', path });
  }

  /**
   * Entries below `path` to `depth` levels (the agent sends them in batches). The agent bounds
   * their number; Moat bounds their bytes (long names and metadata are the sandbox's to make).
   */
  async list(user: string, path: string, depth: number): Promise<EntryInfo[]> {
    const agent = await this.agent(user);
    return new Promise((resolve, reject) => {
      const entries: EntryInfo[] = [];
      let received = 0;
      agent.open(
        { op: 'list', path, depth },
        ({ header, size }, done) => {
          const error = failureOf(header);
          received += size;
          if (error || received > MAX_LIST_BYTES) {
            done();
            reject(
              error ??
                new FileAgentError(
                  'exhausted',
                  `the listing of ${path} is over ${MAX_LIST_BYTES >> 20} MiB; list with a smaller depth`,
                ),
            );
            return;
          }
          if (!Array.isArray(header.entries)) throw new FrameError('list batch without entries');
          for (const entry of header.entries) entries.push(entryOf(entry));
          if (header.more !== true) {
            done();
            resolve(entries);
          }
        },
        reject,
      );
    });
  }

  /** A whole file: its size, its path, and its bytes as a stream paced by the reader. */
  async read(user: string, path: string): Promise<{ size: number; path: string; body: Readable }> {
    const agent = await this.agent(user);
    return new Promise((resolve, reject) => {
      let size = 0;
      let opened = false;
      let finished = false;
      let received = 0;
      let unacknowledged = 0;
      let rid = 0;
      // Moat waits on the agent while the reader wants bytes, not while the reader is behind.
      let waiting: (() => void) | undefined = agent.connection.waitOn();
      const stopWaiting = () => {
        waiting?.();
        waiting = undefined;
      };
      const body = new Readable({
        read() {
          if (!finished) waiting ??= agent.connection.waitOn();
          if (unacknowledged > 0) {
            agent.connection.send({ op: 'credit', rid, bytes: unacknowledged });
            unacknowledged = 0;
          }
        },
        destroy(error, callback) {
          finished = true;
          stopWaiting();
          if (received < size) agent.connection.send({ op: 'cancel', rid });
          callback(error);
        },
      });
      const over = () => {
        finished = true;
        stopWaiting();
      };
      rid = agent.open(
        { op: 'read', path },
        ({ header, payload }, finish) => {
          const done = () => {
            over();
            finish();
          };
          const error = failureOf(header);
          if (error) {
            done();
            if (opened) body.destroy(error);
            else reject(error);
            return;
          }
          if (header.size !== undefined) {
            size = field.int(header, 'size');
            opened = true;
            resolve({ size, path: field.string(header, 'path'), body });
          } else if (header.end !== undefined) {
            done();
            if (received !== size) {
              body.destroy(
                new Error(`the file changed while it was read (${received} of ${size} bytes)`),
              );
            } else body.push(null);
          } else {
            received += payload.length;
            if (received > size) throw new FrameError('file agent sent more bytes than the size');
            unacknowledged += payload.length;
            if (!body.push(payload)) stopWaiting();
          }
        },
        (error) => {
          over();
          if (opened) body.destroy(error);
          else reject(error);
        },
        false,
      );
    });
  }

  /**
   * A multi-file upload: stage each file, then commit all (or abort, leaving nothing).
   *
   * A file is written by the user's own agent. Where that is refused (EACCES: a missing folder
   * or the file in a folder only root may write, such as `/0/f.txt`), the root agent creates it
   * for the user, as E2B's envd (which writes as root) does: only what is missing, through no
   * symbolic link, handed to the user (files.py new_target).
   */
  async upload(user: string): Promise<{
    stage(path: string, metadata: Readonly<Record<string, string>>): Promise<StagedFile>;
    commit(): Promise<string[]>;
    abort(): Promise<void>;
  }> {
    const own = await this.agent(user);
    const owner = USERS.get(user);
    const upload = randomUUID();
    /** The agents this upload staged files with: its own, and root's if it created any. */
    const used = new Set([own]);
    const rootAgent = () => this.agent('root');
    return {
      async stage(path, metadata) {
        const request = { op: 'stage', path, metadata, upload };
        try {
          return await staged(own, request);
        } catch (error) {
          if (!(error instanceof FileAgentError && error.code === 'EACCES')) throw error;
          if (owner === undefined || owner.uid === 0) throw error;
          const agent = await rootAgent();
          used.add(agent);
          // A relative path is in the user's home, not in root's. A user's group is its own,
          // numbered as its uid (base-layer.ts).
          return await staged(agent, {
            ...request,
            path: path.startsWith('/') ? path : `${owner.home}/${path}`,
            for: { uid: owner.uid, gid: owner.uid },
          });
        }
      },
      async commit() {
        const paths: string[] = [];
        for (const agent of used) {
          const reply = await agent.call({ op: 'commit', upload });
          if (!Array.isArray(reply.paths) || !reply.paths.every(isString)) {
            throw new FrameError('commit reply without paths');
          }
          paths.push(...reply.paths);
        }
        return paths;
      },
      async abort() {
        for (const agent of used) {
          if (agent.connection.alive)
            await agent.call({ op: 'abort', upload }).catch(() => undefined);
        }
      },
    };
  }

  async compose(user: string, sources: readonly string[], destination: string): Promise<string> {
    const reply = await (await this.agent(user)).call({ op: 'compose', sources, destination });
    return field.string(reply, 'path');
  }

  /**
   * Watches a folder; events arrive through `onEvents` until `onEnd` (an error, or the agent
   * gone). Resolves once the folder is watched.
   */
  async watch(
    user: string,
    options: { readonly path: string; readonly recursive: boolean; readonly includeEntry: boolean },
    onEvents: (events: FileEvent[]) => void,
    onEnd: (error: FileAgentError) => void,
  ): Promise<WatchHandle> {
    const agent = await this.agent(user);
    const wid = randomUUID();
    let ended = false;
    agent.watch(wid, ({ header }) => {
      if (ended) return;
      const error = failureOf(header);
      if (error) {
        ended = true;
        agent.unwatch(wid);
        onEnd(error);
        return;
      }
      if (!Array.isArray(header.events)) throw new FrameError('watch frame without events');
      onEvents(header.events.map(eventOf));
    });
    try {
      const reply = await agent.call({ op: 'watch', wid, ...options });
      return {
        path: field.string(reply, 'path'),
        close: () => {
          ended = true;
          agent.unwatch(wid);
        },
      };
    } catch (error) {
      ended = true;
      agent.unwatch(wid);
      throw error;
    }
  }
}
