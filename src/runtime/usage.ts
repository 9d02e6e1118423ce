/**
 * What a sandbox uses now: CPU time and memory from its cgroup (or, unconfined, from its
 * processes), disk from the file system of its disk image. Metrics sample this on a schedule.
 */
import { statfs, readFile } from 'node:fs/promises';
import type { CgroupUsage } from './cgroups.js';

export interface SandboxUsage extends CgroupUsage {
  /** Bytes in use on its disk; undefined when it has no disk of its own (no bound to measure). */
  readonly diskUsedBytes: number | undefined;
  /** Its disk's size in bytes. */
  readonly diskTotalBytes: number;
}

/** Linux reports process CPU time in clock ticks of 1/100 s on every architecture Moat runs on. */
const MICROS_PER_TICK = 10_000;
const PAGE_BYTES = 4096;

/**
 * CPU time and resident memory of processes that share the host (an unconfined sandbox): a
 * process that has ended no longer counts, so CPU time may fall between two samples.
 */
export async function processUsage(pids: readonly number[]): Promise<CgroupUsage> {
  let ticks = 0;
  let pages = 0;
  for (const pid of pids) {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
    const statm = await readFile(`/proc/${pid}/statm`, 'utf8').catch(() => '');
    // Fields after the command (which may hold spaces) start at the state, field 3.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    ticks += (Number(fields[11]) || 0) + (Number(fields[12]) || 0);
    pages += Number(statm.split(' ')[1]) || 0;
  }
  return { cpuMicros: ticks * MICROS_PER_TICK, memoryBytes: pages * PAGE_BYTES, cacheBytes: 0 };
}

/** Used and total bytes of the file system mounted at `folder` (a sandbox's disk image). */
export async function diskUsage(folder: string): Promise<{ used: number; total: number }> {
  const fs = await statfs(folder);
  return { used: (fs.blocks - fs.bfree) * fs.bsize, total: fs.blocks * fs.bsize };
}
