/**
 * The metrics history on its own, with readings the test chooses: the rate arithmetic, the
 * baseline rules, the bound on samples kept and dropping the history of a sandbox that went.
 */
import { describe, expect, it } from 'vitest';
import type { SandboxLimits, SandboxUsage } from '../../src/runtime/index.js';
import { UsageHistory } from '../../src/sandbox/usage-history.js';

const LIMITS: SandboxLimits = { cpuCount: 2, memoryMB: 512, diskSizeMB: 1024, pids: 100 };
const MiB = 2 ** 20;

function setup(kept = 720) {
  const clock = { now: 1_000_000 };
  const sandboxes = new Map<string, SandboxUsage>();
  const history = new UsageHistory(
    {
      running: () => sandboxes.keys(),
      exists: (id) => sandboxes.has(id),
      read: async (id) => {
        const usage = sandboxes.get(id);
        return usage && { usage, limits: LIMITS };
      },
    },
    () => clock.now,
    1000,
    kept,
  );
  const use = (id: string, cpuMicros: number | undefined, extra: Partial<SandboxUsage> = {}) =>
    sandboxes.set(id, {
      cpuMicros,
      memoryBytes: 100 * MiB,
      cacheBytes: 30 * MiB,
      diskUsedBytes: 5 * MiB,
      diskTotalBytes: 1024 * MiB,
      ...extra,
    });
  const tick = async (ms = 1000) => {
    clock.now += ms;
    await history.sampleAll();
  };
  return { clock, sandboxes, history, use, tick };
}

describe('UsageHistory', () => {
  it('makes a sample from two readings one interval apart, in the API’s units', async () => {
    const { history, use, tick } = setup();
    use('a', 0);
    await tick();
    expect(history.samples('a')).toEqual([]);
    // One of two CPUs busy for the whole second: 50 %.
    use('a', 1_000_000);
    await tick();
    expect(history.samples('a')).toEqual([
      {
        timestamp: 1_002_000,
        cpuCount: 2,
        cpuUsedPct: 50,
        memUsed: 70 * MiB,
        memTotal: 512 * MiB,
        memCache: 30 * MiB,
        diskUsed: 5 * MiB,
        diskTotal: 1024 * MiB,
      },
    ]);
  });

  it('caps the rate at 100 %, and starts over after a gap or a counter that went back', async () => {
    const { history, use, tick } = setup();
    use('a', 0);
    await tick();
    use('a', 9_000_000);
    await tick();
    expect(history.latest('a')?.cpuUsedPct).toBe(100);
    // Paused for a while: the next reading is only a baseline.
    use('a', 9_500_000);
    await tick(10_000);
    expect(history.samples('a')).toHaveLength(1);
    // A cold boot makes a new cgroup: its counter starts at 0 again.
    use('a', 10);
    await tick();
    expect(history.samples('a')).toHaveLength(1);
    use('a', 200_010);
    await tick();
    expect(history.latest('a')?.cpuUsedPct).toBe(10);
  });

  it('reports 0 % where CPU time is not counted', async () => {
    const { history, use, tick } = setup();
    use('a', undefined);
    await tick();
    await tick();
    expect(history.latest('a')?.cpuUsedPct).toBe(0);
  });

  it('keeps at most `kept` samples, the newest, and filters by time', async () => {
    const { history, use, tick } = setup(3);
    use('a', 0);
    for (let i = 0; i < 10; i++) await tick();
    const samples = history.samples('a');
    expect(samples.map((s) => s.timestamp)).toEqual([1_008_000, 1_009_000, 1_010_000]);
    expect(history.samples('a', 1_009_000, 1_009_000)).toHaveLength(1);
    expect(history.samples('a', 1_011_000)).toEqual([]);
  });

  it('drops the history of a sandbox that went, at once on forget or at the next round', async () => {
    const { history, sandboxes, use, tick } = setup();
    use('a', 0);
    use('b', 0);
    await tick();
    await tick();
    history.forget('a');
    expect(history.samples('a')).toEqual([]);
    sandboxes.delete('b');
    await tick();
    expect(history.latest('b')).toBeUndefined();
  });
});
