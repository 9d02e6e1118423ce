/**
 * `filesystem.Filesystem`: Stat, MakeDir, Move, ListDir and Remove. Each is one call to the
 * sandbox's file agent of the user asking (runtime SandboxFiles), which carries it out inside
 * the sandbox; this module reads the request fields and answers in proto3 JSON.
 */
import type { CallContext, Method } from './context.js';
import { fileError, invalid } from './file-errors.js';
import { fieldOf, stringField } from './fields.js';
import { WATCH_METHODS } from './watchers.js';

type Message = Record<string, unknown>;

/** uint32 `depth`: a number or a numeric string; 0 or absent means 1. */
function depthField(message: Message): number {
  const value = fieldOf(message, 'depth') ?? 0;
  const depth = typeof value === 'string' && /^[0-9]{1,10}$/.test(value) ? Number(value) : value;
  if (!Number.isSafeInteger(depth) || (depth as number) < 0 || (depth as number) > 0xffffffff) {
    throw invalid('depth must be a non-negative integer');
  }
  return Math.max(1, depth as number);
}

/** One file agent call, its failure named by the path the client gave. */
async function agentCall<T>(action: string, given: string, call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    throw fileError(error, given, action);
  }
}

const unary = (run: (message: Message, context: CallContext) => Promise<object>): Method => ({
  kind: 'unary',
  run,
});

const filesOf = (context: CallContext) => context.sandbox.runtime.files;

/** The entry itself: a symlink is reported as a symlink, never followed. */
const statMethod = unary(async (message, context) => {
  const given = stringField(message, 'path');
  const entry = await agentCall('stat', given, () =>
    filesOf(context).stat(context.user.name, given, false),
  );
  return { entry };
});

/** Creates the folder and its parents; an existing folder is already_exists. */
const makeDir = unary(async (message, context) => {
  const given = stringField(message, 'path');
  const entry = await agentCall('create directory', given, () =>
    filesOf(context).makeDir(context.user.name, given),
  );
  return { entry };
});

/** Renames the entry itself (a symlink moves as a link); creates the destination's parents. */
const move = unary(async (message, context) => {
  const source = stringField(message, 'source');
  const destination = stringField(message, 'destination');
  const entry = await agentCall('move', `${source}' to '${destination}`, () =>
    filesOf(context).move(context.user.name, source, destination),
  );
  return { entry };
});

/** Removes a file, a symlink (not its target) or a whole folder; a missing path is fine. */
const remove = unary(async (message, context) => {
  const given = stringField(message, 'path');
  await agentCall('remove', given, () => filesOf(context).remove(context.user.name, given));
  return {};
});

/**
 * Entries under the folder down to `depth` levels, depth-first in name order (as envd's
 * WalkDir); symlinked folders are listed as symlinks and never entered.
 */
const listDir = unary(async (message, context) => {
  const depth = depthField(message);
  const given = stringField(message, 'path');
  const entries = await agentCall('list', given, () =>
    filesOf(context).list(context.user.name, given, depth),
  );
  return { entries };
});

export const FILESYSTEM_METHODS: Readonly<Record<string, Method>> = {
  Stat: statMethod,
  MakeDir: makeDir,
  Move: move,
  ListDir: listDir,
  Remove: remove,
  ...WATCH_METHODS,
};
