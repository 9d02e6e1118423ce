/**
 * Paths as a sandbox sees them (`/home/user/a.txt`, `a.txt` relative to the user's home) mapped
 * to host paths inside the sandbox's root, never outside it.
 *
 * Resolution happens in the sandbox's own view, as the kernel would inside its mount namespace:
 * each component is looked at in turn, `..` stops at the sandbox's `/`, and a symlink is
 * followed by reading its target and resolving that target *inside the sandbox* again (an
 * absolute target starts over at the sandbox's `/`). The host path that comes out therefore has
 * no symlink left in it (except, on request, the final component itself), so nothing can lead
 * out of the root. Every file operation of the sandbox API goes through here.
 *
 * Known limit: the check and the use are two steps. A process inside the sandbox that swaps a
 * checked folder for a symlink between them could redirect one operation; Node has no
 * openat2(RESOLVE_IN_ROOT) to close that window. Final components are opened without following
 * symlinks where the operation allows it.
 */
import { lstat, readlink, realpath } from 'node:fs/promises';
import path from 'node:path';
import type { SandboxUser } from './confinement.js';

export class SandboxPathError extends Error {
  override readonly name = 'SandboxPathError';
  constructor(
    readonly reason: 'invalid' | 'outside',
    message: string,
  ) {
    super(message);
  }
}

export interface ResolvedPath {
  /** The canonical path as the sandbox sees it (`/home/user/a.txt`), symlinks resolved. */
  readonly view: string;
  /** The host path inside the sandbox root. */
  readonly host: string;
}

/** Symlinks followed in one resolution before giving up (Linux's own limit is 40). */
const MAX_LINKS = 40;

/** Lexically resolves `given` inside the sandbox's own `/` (no file system access). */
export function sandboxView(given: string, user: SandboxUser): string {
  if (given.includes('\0')) {
    throw new SandboxPathError('invalid', `path ${JSON.stringify(given)} contains a NUL byte`);
  }
  // posix.resolve against the user's home, then against '/': '..' stops at the sandbox's root.
  return path.posix.resolve(user.home, given === '' ? '.' : given);
}

const lstatOrUndefined = (file: string) => lstat(file).catch(() => undefined);

/**
 * Maps a sandbox path to its host path, following symlinks inside the sandbox's view. With
 * `followFinal` false, a final component that is a symlink is taken as the link itself (for
 * lstat, remove, rename).
 */
export async function resolveInSandbox(
  root: string,
  given: string,
  user: SandboxUser,
  options: { followFinal: boolean } = { followFinal: true },
): Promise<ResolvedPath> {
  const realRoot = await realpath(root);
  let pending = sandboxView(given, user).split('/').filter(Boolean);
  const done: string[] = [];
  let links = 0;
  while (pending.length > 0) {
    const [name, ...rest] = pending as [string, ...string[]];
    pending = rest;
    if (name === '.') continue;
    if (name === '..') {
      done.pop();
      continue;
    }
    const host = path.join(realRoot, ...done, name);
    const stats = await lstatOrUndefined(host);
    const isFinal = pending.length === 0;
    if (!stats?.isSymbolicLink() || (isFinal && !options.followFinal)) {
      done.push(name);
      continue;
    }
    if (++links > MAX_LINKS) {
      throw new SandboxPathError('invalid', `path ${JSON.stringify(given)} has too many symlinks`);
    }
    const target = await readlink(host);
    // The target is read as the sandbox would: absolute from its `/`, relative from the link.
    if (target.startsWith('/')) done.length = 0;
    pending = [...target.split('/').filter(Boolean), ...pending];
  }
  const view = `/${done.join('/')}`;
  return { view, host: path.join(realRoot, ...done) };
}
