/**
 * Attacker tests: a sandbox cannot take the host's resources. Processes and threads, memory, CPU
 * time and disk are bounded per sandbox (its cgroup and its disk); what goes over a bound fails
 * or is killed inside that sandbox, and Moat and other sandboxes go on. Every load here is
 * bounded in count and time.
 */
import { readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RuntimeSandbox } from '../../src/runtime/index.js';
import { runShell, shell } from '../support/sandbox-shell.js';
import { type Harness, skipReason, startHarness } from './runtime-harness.js';

const skip = skipReason('confinement/limits');
let harness: Harness;
let bystander: RuntimeSandbox;

beforeAll(async () => {
  if (skip) return;
  harness = await startHarness();
  bystander = await harness.sandbox();
}, 60_000);

afterAll(async () => {
  await harness?.close();
});

describe.skipIf(skip)('limits per sandbox', () => {
  it('a process loop stops at the pid limit', async () => {
    const sandbox = await harness.sandbox({ pids: 48 });
    // 200 children asked for, each living 3 s; the limit allows 48 tasks in all (the sandbox's
    // own included). One process counts, so that counting needs no fork.
    const result = await shell(sandbox, 'exec python3 -c "$1"', {
      args: [
        'import os, time\n' +
          'made, refused = [], 0\n' +
          'for _ in range(200):\n' +
          '    try:\n' +
          '        pid = os.fork()\n' +
          '    except BlockingIOError:\n' +
          '        refused += 1\n' +
          '        continue\n' +
          '    if pid == 0:\n' +
          '        time.sleep(3)\n' +
          '        os._exit(0)\n' +
          '    made.append(pid)\n' +
          'print(len(made), refused, len([p for p in os.listdir("/proc") if p.isdigit()]))\n' +
          'for pid in made: os.kill(pid, 9)\n' +
          'for pid in made: os.waitpid(pid, 0)\n',
      ],
    });
    const [made, refused, visible] = result.trim().split(' ').map(Number);
    expect(made! + refused!).toBe(200);
    expect(refused).toBeGreaterThan(100);
    expect(visible).toBeLessThanOrEqual(48);
    expect(await shell(bystander, 'echo fine')).toBe('fine\n');
  }, 30_000);

  it('an allocation over the memory limit is killed inside the sandbox, nothing else', async () => {
    const sandbox = await harness.sandbox({ memoryMB: 96 });
    const result = await runShell(
      sandbox,
      // Touches 512 MiB, page by page: the sandbox's OOM killer ends it well before.
      'exec timeout 25 python3 -c "b = bytearray(512 << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; print(\'survived\')"',
    );
    expect(result.stdout).not.toContain('survived');
    expect(result.code).not.toBe(0);
    // The sandbox itself goes on, and so do the others.
    expect(await shell(sandbox, 'echo after')).toBe('after\n');
    expect(await shell(bystander, 'echo fine')).toBe('fine\n');
  }, 40_000);

  it('CPU time is bounded by the sandbox’s CPU count', async () => {
    const sandbox = await harness.sandbox({ cpuCount: 1 });
    // Two spinning processes for 1.5 s of wall time: with one CPU they get 1.5 s of CPU between them.
    const result = await shell(sandbox, 'exec python3 -c "$1"', {
      args: [
        'import os, time\n' +
          'for _ in range(2):\n' +
          '    if os.fork() == 0:\n' +
          '        end = time.time() + 1.5\n' +
          '        while time.time() < end: pass\n' +
          '        os._exit(0)\n' +
          'os.wait(); os.wait()\n' +
          't = os.times()\n' +
          'print(t.children_user + t.children_system)',
      ],
    });
    expect(Number(result.trim())).toBeLessThan(1.5 * 1.25);
  }, 20_000);

  it('the disk bounds what a sandbox writes (ENOSPC) and what it takes of the host', async () => {
    const sandbox = await harness.sandbox({ diskSizeMB: 64 });
    const result = await runShell(
      sandbox,
      'dd if=/dev/zero of=/home/user/big bs=1M count=200 2>&1; df -m /home/user | tail -1',
    );
    expect(result.stdout).toMatch(/No space left on device/);
    const disks = path.join(harness.dataDir, 'disks');
    const images = readdirSync(disks).filter((n) => n.endsWith('.img'));
    for (const image of images) {
      // Sparse images: what is used on the host is at most what they hold.
      expect(statSync(path.join(disks, image)).blocks * 512).toBeLessThan(300 * 2 ** 20);
    }
    expect(await shell(sandbox, 'rm /home/user/big && echo freed')).toBe('freed\n');
  }, 30_000);

  it('sees its disk as the size of its own file system', async () => {
    const sandbox = await harness.sandbox({ diskSizeMB: 100 });
    const total = Number((await shell(sandbox, 'df -m --output=size /home/user | tail -1')).trim());
    expect(total).toBeGreaterThan(80);
    expect(total).toBeLessThanOrEqual(100);
  });
});
