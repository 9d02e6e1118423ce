/**
 * Commands inside a sandbox of an in-process runtime, for tests that set up or look at a
 * sandbox's files the way the sandbox itself sees them (never through host paths).
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { type RuntimeSandbox, USERS } from '../../src/runtime/index.js';

export interface ShellResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/**
 * Runs `/bin/sh -c script sh ...args` in the sandbox as `user`, with optional standard input,
 * and waits (at most 20 s) for it to end.
 */
export async function runShell(
  sandbox: RuntimeSandbox,
  script: string,
  options: { user?: string; args?: readonly string[]; stdin?: Buffer | string } = {},
): Promise<ShellResult> {
  const user = USERS.get(options.user ?? 'user')!;
  const process = await sandbox.processes.start({
    config: { cmd: '/bin/sh', args: ['-c', script, 'sh', ...(options.args ?? [])], envs: {} },
    user,
    stdin: options.stdin !== undefined,
  });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  process.on('data', (stream, bytes) => (stream === 'stderr' ? err : out).push(bytes));
  const ended = new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => {
      process.signal('SIGKILL');
      reject(new Error(`command did not end within 20 s: ${script}`));
    }, 20_000);
    process.on('end', (end) => {
      clearTimeout(timer);
      resolve(end.exitCode);
    });
  });
  process.release();
  if (options.stdin !== undefined) {
    const bytes = Buffer.from(options.stdin);
    for (let offset = 0; offset < bytes.length; offset += 1 << 16) {
      await process.inputRoom();
      process.write('stdin', bytes.subarray(offset, offset + (1 << 16)));
    }
    process.closeStdin();
  }
  const code = await ended;
  return {
    code,
    stdout: Buffer.concat(out).toString('utf8'),
    stderr: Buffer.concat(err).toString('utf8'),
  };
}

/** runShell that must succeed; returns its standard output. */
export async function shell(
  sandbox: RuntimeSandbox,
  script: string,
  options: { user?: string; args?: readonly string[]; stdin?: Buffer | string } = {},
): Promise<string> {
  const result = await runShell(sandbox, script, options);
  if (result.code !== 0) {
    throw new Error(`\`${script}\` exited ${result.code}: ${result.stderr.trim()}`);
  }
  return result.stdout;
}

/**
 * Where a file the sandbox wrote under its `/` (outside /etc and the system folders) lies on the
 * host: in its writable layer. For tests that look at a sandbox from outside while it is paused.
 */
export function hostPathOf(dataDir: string, sandboxID: string, view: string): string {
  const folder = path.join(dataDir, 'sandboxes', sandboxID);
  const metaFile = path.join(folder, 'sandbox.json');
  if (!existsSync(metaFile)) return path.join(folder, 'root', view);
  const meta = JSON.parse(readFileSync(metaFile, 'utf8')) as { disk: string | null };
  const upper =
    meta.disk === null
      ? path.join(folder, 'upper')
      : path.join(dataDir, 'disks', meta.disk, 'upper');
  return path.join(upper, 'root', view);
}
