/**
 * Attacker tests: the launcher (the process inside a sandbox that starts its commands and talks
 * to Moat). Before confinement a sandbox process could take the launcher's pipe to Moat with
 * pidfd_getfd and write a line that crashed Moat. The launcher is now undumpable (no process of
 * the sandbox can take its descriptors or trace it), and whatever reaches Moat on its socket is
 * parsed as hostile: garbage ends that launcher, never Moat, and the next command gets a new one.
 */
import { execFile } from 'node:child_process';
import { existsSync, readFileSync, readlinkSync } from 'node:fs';
import { setTimeout as pause } from 'node:timers/promises';
import { promisify } from 'node:util';
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

  it('no signal from inside ends the sandbox’s process 1', async () => {
    for (const signal of ['INT', 'TERM', 'HUP', 'QUIT', 'USR1', 'USR2', 'PIPE', 'ALRM']) {
      await runShell(sandbox, `kill -s ${signal} 1`, { user: 'root' });
    }
    await pause(200);
    expect(await shell(sandbox, 'echo alive; ps -o pid= -p 1 | tr -d " "', { user: 'root' })).toBe(
      'alive\n1\n',
    );
  });

  it('a launcher killed from inside is started again for the next command', async () => {
    // The command ends with its launcher: as an exit status, or as the launcher's end itself.
    const killed = await runShell(sandbox, 'kill -9 $PPID; sleep 5').catch((error: Error) => ({
      code: error.message,
    }));
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

/**
 * As the host's root, takes the launcher's own sockets and writes `frames` (a Python expression
 * for a list of byte strings, `frame(header, payload)` at hand) to Moat through them.
 */
async function speakAsLauncher(target: RuntimeSandbox, frames: string): Promise<number> {
  const pid = await launcherPid(target, 'user');
  const sockets: number[] = [];
  for (let fd = 0; fd < 64; fd++) {
    try {
      if (readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith('socket:')) sockets.push(fd);
    } catch {
      // not open
    }
  }
  expect(sockets.length).toBeGreaterThan(0);
  const attack = `
import ctypes, json, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def frame(header, payload=b''):
    data = json.dumps(header).encode()
    return struct.pack('!II', len(data), len(payload)) + data + payload
pidfd = libc.syscall(434, int(sys.argv[1]), 0)
for fd in map(int, sys.argv[2:]):
    mine = libc.syscall(438, pidfd, fd, 0)
    if mine < 0:
        continue
    for garbage in ${frames}:
        try:
            os.write(mine, garbage)
        except OSError:
            pass
`;
  // Not a synchronous child: Moat (this process) must go on reading its side meanwhile.
  await promisify(execFile)(
    '/usr/bin/python3',
    ['-c', attack, String(pid), ...sockets.map(String)],
    { timeout: 10_000 },
  );
  return pid;
}

describe.skipIf(skip)('what reaches Moat from a launcher is parsed as hostile', () => {
  it.each([
    [
      'frames over every bound, headers that are not JSON',
      "(struct.pack('!II', 0xFFFFFFF0, 0) + b'x' * 64, struct.pack('!II', 5, 0) + b'{nope', b'not a frame at all\\n' * 100)",
    ],
    [
      'output for a command it never started, past any window',
      "[frame({'ev': 'out', 'id': 10**6 + i, 'fd': 1}, b'z' * 4096) for i in range(4)]",
    ],
    [
      'input taken that was never sent',
      "[frame({'ev': 'taken', 'id': i, 'bytes': 1 << 30}) for i in range(1, 200)]",
    ],
  ])('%s: that launcher ends; Moat and every sandbox go on', async (_name, frames) => {
    const launcher = await speakAsLauncher(sandbox, frames);
    const deadline = Date.now() + 5000;
    while (existsSync(`/proc/${launcher}`) && Date.now() < deadline) await pause(50);
    expect(existsSync(`/proc/${launcher}`), 'the launcher that lied is still running').toBe(false);
    // This process (Moat's runtime) is alive; the attacked launcher is replaced on next use.
    expect(await shell(sandbox, 'echo still serving')).toBe('still serving\n');
    expect(await shell(bystander, 'echo bystander')).toBe('bystander\n');
    expect(await shell(sandbox, 'echo as root', { user: 'root' })).toBe('as root\n');
  });
});
