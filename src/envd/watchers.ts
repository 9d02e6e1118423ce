/**
 * Watching folders: the WatchDir stream and the polling watchers (CreateWatcher,
 * GetWatcherEvents, RemoveWatcher). The file agent inside the sandbox holds the inotify watches
 * and turns what happens into envd's event types (supervisor/watch.py); this module streams or
 * queues them and bounds how many watches a sandbox may hold.
 */
import { randomUUID } from 'node:crypto';
import type { FileEvent, RuntimeSandbox, WatchHandle } from '../runtime/index.js';
import { ConnectError, type ServerStream } from './connect.js';
import type { CallContext, Method } from './context.js';
import { fileError, notFound } from './file-errors.js';
import { boolField, stringField } from './fields.js';

type Message = Record<string, unknown>;

/** Watches (streams and polling watchers together) one sandbox may hold at once. */
export const MAX_WATCHES_PER_SANDBOX = 64;
/** Polling watchers per sandbox, events one may hold, and how long an unpolled one lives. */
export const MAX_WATCHERS = 32;
export const MAX_QUEUED_EVENTS = 10_000;
const WATCHER_IDLE_MS = 10 * 60_000;

const exhausted = (message: string) => new ConnectError('resource_exhausted', message);

/** Open watches per sandbox; dropped with the sandbox's runtime object. */
const openWatches = new WeakMap<RuntimeSandbox, { count: number }>();

function countOf(context: CallContext): { count: number } {
  const runtime = context.sandbox.runtime;
  let counter = openWatches.get(runtime);
  if (!counter) openWatches.set(runtime, (counter = { count: 0 }));
  return counter;
}

/**
 * Watches the folder of the request for its user; each batch of events goes to `onEvents`
 * until `onEnd` (the folder went away, or the watch grew past its bounds).
 */
async function openWatch(
  message: Message,
  context: CallContext,
  onEvents: (events: FileEvent[]) => void,
  onEnd: (error: ConnectError) => void,
): Promise<WatchHandle> {
  const given = stringField(message, 'path');
  const recursive = boolField(message, 'recursive');
  const includeEntry = boolField(message, 'includeEntry');
  // Accepted for the SDK's sake: a sandbox has no network mounts to refuse.
  boolField(message, 'allowNetworkMounts');
  const counter = countOf(context);
  if (counter.count >= MAX_WATCHES_PER_SANDBOX) {
    throw exhausted(
      `this sandbox already has ${MAX_WATCHES_PER_SANDBOX} open watches; close one first`,
    );
  }
  counter.count += 1;
  let released = false;
  const release = () => {
    if (!released) counter.count -= 1;
    released = true;
  };
  try {
    const handle = await context.sandbox.runtime.files.watch(
      context.user.name,
      { path: given, recursive, includeEntry },
      onEvents,
      (error) => {
        release();
        onEnd(fileError(error, given, 'watch'));
      },
    );
    return {
      path: handle.path,
      close: () => {
        release();
        handle.close();
      },
    };
  } catch (error) {
    release();
    throw fileError(error, given, 'watch');
  }
}

/**
 * `{"start":{}}`, then `{"filesystem": event}` and keepalives, until the client leaves, the
 * Connect-Timeout-Ms deadline (a clean end) or the folder goes away (an error end).
 */
const watchDir: Method = {
  kind: 'server-stream',
  async run(message, context, stream: ServerStream) {
    let finish: (error?: ConnectError) => void = () => undefined;
    const held: FileEvent[] = [];
    let started = false;
    const watch = await openWatch(
      message,
      context,
      (events) => {
        if (!started) held.push(...events);
        else for (const event of events) stream.send({ filesystem: event });
      },
      (error) => finish(error),
    );
    await new Promise<void>((resolve) => {
      const timers: NodeJS.Timeout[] = [];
      finish = (error) => {
        for (const timer of timers) clearTimeout(timer);
        watch.close();
        stream.end(error);
        resolve();
      };
      if (!stream.open || context.request.socket.destroyed) {
        finish();
        return;
      }
      context.response.once('close', () => finish());
      stream.send({ start: {} });
      started = true;
      for (const event of held.splice(0)) stream.send({ filesystem: event });
      if (context.keepaliveMs !== undefined) {
        timers.push(setInterval(() => stream.send({ keepalive: {} }), context.keepaliveMs));
      }
      if (context.deadlineMs !== undefined) {
        timers.push(setTimeout(() => finish(), context.deadlineMs));
      }
    });
  },
};

// --- Polling watchers -------------------------------------------------------------------------

interface PolledWatcher {
  readonly watch: WatchHandle;
  readonly events: FileEvent[];
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
  entry.watch.close();
  table.delete(id);
}

const idleTimer = (table: Map<string, PolledWatcher>, id: string) => {
  const timer = setTimeout(() => dropWatcher(table, id), WATCHER_IDLE_MS);
  timer.unref();
  return timer;
};

const createWatcher: Method = {
  kind: 'unary',
  async run(message, context) {
    const table = tableOf(context);
    if (table.size >= MAX_WATCHERS) {
      throw exhausted(`this sandbox already has ${MAX_WATCHERS} watchers; remove one first`);
    }
    const id = randomUUID();
    const events: FileEvent[] = [];
    const status: { failure?: ConnectError } = {};
    const watch = await openWatch(
      message,
      context,
      (batch) => {
        if (status.failure) return;
        if (events.length + batch.length <= MAX_QUEUED_EVENTS) {
          events.push(...batch);
          return;
        }
        // Losing events silently would be worse than losing the watcher.
        status.failure = exhausted(
          `watcher ${id} had more than ${MAX_QUEUED_EVENTS} unread events; create a new one`,
        );
        table.get(id)?.watch.close();
      },
      (error) => {
        status.failure ??= error;
      },
    );
    if (table.size >= MAX_WATCHERS) {
      watch.close();
      throw exhausted(`this sandbox already has ${MAX_WATCHERS} watchers; remove one first`);
    }
    table.set(id, { watch, events, status, idle: idleTimer(table, id) });
    return { watcherId: id };
  },
};

/** Events since the last call; a failed watcher reports its failure once its events are read. */
const getWatcherEvents: Method = {
  kind: 'unary',
  async run(message, context) {
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
  },
};

const removeWatcher: Method = {
  kind: 'unary',
  async run(message, context) {
    const [id] = polledWatcher(context, message);
    dropWatcher(tableOf(context), id);
    return {};
  },
};

export const WATCH_METHODS: Readonly<Record<string, Method>> = {
  WatchDir: watchDir,
  CreateWatcher: createWatcher,
  GetWatcherEvents: getWatcherEvents,
  RemoveWatcher: removeWatcher,
};
