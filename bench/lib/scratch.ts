import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/**
 * Removes a folder Moat used, after unmounting what is mounted below it (sandbox disks stay
 * mounted when a Moat is killed rather than stopped).
 */
export function removeMoatFolder(dir: string): void {
  const root = path.resolve(dir);
  let mounts: string[] = [];
  try {
    mounts = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((line) => line.split(' ')[4] ?? '')
      .filter((point) => point.startsWith(`${root}/`));
  } catch {
    // No mountinfo: nothing can be mounted here either.
  }
  for (const point of mounts.sort((a, b) => b.length - a.length)) {
    try {
      execFileSync('/bin/umount', ['-l', point], { stdio: 'ignore', timeout: 10_000 });
    } catch {
      // Gone already.
    }
  }
  rmSync(root, { recursive: true, force: true });
  // The (empty) cgroups of its sandboxes: named by a hash of the data folder (host-probe.ts).
  const scope = createHash('sha256').update(root).digest('hex').slice(0, 16);
  for (const hierarchy of safeReaddir('/sys/fs/cgroup')) {
    const folder = path.join('/sys/fs/cgroup', hierarchy, 'moat', scope);
    for (const sandbox of safeReaddir(folder)) {
      const child = path.join(folder, sandbox);
      if (statSync(child, { throwIfNoEntry: false })?.isDirectory()) rmdirQuietly(child);
    }
    rmdirQuietly(folder);
  }
  // The socket its sandboxes' roles reached it on (ProcessRuntime: agents-<scope>.sock).
  rmSync(`/run/moat/agents-${scope}.sock`, { force: true });
}

function safeReaddir(folder: string): string[] {
  try {
    return readdirSync(folder);
  } catch {
    return [];
  }
}

function rmdirQuietly(folder: string): void {
  try {
    rmdirSync(folder);
  } catch {
    // Not there, or still in use.
  }
}

/**
 * Flags that keep an in-process Moat's state out of the working folder: a fresh data folder
 * and the API and sandbox listeners on free ports. Benchmarks and tests both start Moat this way,
 * with sandboxes sharing the host network unless they ask for namespaces.
 */
export function scratchMoatFlags(): { flags: Record<string, string>; remove: () => void } {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'moat-scratch-'));
  return {
    flags: {
      'data-dir': dir,
      'api-listen': '127.0.0.1:0',
      'sandbox-listen': '127.0.0.1:0',
      enforcement: 'proxy',
      // Where this host cannot confine sandboxes (not root...), run them anyway: tests and
      // benchmarks of everything else go on; where it can, this changes nothing.
      'unconfined-sandboxes': 'true',
    },
    remove: () => removeMoatFolder(dir),
  };
}
