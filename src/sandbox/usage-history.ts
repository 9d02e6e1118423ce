/**
 * Metrics of sandboxes: what each running sandbox uses (its runtime's reading of its cgroup and
 * disk), sampled on a fixed schedule into a bounded history per sandbox. CPU use is a rate, so
 * a sample is made from two readings one interval apart: the first reading of a sandbox (and the
 * first after a pause) only sets the baseline.
 */
import type { SandboxLimits, SandboxUsage } from '../runtime/index.js';

/** One sample, in the units the platform API reports (bytes, percent of the sandbox's CPUs). */
export interface UsageSample {
  /** Milliseconds since the epoch, a whole second. */
  readonly timestamp: number;
  readonly cpuCount: number;
  /** Share of its CPUs used since the previous sample, 0 to 100. */
  readonly cpuUsedPct: number;
  readonly memUsed: number;
  readonly memTotal: number;
  readonly memCache: number;
  readonly diskUsed: number;
  readonly diskTotal: number;
}

/** Every 5 s, as the reference service samples. */
export const SAMPLE_INTERVAL_MS = 5000;
/** Samples kept per sandbox: one hour at the default interval. */
export const SAMPLES_KEPT = 720;

interface Reading {
  readonly at: number;
  readonly cpuMicros: number | undefined;
}

interface History {
  samples: UsageSample[];
  last: Reading | undefined;
}

export interface UsageSource {
  /** Sandboxes to sample now (running on this node). */
  running(): Iterable<string>;
  /** Sandboxes that still exist (running or paused): the others' histories are dropped. */
  exists(sandboxID: string): boolean;
  /** What the sandbox uses now, and its bounds; undefined when it has no processes here. */
  read(sandboxID: string): Promise<{ usage: SandboxUsage; limits: SandboxLimits } | undefined>;
}

export class UsageHistory {
  private readonly histories = new Map<string, History>();
  private timer: NodeJS.Timeout | undefined;
  private sampling: Promise<void> | undefined;

  constructor(
    private readonly source: UsageSource,
    private readonly now: () => number,
    private readonly intervalMs = SAMPLE_INTERVAL_MS,
    private readonly kept = SAMPLES_KEPT,
  ) {}

  start(): void {
    this.timer ??= setInterval(() => {
      // A slow round (a busy host) is not overlapped by the next: that one is skipped.
      this.sampling ??= this.sampleAll().finally(() => (this.sampling = undefined));
    }, this.intervalMs).unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.sampling;
  }

  /** Drops a sandbox's history (it is gone). */
  forget(sandboxID: string): void {
    this.histories.delete(sandboxID);
  }

  /** Samples of a sandbox from `from` to `to` (milliseconds, both included), oldest first. */
  samples(sandboxID: string, from = -Infinity, to = Infinity): UsageSample[] {
    const samples = this.histories.get(sandboxID)?.samples ?? [];
    return samples.filter((s) => s.timestamp >= from && s.timestamp <= to);
  }

  latest(sandboxID: string): UsageSample | undefined {
    return this.histories.get(sandboxID)?.samples.at(-1);
  }

  /** One round: a reading of every running sandbox; histories of sandboxes gone are dropped. */
  async sampleAll(): Promise<void> {
    for (const id of this.histories.keys()) {
      if (!this.source.exists(id)) this.histories.delete(id);
    }
    for (const sandboxID of [...this.source.running()]) {
      const reading = await this.source.read(sandboxID).catch(() => undefined);
      if (reading !== undefined) this.add(sandboxID, reading.limits, reading.usage);
    }
  }

  private add(sandboxID: string, limits: SandboxLimits, usage: SandboxUsage): void {
    const at = this.now();
    let history = this.histories.get(sandboxID);
    if (history === undefined) {
      history = { samples: [], last: undefined };
      this.histories.set(sandboxID, history);
    }
    const last = history.last;
    history.last = { at, cpuMicros: usage.cpuMicros };
    // Only a reading of the previous round is a baseline: a sandbox paused meanwhile (or whose
    // cgroup was made anew by a cold boot) starts over.
    if (last === undefined || at - last.at > this.intervalMs * 1.5 || at <= last.at) return;
    const used =
      usage.cpuMicros === undefined || last.cpuMicros === undefined
        ? 0
        : usage.cpuMicros - last.cpuMicros;
    if (used < 0) return;
    const capacity = (at - last.at) * 1000 * limits.cpuCount;
    history.samples.push({
      // Whole seconds: the SDK asks for ranges in seconds, rounded from the times it was given.
      timestamp: Math.floor(at / 1000) * 1000,
      cpuCount: limits.cpuCount,
      cpuUsedPct: Math.round(Math.min(100, (used / capacity) * 100) * 100) / 100,
      memUsed: Math.max(0, usage.memoryBytes - usage.cacheBytes),
      memTotal: limits.memoryMB * 2 ** 20,
      memCache: usage.cacheBytes,
      diskUsed: usage.diskUsedBytes ?? 0,
      diskTotal: usage.diskTotalBytes,
    });
    if (history.samples.length > this.kept)
      history.samples.splice(0, history.samples.length - this.kept);
  }
}
