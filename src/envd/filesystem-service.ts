/**
 * `filesystem.Filesystem`: Stat, MakeDir, Move, ListDir, Remove, the WatchDir stream and the
 * polling watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher). Every path is mapped
 * inside the sandbox root (files.ts resolvePath); symlinks are never followed out of it.
 */
import { randomUUID } from 'node:crypto';
import { type BigIntStats, type FSWatcher, watch } from 'node:fs';
import { lstat, mkdir, readdir, realpath, rename, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import type { RuntimeSandbox, SandboxUser } from '../runtime/index.js';
import { ConnectError, type ServerStream } from './connect.js';
import type { CallContext, Method } from './context.js';
import {
  type EntryInfo,
  entryInfo,
  fileSystemError,
  invalid,
  isReserved,
  lstatOf,
  MetadataReader,
  notFound,
  removeMetadata,
  resolvePath,
  type SandboxFile,
  TEMPORARY_NAME,
  viewOf,
} from './files.js';

type Message = Record<string, unknown>;

/** ListDir answers at most this many entries (ask for less depth beyond). */
export const MAX_LIST_ENTRIES = 100_000;
/** Folders one watch may follow (one inotify watch each) and entries it may track. */
export const MAX_WATCHED_FOLDERS = 1_000;
export const MAX_WATCHED_ENTRIES = 100_000;
/** Polling watchers per sandbox, events one may hold, and how long an unpolled one lives. */
export const MAX_WATCHERS = 32;
export const MAX_QUEUED_EVENTS = 10_000;
const WATCHER_IDLE_MS = 10 * 60_000;

const exhausted = (message: string) => new ConnectError('resource_exhausted', message);

// --- Request fields (proto3 JSON: lowerCamelCase, the proto's snake_case also accepted) --------

function fieldOf(message: Message, name: string): unknown {
  const snake = name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
  return message[name] ?? message[snake];
}

function stringField(message: Message, name: string): string {
  const value = fieldOf(message, name);
  if (typeof value !== 'string' || value === '') throw invalid(`${name} is required`);
  return value;
}

function boolField(message: Message, name: string): boolean {
  const value = fieldOf(message, name);
  if (value === undefined || value === null) return false;
  if (typeof value !== 'boolean') throw invalid(`${name} must be true or false`);
  return value;
}

/** uint32 `depth`: a number or a numeric string; 0 or absent means 1. */
function depthField(message: Message): number {
  const value = fieldOf(message, 'depth') ?? 0;
  const depth = typeof value === 'string' && /^[0-9]{1,10}$/.test(value) ? Number(value) : value;
  if (!Number.isSafeInteger(depth) || (depth as number) < 0 || (depth as number) > 0xffffffff) {
    throw invalid('depth must be a non-negative integer');
  }
  return Math.max(1, depth as number);
}

const pathOf = (context: CallContext, message: Message, name: string, followFinal: boolean) =>
  resolvePath(context.sandbox.runtime.root, context.user, stringField(message, name), followFinal);

/** Remove and Move never act on the sandbox's `/` itself. */
function notRoot(file: SandboxFile, action: string): void {
  if (file.view === '/') throw invalid(`cannot ${action} the sandbox's root folder`);
}

const unary = (run: (message: Message, context: CallContext) => Promise<object>): Method => ({
  kind: 'unary',
  run,
});

const describe = (file: SandboxFile, stats: BigIntStats, user: SandboxUser) =>
  entryInfo(file, stats, user, new MetadataReader(file.realRoot));

// --- Unary operations -------------------------------------------------------------------------

/** The entry itself: a symlink is reported as a symlink, never followed. */
const statMethod = unary(async (message, context) => {
  const file = await pathOf(context, message, 'path', false);
  return { entry: await describe(file, await lstatOf(file, 'stat'), context.user) };
});

/** Creates the folder and its parents; an existing folder is already_exists. */
const makeDir = unary(async (message, context) => {
  const file = await pathOf(context, message, 'path', true);
  const existing = await stat(file.host).catch(() => undefined);
  if (existing?.isDirectory()) {
    throw new ConnectError('already_exists', `directory '${file.view}' already exists`);
  }
  if (existing) throw invalid(`path '${file.view}' already exists and is not a directory`);
  try {
    await mkdir(file.host, { recursive: true });
  } catch (error) {
    throw fileSystemError(error, file.view, 'create directory');
  }
  return { entry: await describe(file, await lstatOf(file, 'create directory'), context.user) };
});

/** Renames the entry itself (a symlink moves as a link); creates the destination's parents. */
const move = unary(async (message, context) => {
  const source = await pathOf(context, message, 'source', false);
  const destination = await pathOf(context, message, 'destination', false);
  notRoot(source, 'move');
  notRoot(destination, 'replace');
  await lstatOf(source, 'move');
  try {
    await mkdir(path.dirname(destination.host), { recursive: true });
    await rename(source.host, destination.host);
  } catch (error) {
    throw fileSystemError(error, `${source.view}' to '${destination.view}`, 'move');
  }
  return { entry: await describe(destination, await lstatOf(destination, 'move'), context.user) };
});

/** Removes a file, a symlink (not its target) or a whole folder; a missing path is fine. */
const remove = unary(async (message, context) => {
  const file = await pathOf(context, message, 'path', false);
  notRoot(file, 'remove');
  const stats = await lstat(file.host, { bigint: true }).catch(() => undefined);
  if (stats === undefined) return {};
  try {
    await rm(file.host, { recursive: true, force: true });
  } catch (error) {
    throw fileSystemError(error, file.view, 'remove');
  }
  await removeMetadata(file.realRoot, stats).catch(() => undefined);
  return {};
});

/** The folder (a symlink to a folder inside the root is followed) as its real location. */
async function folderOf(context: CallContext, message: Message, action: string) {
  const file = await pathOf(context, message, 'path', true);
  let stats;
  try {
    stats = await stat(file.host);
  } catch (error) {
    throw fileSystemError(error, file.view, action);
  }
  if (!stats.isDirectory()) throw invalid(`cannot ${action} '${file.view}': not a directory`);
  const host = await realpath(file.host);
  return { view: viewOf(file.realRoot, host), host, realRoot: file.realRoot };
}

/**
 * Entries under the folder down to `depth` levels, depth-first in name order (as envd's
 * WalkDir); symlinked folders are listed as symlinks and never entered.
 */
const listDir = unary(async (message, context) => {
  const depth = depthField(message);
  const folder = await folderOf(context, message, 'list');
  const entries: EntryInfo[] = [];
  const metadata = new MetadataReader(folder.realRoot);
  const walk = async (dir: SandboxFile, levels: number, top: boolean): Promise<void> => {
    let names: string[];
    try {
      // A folder swapped for a symlink since it was seen is not entered.
      if (!top && (await realpath(dir.host)) !== dir.host) return;
      names = (await readdir(dir.host)).sort();
    } catch (error) {
      if (top) throw fileSystemError(error, dir.view, 'list');
      return; // removed meanwhile
    }
    for (const name of names) {
      const child = {
        view: path.posix.join(dir.view, name),
        host: path.join(dir.host, name),
        realRoot: dir.realRoot,
      };
      if (isReserved(child.view)) continue;
      const stats = await lstat(child.host, { bigint: true }).catch(() => undefined);
      if (stats === undefined) continue;
      if (entries.length >= MAX_LIST_ENTRIES) {
        throw exhausted(`more than ${MAX_LIST_ENTRIES} entries; list with a smaller depth`);
      }
      entries.push(await entryInfo(child, stats, context.user, metadata));
      if (stats.isDirectory() && levels > 1) await walk(child, levels - 1, false);
    }
  };
  await walk(folder, depth, true);
  return { entries };
});

// --- Watching ---------------------------------------------------------------------------------

export type EventType =
  | 'EVENT_TYPE_CREATE'
  | 'EVENT_TYPE_WRITE'
  | 'EVENT_TYPE_REMOVE'
  | 'EVENT_TYPE_RENAME'
  | 'EVENT_TYPE_CHMOD';

export interface FilesystemEvent {
  /** Relative to the watched folder (`sub/new.txt`). */
  name: string;
  type: EventType;
  entry?: EntryInfo;
}

interface WatchOptions {
  readonly folder: SandboxFile;
  readonly recursive: boolean;
  readonly includeEntry: boolean;
  readonly user: SandboxUser;
}

/** What is known about one watched entry, to tell what an inotify event changed. */
interface Node {
  stats: BigIntStats;
  children?: Map<string, Node>;
}

/** How a name changed: moved here from `from`, replaced by an upload, or moved away. */
interface How {
  readonly from: string | undefined;
  readonly written: boolean;
  readonly movedAway: boolean;
}

interface Observed {
  readonly rel: string;
  readonly before: BigIntStats | undefined;
  readonly after: BigIntStats | undefined;
  readonly kinds: ReadonlySet<string>;
}

const joinRel = (dir: string, name: string) => (dir === '' ? name : `${dir}/${name}`);
const dirOf = (rel: string) => (rel.includes('/') ? path.posix.dirname(rel) : '');
const isTemporary = (rel: string) => TEMPORARY_NAME.test(path.posix.basename(rel));

/**
 * A folder (and with `recursive` its subfolders, one fs.watch each) turned into envd's event
 * types. Node reports only "rename" or "change" for a name, so each batch of names is compared
 * with what was known before: new name CREATE, gone REMOVE (RENAME when its inode reappears
 * under another name in the same batch), other mode CHMOD, otherwise WRITE. Moat's temporary
 * upload files are hidden: an upload shows as CREATE/WRITE of its target.
 */
export class FolderWatcher {
  private readonly tree: Node;
  private readonly watchers = new Map<string, FSWatcher>();
  private pending = new Map<string, Set<string>>();
  private draining = false;
  /** Events wait until the client has its start message. */
  private paused = true;
  private closed = false;
  private tracked = 0;
  /** Renewed per batch: it caches which files have metadata. */
  private metadata: MetadataReader;

  constructor(
    private readonly options: WatchOptions,
    rootStats: BigIntStats,
    private readonly onEvent: (event: FilesystemEvent) => void,
    private readonly onEnd: (error?: ConnectError) => void,
  ) {
    this.tree = { stats: rootStats, children: new Map() };
    this.metadata = new MetadataReader(options.folder.realRoot);
  }

  static async open(
    options: WatchOptions,
    onEvent: (event: FilesystemEvent) => void,
    onEnd: (error?: ConnectError) => void,
  ): Promise<FolderWatcher> {
    const stats = await lstat(options.folder.host, { bigint: true });
    const watcher = new FolderWatcher(options, stats, onEvent, onEnd);
    try {
      await watcher.follow('', watcher.tree, false);
    } catch (error) {
      watcher.close();
      throw error;
    }
    return watcher;
  }

  /** Starts reporting (what happened since open is reported first). */
  resume(): void {
    this.paused = false;
    this.schedule();
  }

  close(): void {
    this.closed = true;
    for (const watcher of this.watchers.values()) watcher.close();
    this.watchers.clear();
  }

  private hostOf(rel: string): string {
    return rel === '' ? this.options.folder.host : path.join(this.options.folder.host, rel);
  }

  private viewOf(rel: string): string {
    return path.posix.join(this.options.folder.view, rel);
  }

  private node(rel: string): Node | undefined {
    let node: Node | undefined = this.tree;
    for (const name of rel === '' ? [] : rel.split('/')) node = node?.children?.get(name);
    return node;
  }

  /** Watches folder `rel` and records its entries (announcing them when it is new). */
  private async follow(rel: string, node: Node, announce: boolean): Promise<void> {
    if (this.watchers.size >= MAX_WATCHED_FOLDERS) {
      throw exhausted(`more than ${MAX_WATCHED_FOLDERS} folders to watch`);
    }
    let watcher: FSWatcher;
    try {
      watcher = watch(this.hostOf(rel), { persistent: false }, (kind, name) => {
        if (typeof name === 'string') this.noticed(joinRel(rel, name), kind);
      });
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      // Gone again already: its parent's watch reports that.
      if (rel !== '' && (code === 'ENOENT' || code === 'ENOTDIR')) return;
      if (code === 'ENOSPC') throw exhausted('the host has no inotify watches left');
      throw error;
    }
    // A watch that breaks: look again at that folder (and, through drain, at the watched one).
    watcher.on('error', () => this.noticed(rel, 'rename'));
    this.watchers.set(rel, watcher);
    node.children = new Map();
    const names = await readdir(this.hostOf(rel)).catch(() => [] as string[]);
    for (const name of names.sort()) {
      const childRel = joinRel(rel, name);
      if (isReserved(this.viewOf(childRel))) continue;
      const stats = await lstat(this.hostOf(childRel), { bigint: true }).catch(() => undefined);
      if (stats === undefined || this.closed) continue;
      const child = this.track(node, name, stats);
      if (announce) await this.emit(childRel, 'EVENT_TYPE_CREATE', stats);
      if (this.options.recursive && stats.isDirectory())
        await this.follow(childRel, child, announce);
    }
  }

  private track(parent: Node, name: string, stats: BigIntStats): Node {
    const existing = parent.children!.get(name);
    if (existing) {
      existing.stats = stats;
      return existing;
    }
    if (++this.tracked > MAX_WATCHED_ENTRIES) {
      throw exhausted(`more than ${MAX_WATCHED_ENTRIES} entries to watch`);
    }
    const node: Node = { stats };
    parent.children!.set(name, node);
    return node;
  }

  /** Forgets `rel` and everything under it, closing the watches of its folders. */
  private forget(rel: string): void {
    const parent = this.node(dirOf(rel));
    const node = parent?.children?.get(path.posix.basename(rel));
    if (!node) return;
    parent!.children!.delete(path.posix.basename(rel));
    const drop = (nodeRel: string, dropped: Node) => {
      this.tracked -= 1;
      this.watchers.get(nodeRel)?.close();
      this.watchers.delete(nodeRel);
      for (const [name, child] of dropped.children ?? []) drop(joinRel(nodeRel, name), child);
    };
    drop(rel, node);
  }

  private noticed(rel: string, kind: string): void {
    if (this.closed || isReserved(this.viewOf(rel))) return;
    const kinds = this.pending.get(rel) ?? new Set<string>();
    kinds.add(kind);
    this.pending.set(rel, kinds);
    this.schedule();
  }

  private schedule(): void {
    if (this.draining || this.paused || this.closed || this.pending.size === 0) return;
    this.draining = true;
    // Events of one burst (a rename's two halves) arrive together: batch them.
    setImmediate(() => {
      void this.drain().catch((error: unknown) =>
        this.fail(
          error instanceof ConnectError
            ? error
            : new ConnectError('internal', `watcher failed: ${(error as Error).message}`),
        ),
      );
    });
  }

  private async drain(): Promise<void> {
    while (this.pending.size > 0 && !this.closed) {
      const batch = this.pending;
      this.pending = new Map();
      await this.process(batch);
      const folder = await lstat(this.options.folder.host, { bigint: true }).catch(() => undefined);
      if (folder?.ino !== this.tree.stats.ino) {
        this.fail(notFound(`the watched folder '${this.options.folder.view}' was removed`));
      }
    }
    this.draining = false;
  }

  private fail(error: ConnectError): void {
    if (this.closed) return;
    this.close();
    this.onEnd(error);
  }

  private async process(batch: Map<string, Set<string>>): Promise<void> {
    this.metadata = new MetadataReader(this.options.folder.realRoot);
    const observed: Observed[] = [];
    for (const [rel, kinds] of batch) {
      if (rel === '') continue; // the watched folder itself: drain checks it
      // Only names whose folder is known (a self-event of a folder names no real child).
      const parent = this.node(dirOf(rel));
      if (!parent?.children) continue;
      const before = parent.children.get(path.posix.basename(rel))?.stats;
      const after = await lstat(this.hostOf(rel), { bigint: true }).catch(() => undefined);
      observed.push({ rel, before, after, kinds });
    }
    // A rename: an inode that left one name and arrived at another within the batch.
    const arrived = new Map<bigint, string>();
    for (const o of observed) {
      if (o.after && o.before?.ino !== o.after.ino) arrived.set(o.after.ino, o.rel);
    }
    const renamedFrom = new Map<string, string>(); // new name -> old name
    for (const o of observed) {
      const to = o.before && o.before.ino !== o.after?.ino ? arrived.get(o.before.ino) : undefined;
      if (to !== undefined && to !== o.rel) renamedFrom.set(to, o.rel);
    }
    const renamedAway = new Set(renamedFrom.values());
    // A temporary file created and renamed within one batch cannot be paired by inode.
    const committed = new Set(
      observed.filter((o) => isTemporary(o.rel) && !o.after).map((o) => dirOf(o.rel)),
    );
    for (const o of observed) {
      const from = renamedFrom.get(o.rel);
      const written = from !== undefined ? isTemporary(from) : committed.has(dirOf(o.rel));
      await this.apply(o, { from, written, movedAway: renamedAway.has(o.rel) });
    }
  }

  private async apply(o: Observed, how: How): Promise<void> {
    const { rel, before, after } = o;
    const replaced = before && (!after || after.ino !== before.ino);
    if (replaced) this.forget(rel);
    if (after) {
      const parentRel = dirOf(rel);
      const node = this.track(this.node(parentRel)!, path.posix.basename(rel), after);
      if (this.options.recursive && after.isDirectory() && (!before || replaced)) {
        await this.announce(o, how);
        // A folder moved in keeps its content unannounced; a new one announces what it holds.
        await this.follow(rel, node, how.from === undefined);
        return;
      }
    }
    await this.announce(o, how);
  }

  private async announce(o: Observed, how: How) {
    const { rel, before, after, kinds } = o;
    if (before && !after) {
      await this.emit(rel, how.movedAway ? 'EVENT_TYPE_RENAME' : 'EVENT_TYPE_REMOVE', undefined);
    } else if (!before && after) {
      await this.emit(rel, 'EVENT_TYPE_CREATE', after);
      // Content arrived with the name (written, uploaded, or moved in from elsewhere).
      const content =
        how.written || kinds.has('change') || (how.from === undefined && after.size > 0n);
      if (after.isFile() && content) await this.emit(rel, 'EVENT_TYPE_WRITE', after);
    } else if (before && after && before.ino !== after.ino) {
      await this.emit(rel, how.written ? 'EVENT_TYPE_WRITE' : 'EVENT_TYPE_CREATE', after);
    } else if (before && after) {
      const modeChanged = before.mode !== after.mode;
      const contentChanged = before.size !== after.size || before.mtimeNs !== after.mtimeNs;
      if (modeChanged) await this.emit(rel, 'EVENT_TYPE_CHMOD', after);
      if (!after.isDirectory() && (contentChanged || (kinds.has('change') && !modeChanged))) {
        await this.emit(rel, 'EVENT_TYPE_WRITE', after);
      }
    }
  }

  private async emit(rel: string, type: EventType, stats: BigIntStats | undefined) {
    if (this.closed || isTemporary(rel)) return;
    const entry =
      this.options.includeEntry && stats
        ? await entryInfo(
            {
              view: this.viewOf(rel),
              host: this.hostOf(rel),
              realRoot: this.options.folder.realRoot,
            },
            stats,
            this.options.user,
            this.metadata,
          )
        : undefined;
    if (!this.closed) this.onEvent({ name: rel, type, ...(entry ? { entry } : {}) });
  }
}

async function watchOptions(message: Message, context: CallContext): Promise<WatchOptions> {
  const recursive = boolField(message, 'recursive');
  const includeEntry = boolField(message, 'includeEntry');
  // Accepted for the SDK's sake: a sandbox has no network mounts to refuse.
  boolField(message, 'allowNetworkMounts');
  return {
    folder: await folderOf(context, message, 'watch'),
    recursive,
    includeEntry,
    user: context.user,
  };
}

async function openWatcher(
  options: WatchOptions,
  onEvent: (event: FilesystemEvent) => void,
  onEnd: (error?: ConnectError) => void,
): Promise<FolderWatcher> {
  try {
    return await FolderWatcher.open(options, onEvent, onEnd);
  } catch (error) {
    throw fileSystemError(error, options.folder.view, 'watch');
  }
}

/**
 * `{"start":{}}`, then `{"filesystem": event}` and keepalives, until the client leaves, the
 * Connect-Timeout-Ms deadline (a clean end) or the folder goes away (an error end).
 */
const watchDir: Method = {
  kind: 'server-stream',
  async run(message, context, stream: ServerStream) {
    const options = await watchOptions(message, context);
    let finish: (error?: ConnectError) => void = () => undefined;
    const watcher = await openWatcher(
      options,
      (event) => stream.send({ filesystem: event }),
      (error) => finish(error),
    );
    await new Promise<void>((resolve) => {
      const timers: NodeJS.Timeout[] = [];
      finish = (error) => {
        for (const timer of timers) clearTimeout(timer);
        watcher.close();
        stream.end(error);
        resolve();
      };
      if (!stream.open || context.request.socket.destroyed) {
        finish();
        return;
      }
      context.response.once('close', () => finish());
      stream.send({ start: {} });
      if (context.keepaliveMs !== undefined) {
        timers.push(setInterval(() => stream.send({ keepalive: {} }), context.keepaliveMs));
      }
      if (context.deadlineMs !== undefined) {
        timers.push(setTimeout(() => finish(), context.deadlineMs));
      }
      watcher.resume();
    });
  },
};

// --- Polling watchers -------------------------------------------------------------------------

interface PolledWatcher {
  readonly watcher: FolderWatcher;
  readonly events: FilesystemEvent[];
  readonly status: { failure?: ConnectError };
  idle: NodeJS.Timeout;
}

/** Per sandbox; dropped with the sandbox's runtime object. */
const watcherTables = new WeakMap<RuntimeSandbox, Map<string, PolledWatcher>>();

function tableOf(context: CallContext): Map<string, PolledWatcher> {
  const runtime = context.sandbox.runtime;
  let table = watcherTables.get(runtime);
  if (!table) watcherTables.set(runtime, (table = new Map()));
  return table;
}

function polledWatcher(context: CallContext, message: Message): [string, PolledWatcher] {
  const id = stringField(message, 'watcherId');
  const entry = tableOf(context).get(id);
  if (!entry) throw notFound(`watcher ${id} not found`);
  return [id, entry];
}

function dropWatcher(table: Map<string, PolledWatcher>, id: string): void {
  const entry = table.get(id);
  if (!entry) return;
  clearTimeout(entry.idle);
  entry.watcher.close();
  table.delete(id);
}

const idleTimer = (table: Map<string, PolledWatcher>, id: string) => {
  const timer = setTimeout(() => dropWatcher(table, id), WATCHER_IDLE_MS);
  timer.unref();
  return timer;
};

const createWatcher = unary(async (message, context) => {
  const table = tableOf(context);
  if (table.size >= MAX_WATCHERS) {
    throw exhausted(`this sandbox already has ${MAX_WATCHERS} watchers; remove one first`);
  }
  const options = await watchOptions(message, context);
  const id = randomUUID();
  const events: FilesystemEvent[] = [];
  const status: { failure?: ConnectError } = {};
  // Callbacks run only after resume() below, when `watcher` is set.
  const watcher = await openWatcher(
    options,
    (event) => {
      if (events.length < MAX_QUEUED_EVENTS) {
        events.push(event);
        return;
      }
      // Losing events silently would be worse than losing the watcher.
      status.failure ??= exhausted(
        `watcher ${id} had more than ${MAX_QUEUED_EVENTS} unread events; create a new one`,
      );
      watcher.close();
    },
    (error) => {
      status.failure ??= error ?? new ConnectError('internal', 'watcher stopped');
    },
  );
  if (table.size >= MAX_WATCHERS) {
    watcher.close();
    throw exhausted(`this sandbox already has ${MAX_WATCHERS} watchers; remove one first`);
  }
  table.set(id, { watcher, events, status, idle: idleTimer(table, id) });
  watcher.resume();
  return { watcherId: id };
});

/** Events since the last call; a failed watcher reports its failure once its events are read. */
const getWatcherEvents = unary(async (message, context) => {
  const table = tableOf(context);
  const [id, entry] = polledWatcher(context, message);
  clearTimeout(entry.idle);
  const failure = entry.status.failure;
  if (entry.events.length === 0 && failure) {
    dropWatcher(table, id);
    throw failure;
  }
  entry.idle = idleTimer(table, id);
  return { events: entry.events.splice(0) };
});

const removeWatcher = unary(async (message, context) => {
  const [id] = polledWatcher(context, message);
  dropWatcher(tableOf(context), id);
  return {};
});

export const FILESYSTEM_METHODS: Readonly<Record<string, Method>> = {
  Stat: statMethod,
  MakeDir: makeDir,
  Move: move,
  ListDir: listDir,
  Remove: remove,
  WatchDir: watchDir,
  CreateWatcher: createWatcher,
  GetWatcherEvents: getWatcherEvents,
  RemoveWatcher: removeWatcher,
};
