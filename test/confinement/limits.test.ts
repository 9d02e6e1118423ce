/**
 * Attacker tests: a sandbox cannot take the host's resources. Processes and threads, memory, CPU
 * time and disk are bounded per sandbox (its cgroup and its disk); what goes over a bound fails
 * or is killed inside that sandbox, and Moat and other sandboxes go on. A snapshot keeps the
 * limits it was taken with (per-template overrides), whatever the defaults later are. Every load
 * here is bounded in count and time.
 */
import { mkdtempSync, readdirSync, readFileSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { removeMoatFolder } from '../../bench/lib/scratch.js';
import { type RunningMoat, startMoat } from '../../src/app/index.js';
import type { RuntimeSandbox } from '../../src/runtime/index.js';
import { ApiClient, testMoatConfig } from '../support/api-client.js';
import { FakeDns } from '../support/fake-dns.js';
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

/** A Moat on `dataDir` (kept when it stops) whose base-template sandboxes get `defaults`. */
async function moatOn(
  dataDir: string,
  upstream: FakeDns,
  defaults: { memoryMB: number; cpuCount: number; diskSizeMB: number; pids: number },
): Promise<{ moat: RunningMoat; api: ApiClient }> {
  const { config, scratch } = testMoatConfig(upstream.port, {
    'data-dir': dataDir,
    'unconfined-sandboxes': 'false',
    'sandbox-memory-mb': String(defaults.memoryMB),
    'sandbox-cpus': String(defaults.cpuCount),
    'sandbox-disk-mb': String(defaults.diskSizeMB),
    'sandbox-pids': String(defaults.pids),
  });
  scratch.remove(); // Its data folder is replaced by `dataDir`.
  const moat = await startMoat(config, pino({ level: 'silent' }), { defaultMetrics: false });
  const { host, port } = moat.listening.api;
  return { moat, api: new ApiClient(`http://${host}:${port}`) };
}

/**
 * A cgroup file of the sandbox's first process, read on the host: `v1` under the controller's
 * v1 hierarchy where the process is in one, else `v2` under the v2 hierarchy.
 */
async function cgroupFile(
  sandbox: RuntimeSandbox,
  controller: string,
  v1: string,
  v2: string,
): Promise<string> {
  const [pid] = await sandbox.processIds();
  const lines = readFileSync(`/proc/${pid}/cgroup`, 'utf8').trim().split('\n');
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8').trim().split('\n');
  const mountOf = (type: string, option?: string) =>
    mounts
      .map((line) => line.split(' - '))
      .find(([, after]) => {
        const [kind, , options = ''] = after!.split(' ');
        return kind === type && (option === undefined || options.split(',').includes(option));
      })?.[0]!
      .split(' ')[4];
  const own = lines.find((l) => l.split(':')[1]!.split(',').includes(controller));
  const [file, mount, at] = own
    ? [v1, mountOf('cgroup', controller), own.split(':')[2]]
    : [v2, mountOf('cgroup2'), lines.find((l) => l.startsWith('0::'))!.slice(3)];
  return readFileSync(path.join(mount!, at!, file), 'utf8').trim();
}

/** Touches `mb` MiB page by page; 'survived' when the sandbox's memory bound allowed it. */
const allocate = (mb: number) =>
  `exec timeout 25 python3 -c "b = bytearray(${mb} << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; print('survived')"`;

describe.skipIf(skip)('per-template limits', () => {
  const TEMPLATE = { memoryMB: 160, cpuCount: 1, diskSizeMB: 300, pids: 100 };
  const LATER = { memoryMB: 400, cpuCount: 2, diskSizeMB: 500, pids: 200 };
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'moat-template-limits-'));
  let upstream: FakeDns;
  let running: RunningMoat | undefined;

  beforeAll(async () => {
    upstream = await new FakeDns(new Map()).start();
  });

  afterAll(async () => {
    await running?.stop();
    await upstream?.stop();
    removeMoatFolder(dataDir);
  });

  it('a snapshot keeps the limits it was taken with, over a later default; base gets the new one', async () => {
    // Moat with one set of defaults: a base sandbox, snapshotted by name.
    let { moat, api } = await moatOn(dataDir, upstream, TEMPLATE);
    running = moat;
    const source = await api.sandbox();
    await api.snapshot(source.sandboxID, 'limited');
    expect(
      (await api.delete(`/sandboxes/${source.sandboxID}`)).status,
      'the source is gone: the template alone carries its limits',
    ).toBe(204);
    await moat.stop();
    running = undefined;

    // The same data folder, other defaults.
    ({ moat, api } = await moatOn(dataDir, upstream, LATER));
    running = moat;
    const fromTemplate = await api.sandbox({ templateID: 'limited' });
    const fromBase = await api.sandbox({ templateID: 'base' });
    const reported = async (id: string) => {
      const detail = (await api.detail(id)) as unknown as Record<string, unknown>;
      return {
        memoryMB: detail.memoryMB,
        cpuCount: detail.cpuCount,
        diskSizeMB: detail.diskSizeMB,
      };
    };
    const { pids: _templatePids, ...templateReported } = TEMPLATE;
    const { pids: _laterPids, ...laterReported } = LATER;
    expect(await reported(fromTemplate.sandboxID)).toEqual(templateReported);
    expect(await reported(fromBase.sandboxID)).toEqual(laterReported);

    // What the kernel holds each to: its cgroup, its disk, an allocation between the bounds.
    for (const [id, limits] of [
      [fromTemplate.sandboxID, TEMPLATE],
      [fromBase.sandboxID, LATER],
    ] as const) {
      const sandbox = moat.runtime.sandbox(id)!;
      const context = id === fromTemplate.sandboxID ? 'from the template' : 'from base';
      expect(sandbox.confined, context).toBe(true);
      expect(
        Number(await cgroupFile(sandbox, 'memory', 'memory.limit_in_bytes', 'memory.max')),
        context,
      ).toBe(limits.memoryMB * 2 ** 20);
      expect(Number(await cgroupFile(sandbox, 'pids', 'pids.max', 'pids.max')), context).toBe(
        limits.pids,
      );
      const quota = await cgroupFile(sandbox, 'cpu', 'cpu.cfs_quota_us', 'cpu.max');
      expect(Number(quota.split(' ')[0]), context).toBe(limits.cpuCount * 100_000);
      const disk = Number(
        (await shell(sandbox, 'df -m --output=size /home/user | tail -1')).trim(),
      );
      expect(disk, context).toBeGreaterThan(limits.diskSizeMB * 0.8);
      expect(disk, context).toBeLessThanOrEqual(limits.diskSizeMB);
    }
    // 280 MiB: over the template's 160, under the new default's 400.
    const held = await runShell(moat.runtime.sandbox(fromTemplate.sandboxID)!, allocate(280));
    expect(held.stdout, 'the template sandbox is OOM-killed').not.toContain('survived');
    expect(held.code).not.toBe(0);
    const free = await runShell(moat.runtime.sandbox(fromBase.sandboxID)!, allocate(280));
    expect(free.stdout, free.stderr).toContain('survived');
  }, 120_000);
});
