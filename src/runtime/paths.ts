/**
 * Paths as a sandbox sees them (`/home/user/a.txt`, `a.txt` relative to the user's home) mapped
 * to host paths inside the sandbox's root, never outside it: `..` cannot climb above the
 * sandbox's `/`, and no symlink may lead out of the root. Every file operation of the sandbox API
 * goes through here.
 *
 * Known limit: the check and the use are two steps. A process inside the sandbox that swaps a
 * checked folder for a symlink between them could redirect one operation; Node has no
 * openat2(RESOLVE_IN_ROOT) to close that window. Final components are opened without following
 * symlinks where the operation allows it.
 */
import { lstat, realpath } from 'node:fs/promises';
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
  /** The canonical path as the sandbox sees it (`/home/user/a.txt`). */
  readonly view: string;
  /** The host path inside the sandbox root. */
  readonly host: string;
}

/** Lexically resolves `given` inside the sandbox's own `/` (no file system access). */
export function sandboxView(given: string, user: SandboxUser): string {
  if (given.includes('\0')) {
    throw new SandboxPathError('invalid', `path ${JSON.stringify(given)} contains a NUL byte`);
  }
  // posix.resolve against the user's home, then against '/': '..' stops at the sandbox's root.
  return path.posix.resolve(user.home, given === '' ? '.' : given);
}

const inside = (root: string, candidate: string) =>
  candidate === root || candidate.startsWith(`${root}/`);

/**
 * Maps a sandbox path to its host path and checks that the deepest part of it that exists
 * (followed through any symlinks) is inside the root. With `followFinal` false, a final
 * component that is itself a symlink is taken as the link (for lstat, remove, rename).
 */
export async function resolveInSandbox(
  root: string,
  given: string,
  user: SandboxUser,
  options: { followFinal: boolean } = { followFinal: true },
): Promise<ResolvedPath> {
  const view = sandboxView(given, user);
  const realRoot = await realpath(root);
  const host = path.join(realRoot, view);
  const checked = options.followFinal ? host : path.dirname(host);
  // Walk up to the deepest existing ancestor; what does not exist yet cannot be a symlink.
  let probe = checked;
  for (;;) {
    try {
      const real = await realpath(probe);
      if (!inside(realRoot, real)) {
        throw new SandboxPathError(
          'outside',
          `path ${JSON.stringify(given)} leads outside the sandbox (through a symlink)`,
        );
      }
      break;
    } catch (error) {
      if (error instanceof SandboxPathError) throw error;
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT' && code !== 'ENOTDIR') throw error;
      // Present but unresolvable: a dangling symlink, which a write would follow anywhere.
      if (
        await lstat(probe).then(
          () => true,
          () => false,
        )
      ) {
        throw new SandboxPathError(
          'outside',
          `path ${JSON.stringify(given)} goes through a symlink to nowhere inside the sandbox`,
        );
      }
      if (probe === realRoot) break;
      probe = path.dirname(probe);
    }
  }
  return { view, host };
}
