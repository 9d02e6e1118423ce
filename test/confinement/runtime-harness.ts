/**
 * A confined runtime on a scratch data folder for the attacker suites, and why they are skipped
 * where this host cannot confine sandboxes (not root, no idmapped mounts...).
 */
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { removeMoatFolder } from '../../bench/lib/scratch.js';
import {
  ProcessRuntime,
  type ProcessRuntimeOptions,
  type RuntimeSandbox,
  type SandboxLimits,
} from '../../src/runtime/index.js';
import { confinementSkipReason } from '../support/netns.js';

export const LIMITS: SandboxLimits = { cpuCount: 1, memoryMB: 256, diskSizeMB: 256, pids: 128 };

/** Moat's defaults of the runtime's budgets (src/config-settings.ts), for runtimes of tests. */
export const BUDGETS: Pick<ProcessRuntimeOptions, 'kernelBudgets' | 'roleDeadline'> = {
  kernelBudgets: { inotifyInstances: 128, inotifyWatches: 8192, ptys: 256 },
  roleDeadline: { ms: 10_000, onMissed: () => undefined },
};

export interface Harness {
  readonly runtime: ProcessRuntime;
  readonly dataDir: string;
  /** A new sandbox of the base template (or `template`), destroyed by close(). */
  sandbox(limits?: Partial<SandboxLimits>, template?: string): Promise<RuntimeSandbox>;
  close(): Promise<void>;
}

let counter = 0;

/** `dataDir` (default: a new scratch folder) is removed by close(). */
export async function startHarness(
  options: {
    dataDir?: string;
    trustedCaPem?: string;
    budgets?: Partial<typeof BUDGETS>;
  } = {},
): Promise<Harness> {
  const dataDir = options.dataDir ?? mkdtempSync(path.join(os.tmpdir(), 'moat-confine-'));
  const runtime = await ProcessRuntime.start(dataDir, {
    allowUnconfined: false,
    ids: 'auto',
    defaultDiskMB: LIMITS.diskSizeMB,
    ...BUDGETS,
    ...options.budgets,
    ...(options.trustedCaPem === undefined ? {} : { trustedCaPem: options.trustedCaPem }),
  });
  const made: string[] = [];
  return {
    runtime,
    dataDir,
    async sandbox(limits = {}, template = 'base') {
      const id = `iconfine${process.pid}x${++counter}`.slice(0, 21).padEnd(21, '0');
      await runtime.create(id, template, runtime.trustEnvironment, '127.0.0.1', {
        ...LIMITS,
        ...limits,
      });
      made.push(id);
      return runtime.sandbox(id)!;
    },
    async close() {
      for (const id of made) await runtime.destroy(id).catch(() => undefined);
      await runtime.stop();
      removeMoatFolder(dataDir);
    },
  };
}

/** Printed once per suite where confined sandboxes cannot run here; undefined where they can. */
export const skipReason = (suite: string) => confinementSkipReason(suite);
