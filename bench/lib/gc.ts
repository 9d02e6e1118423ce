/**
 * Heap measurement needs a callable `gc()`. When the script was started without `--expose-gc`,
 * `reexecWithExposedGc` runs the same script again in a child process with the flag.
 */
import { spawn } from 'node:child_process';

const REEXEC_ENV = 'MOAT_BENCH_EXPOSE_GC_CHILD';

/**
 * Returns false when `gc()` is available (carry on). Otherwise re-runs this script with
 * `--expose-gc`, waits for it, sets the exit code from it and returns true (the caller should
 * do nothing more).
 */
export async function reexecWithExposedGc(): Promise<boolean> {
  if (typeof globalThis.gc === 'function') return false;
  if (process.env[REEXEC_ENV] === '1') {
    throw new Error('gc() is still unavailable after re-running with --expose-gc');
  }
  const script = process.argv[1];
  if (script === undefined) throw new Error('cannot re-run: no script path in process.argv');
  const child = spawn(
    process.execPath,
    ['--expose-gc', ...process.execArgv, script, ...process.argv.slice(2)],
    { stdio: 'inherit', env: { ...process.env, [REEXEC_ENV]: '1' } },
  );
  const code = await new Promise<number>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (exitCode, signal) => resolve(exitCode ?? (signal ? 1 : 0)));
  });
  process.exitCode = code;
  return true;
}

/** One full garbage collection. */
export function gcOnce(): void {
  const gc = globalThis.gc;
  if (typeof gc !== 'function') throw new Error('gc() is unavailable; run node with --expose-gc');
  gc();
}

/** Full garbage collections until the heap stops shrinking (three at most). */
export function fullGc(): void {
  let last = Number.POSITIVE_INFINITY;
  for (let i = 0; i < 3; i++) {
    gcOnce();
    const used = process.memoryUsage().heapUsed;
    if (used >= last) break;
    last = used;
  }
}

/** JS heap plus ArrayBuffer backing stores (typed arrays live outside the JS heap). */
export function retainedNow(): number {
  const usage = process.memoryUsage();
  return usage.heapUsed + usage.arrayBuffers;
}

/**
 * The memory retained per object made by `make`: makes `count` of them, holds them all, and
 * divides the growth of heap plus array buffers (after full GCs) by `count`.
 */
export function retainedBytesPer(make: () => unknown, count: number): number {
  const held: unknown[] = [];
  fullGc();
  const before = retainedNow();
  for (let i = 0; i < count; i++) held.push(make());
  fullGc();
  const after = retainedNow();
  if (held.length !== count) throw new Error('unreachable');
  held.length = 0;
  return (after - before) / count;
}
