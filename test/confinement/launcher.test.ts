/**
 * Attacker tests: the launcher (the process inside a sandbox that starts its commands and talks
 * to Moat). Before confinement a sandbox process could take the launcher's pipe to Moat with
 * pidfd_getfd and write a line that crashed Moat. The launcher is now undumpable (no process of
 * the sandbox can take its descriptors or trace it), and whatever reaches Moat on its socket is
 * parsed as hostile: garbage ends that launcher, never Moat, and the next command gets a new one.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync, readlinkSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RuntimeSandbox } from '../../src/runtime/index.js';
import { runShell, shell } from '../support/sandbox-shell.js';
import { type Harness, skipReason, startHarness } from './runtime-harness.js';

const skip = skipReason('confinement/launcher');
let harness: Harness;
let sandbox: RuntimeSandbox;
let bystander: RuntimeSandbox;

beforeAll(async () => {
  if (skip) return;
  harness = await startHarness();
  sandbox = await harness.sandbox();
  bystander = await harness.sandbox();
}, 60_000);

afterAll(async () => {
  await harness?.close();
});

/** From inside: every way to reach the launcher that started this very command. */
const PROBE = `
import ctypes, json, os, signal
libc = ctypes.CDLL(None, use_errno=True)
launcher = os.getppid()
out = {}
def attempt(name, call):
    try:
        result = call()
        out[name] = 'ok' if result is None or result >= 0 else ctypes.get_errno()
    except OSError as e:
        out[name] = e.errno
attempt('list fds', lambda: os.listdir(f'/proc/{launcher}/fd') and None)
attempt('open its socket', lambda: os.open(f'/proc/{launcher}/fd/3', os.O_RDWR))
attempt('read its memory', lambda: os.open(f'/proc/{launcher}/mem', os.O_RDONLY))
pidfd = libc.syscall(434, launcher, 0)  # pidfd_open
out['pidfd_getfd'] = [libc.syscall(438, pidfd, fd, 0) >= 0 or ctypes.get_errno() for fd in range(3, 12)]
out['ptrace'] = libc.ptrace(16, launcher, None, None) >= 0 or ctypes.get_errno()  # PTRACE_ATTACH
print(json.dumps(out))
`;

describe.skipIf(skip)('no sandbox process can take or trace its launcher', () => {
  it.each(['user', 'root'])(
    'as %s: its launcher’s descriptors, memory and ptrace are refused',
    async (user) => {
      if (process.arch !== 'x64') return; // syscall numbers are x86_64's
      const result = await runShell(sandbox, 'exec python3 -c "$1"', { user, args: [PROBE] });
      const out = JSON.parse(result.stdout) as Record<string, unknown>;
      expect(out['list fds'], JSON.stringify(out)).not.toBe('ok');
      expect(out['open its socket']).not.toBe('ok');
      expect(out['read its memory']).not.toBe('ok');
      expect((out.pidfd_getfd as unknown[]).every((r) => r !== true)).toBe(true);
      expect(out.ptrace).not.toBe(true);
    },
  );

  it('a launcher killed from inside is started again for the next command', async () => {
    const killed = await runShell(sandbox, 'kill -9 $PPID; sleep 5');
    expect(killed.code).not.toBe(0);
    expect(await shell(sandbox, 'echo back')).toBe('back\n');
  });
});

/** Host pids of the launcher of `user` in `target` (found as the parent of a command of it). */
async function launcherPid(target: RuntimeSandbox, user: string): Promise<number> {
  const inside = Number((await shell(target, 'echo $PPID', { user })).trim());
  for (const pid of await target.processIds()) {
    let status: string;
    try {
      status = readFileSync(`/proc/${pid}/status`, 'utf8');
    } catch {
      continue;
    }
    const nspid = /^NSpid:\s+(.*)$/m.exec(status)?.[1]?.trim().split(/\s+/);
    if (nspid && Number(nspid.at(-1)) === inside && nspid.length > 1) return pid;
  }
  throw new Error(`no launcher of ${user} found`);
}

describe.skipIf(skip)('what reaches Moat from a launcher is parsed as hostile', () => {
  it('garbage on the launcher’s socket ends that launcher only; Moat and every sandbox go on', async () => {
    const pid = await launcherPid(sandbox, 'user');
    const sockets = (() => {
      const found: number[] = [];
      for (let fd = 0; fd < 64; fd++) {
        try {
          if (readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith('socket:')) found.push(fd);
        } catch {
          // not open
        }
      }
      return found;
    })();
    expect(sockets.length).toBeGreaterThan(0);
    // As the host's root, take the launcher's own sockets and speak garbage to Moat through them:
    // a frame that is over every bound, then one whose header is not JSON.
    const attack = `
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
pidfd = libc.syscall(434, int(sys.argv[1]), 0)
for fd in map(int, sys.argv[2:]):
    mine = libc.syscall(438, pidfd, fd, 0)
    if mine < 0:
        continue
    for garbage in (struct.pack('!II', 0xFFFFFFF0, 0) + b'x' * 64, struct.pack('!II', 5, 0) + b'{nope', b'not a frame at all\\n' * 100):
        try:
            os.write(mine, garbage)
        except OSError:
            pass
`;
    execFileSync('/usr/bin/python3', ['-c', attack, String(pid), ...sockets.map(String)], {
      timeout: 10_000,
    });
    // This process (Moat's runtime) is alive; the attacked launcher is replaced on next use.
    expect(await shell(sandbox, 'echo still serving')).toBe('still serving\n');
    expect(await shell(bystander, 'echo bystander')).toBe('bystander\n');
    expect(await shell(sandbox, 'echo as root', { user: 'root' })).toBe('as root\n');
  });
});
