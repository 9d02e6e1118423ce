/**
 * Timing helpers for micro-benchmarks: throughput of a batched operation within a bounded time
 * and count, and the median of repeated one-shot timings. Every loop here is bounded both ways.
 */

/** Results are folded in here so that V8 cannot drop the measured work as dead code. */
let sinkValue = 0;

/** Consumes a value (call it with whatever the measured code produced). */
export function sink(value: number): void {
  sinkValue = (sinkValue + value) | 0;
}

/** The folded value; print it somewhere so the sink itself is observable. */
export function sinkChecksum(): number {
  return sinkValue >>> 0;
}

export const nowNs = (): bigint => process.hrtime.bigint();

export const elapsedMs = (startNs: bigint): number =>
  Number(process.hrtime.bigint() - startNs) / 1e6;

export interface RateOptions {
  /** Time spent measuring, after warm-up, over all trials. */
  readonly budgetMs: number;
  /** Time spent warming up (and calibrating the batch size). */
  readonly warmupMs: number;
  /** Upper bound on operations measured over all trials (and, separately, warmed up). */
  readonly maxOps: number;
  /** The budget is split into this many trials; the reported rate is their median (default 5). */
  readonly trials?: number;
  /** A batch is grown until it takes about this long, so the clock is read rarely. */
  readonly batchMs?: number;
}

export interface Rate {
  /** Median of the trials' rates, in operations per second. */
  readonly perSecond: number;
  /** Slowest and fastest trial, in operations per second. */
  readonly min: number;
  readonly max: number;
  /** Operations measured over all trials. */
  readonly ops: number;
  readonly elapsedMs: number;
}

/** A batch function: performs `count` operations, returns a number derived from their results. */
export type Batch = (count: number) => number;

/**
 * Warms `batch` up for `warmupMs` and returns a batch size: it starts at 1 and doubles until one
 * batch takes about `batchMs`, so slow operations are measured with small batches and fast ones
 * without reading the clock per operation.
 */
function calibrate(batch: Batch, options: RateOptions): number {
  const batchNs = BigInt(Math.round((options.batchMs ?? 2) * 1e6));
  let count = 1;
  let warmed = 0;
  const warmEnd = nowNs() + BigInt(Math.round(options.warmupMs * 1e6));
  for (;;) {
    const t0 = nowNs();
    sink(batch(count));
    const t1 = nowNs();
    warmed += count;
    if (t1 >= warmEnd || warmed >= options.maxOps) return count;
    if (t1 - t0 < batchNs && count < options.maxOps / 8) count *= 2;
  }
}

interface Cell {
  readonly batch: Batch;
  readonly options: RateOptions;
  count: number;
  readonly rates: number[];
  ops: number;
  elapsedNs: bigint;
}

/** One trial: batches until the trial's share of time or operations is used (at least one). */
function runTrial(cell: Cell): void {
  const trials = Math.max(1, cell.options.trials ?? 5);
  const trialNs = BigInt(Math.round((cell.options.budgetMs / trials) * 1e6));
  const trialOps = Math.max(1, Math.floor(cell.options.maxOps / trials));
  let done = 0;
  const start = nowNs();
  const end = start + trialNs;
  let now: bigint;
  do {
    const n = Math.min(cell.count, trialOps - done);
    sink(cell.batch(n));
    done += n;
    now = nowNs();
  } while (now < end && done < trialOps);
  const ns = now - start;
  cell.rates.push(ns > 0n ? (done * 1e9) / Number(ns) : Number.POSITIVE_INFINITY);
  cell.ops += done;
  cell.elapsedNs += ns;
}

const toRate = (cell: Cell): Rate => ({
  perSecond: median(cell.rates),
  min: Math.min(...cell.rates),
  max: Math.max(...cell.rates),
  ops: cell.ops,
  elapsedMs: Number(cell.elapsedNs) / 1e6,
});

/**
 * Measures several batch functions side by side: each is warmed up, then their trials take
 * turns (A1 B1 C1 A2 B2 C2 ...), so that a burst of interference (another process, a GC) hits
 * all of them alike instead of one, and ratios between them stay meaningful. Each reported rate
 * is the median of that function's trials.
 */
export interface RateCell {
  readonly batch: Batch;
  readonly options: RateOptions;
}

export function measureRates<T extends readonly RateCell[]>(
  cells: readonly [...T],
): { [K in keyof T]: Rate } {
  const state: Cell[] = cells.map(({ batch, options }) => ({
    batch,
    options,
    count: calibrate(batch, options),
    rates: [],
    ops: 0,
    elapsedNs: 0n,
  }));
  const trials = Math.max(...state.map((cell) => Math.max(1, cell.options.trials ?? 5)));
  for (let t = 0; t < trials; t++) {
    for (const cell of state)
      if (cell.rates.length < Math.max(1, cell.options.trials ?? 5)) runTrial(cell);
  }
  return state.map(toRate) as { [K in keyof T]: Rate };
}

/** Measures the throughput of one batch function (see `measureRates`). */
export function measureRate(batch: Batch, options: RateOptions): Rate {
  return measureRates([{ batch, options }])[0];
}

/**
 * Runs `fn` and reports how much CPU time this process got per unit of wall time (1 = one full
 * core; GC helper threads count too). Well below 1 during a single-threaded benchmark means
 * other load on the machine. CPU time is accounted coarsely, so judge only phases of a few
 * hundred milliseconds or more.
 */
export function withCpuShare<T>(fn: () => T): { result: T; cpuShare: number; wallMs: number } {
  const cpu0 = process.cpuUsage();
  const t0 = nowNs();
  const result = fn();
  const wallUs = Number(nowNs() - t0) / 1e3;
  const cpu = process.cpuUsage(cpu0);
  const cpuShare = wallUs > 0 ? (cpu.user + cpu.system) / wallUs : 1;
  return { result, cpuShare, wallMs: wallUs / 1e3 };
}

export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/**
 * Runs `fn` up to `maxRuns` times (at least `minRuns`, stopping early once `budgetMs` of wall
 * time is spent) and returns the median time of `fn` in milliseconds. `before` runs untimed
 * ahead of each run (e.g. a full GC, so one run's garbage is not collected in the next); the
 * result of `fn` is passed to `use`, untimed.
 */
export function medianTimeMs<T>(
  fn: () => T,
  options: { minRuns: number; maxRuns: number; budgetMs: number; before?: () => void },
  use: (result: T) => void = () => {},
): { medianMs: number; runs: number } {
  const times: number[] = [];
  const start = nowNs();
  while (times.length < options.maxRuns) {
    options.before?.();
    const t0 = nowNs();
    const result = fn();
    times.push(elapsedMs(t0));
    use(result);
    if (times.length >= options.minRuns && elapsedMs(start) >= options.budgetMs) break;
  }
  return { medianMs: median(times), runs: times.length };
}

/** The nearest-rank percentile (`q` in 0..1) of `values`; NaN when there are none. */
export const percentile = (values: readonly number[], q: number): number => {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!;
};
