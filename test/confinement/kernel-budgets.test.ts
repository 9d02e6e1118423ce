/**
 * Attacker tests: kernel resources every user of the host draws on. A sandbox's user namespace
 * used to be owned by the host's root, so the kernel charged every inotify instance made inside
 * to root as well: one sandbox's user took root's 128 and host root's inotify_init1 and other
 * sandboxes' watches failed. And the sandbox's devpts had no `max=`: one sandbox's user opened
 * nearly all of the ptys shared by every devpts but the host's. Each sandbox now has its own
 * share; taking it all leaves the host and the other sandboxes as they were. Every load here is
 * bounded in count (and held only until the checks are done).
 */
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RuntimeSandbox, USERS } from '../../src/runtime/index.js';
import { shell } from '../support/sandbox-shell.js';
import { BUDGETS, type Harness, skipReason, startHarness } from './runtime-harness.js';

const skip = skipReason('confinement/kernel-budgets');
const INOTIFY_INSTANCES = 32;
const PTYS = 16;
let harness: Harness;
let attacker: RuntimeSandbox;
let bystander: RuntimeSandbox;

beforeAll(async () => {
  if (skip) return;
  harness = await startHarness({
    budgets: {
      kernelBudgets: { ...BUDGETS.kernelBudgets, inotifyInstances: INOTIFY_INSTANCES, ptys: PTYS },
    },
  });
  attacker = await harness.sandbox();
  bystander = await harness.sandbox();
}, 60_000);

afterAll(async () => {
  await harness?.close();
});

/**
 * Runs Python `script` in the sandbox as `user`: it takes what it takes, prints one line and
 * holds it all until stop() (which kills it).
 */
async function holding(
  sandbox: RuntimeSandbox,
  script: string,
): Promise<{ line: string; stop(): void }> {
  const process = await sandbox.processes.start({
    config: {
      cmd: '/usr/bin/python3',
      args: ['-c', `${script}\nimport sys\nsys.stdout.flush()\nsys.stdin.read()`],
      envs: {},
    },
    user: USERS.get('user')!,
    stdin: true,
  });
  let out = '';
  const line = new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no line within 20 s')), 20_000);
    process.on('data', (_, bytes) => {
      out += bytes.toString();
      if (out.includes('\n')) {
        clearTimeout(timer);
        resolve(out.slice(0, out.indexOf('\n')));
      }
    });
    process.on('end', (end) => reject(new Error(`it ended (${end.status}): ${out}`)));
  });
  process.release();
  return { line: await line, stop: () => process.signal('SIGKILL') };
}

/** inotify_init1 as host root, in a new process: its fd, or -errno. */
function hostRootInotify(): number {
  const result = spawnSync(
    'python3',
    [
      '-c',
      'import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = libc.inotify_init1(0)\nprint(fd if fd >= 0 else -ctypes.get_errno())',
    ],
    { encoding: 'utf8', timeout: 10_000 },
  );
  return Number(result.stdout.trim());
}

describe.skipIf(skip)('kernel resources shared by the host’s users', () => {
  it('a sandbox’s user that takes every inotify instance it can leaves host root’s and another sandbox’s alone', async () => {
    const taken = await holding(
      attacker,
      'import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nfds = []\n' +
        'while len(fds) < 1000:\n' +
        '    fd = libc.inotify_init1(0)\n' +
        '    if fd < 0: break\n' +
        '    fds.append(fd)\n' +
        'print(len(fds), ctypes.get_errno())',
    );
    try {
      const [count, errno] = taken.line.split(' ').map(Number);
      // Refused (EMFILE), well before the bound of the loop.
      expect(errno).toBe(24);
      expect(hostRootInotify(), "host root's inotify_init1").toBeGreaterThanOrEqual(0);
      const watch = await bystander.files.watch(
        'user',
        { path: '/home/user', recursive: false, includeEntry: false },
        () => undefined,
        () => undefined,
      );
      watch.close();
      // At its own budget.
      expect(count).toBeGreaterThan(0);
      expect(count).toBeLessThanOrEqual(INOTIFY_INSTANCES);
    } finally {
      taken.stop();
    }
  }, 60_000);

  it('a sandbox’s user that opens every pty it can leaves the other sandboxes theirs', async () => {
    const taken = await holding(
      attacker,
      'import os\nfds = []\nerror = 0\n' +
        // More than the 3,072 ptys of all devpts but the host's together.
        'while len(fds) < 8000:\n' +
        '    try:\n' +
        '        fds.extend(os.openpty())\n' +
        '    except OSError as e:\n' +
        '        error = e.errno\n' +
        '        break\n' +
        'print(len(fds) // 2, error)',
    );
    try {
      const [count, errno] = taken.line.split(' ').map(Number);
      expect(errno).toBeGreaterThan(0);
      const terminal = await bystander.processes.start({
        config: { cmd: '/bin/echo', args: ['on a terminal'], envs: {} },
        user: USERS.get('user')!,
        pty: { cols: 80, rows: 24 },
        stdin: false,
      });
      let output = '';
      terminal.on('data', (_, bytes) => (output += bytes.toString()));
      const end = await new Promise<number>((resolve) => {
        terminal.on('end', (e) => resolve(e.exitCode));
        terminal.release();
      });
      expect(end).toBe(0);
      expect(output).toContain('on a terminal');
      expect(count).toBeLessThanOrEqual(PTYS);
      // Its own next terminal fails, and only that: its launcher and commands go on.
      await expect(
        attacker.processes.start({
          config: { cmd: '/bin/true', args: [], envs: {} },
          user: USERS.get('user')!,
          pty: { cols: 80, rows: 24 },
          stdin: false,
        }),
      ).rejects.toThrow(/cannot start it/);
      expect(await shell(attacker, 'echo still here')).toBe('still here\n');
    } finally {
      taken.stop();
    }
  }, 60_000);
});
