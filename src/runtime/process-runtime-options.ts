/**
 * What the composition root asks of the process runtime (a file of its own, below
 * process-runtime.ts and host-probe.ts, which both read it).
 */
import type { NamespaceNetwork } from './network.js';
import type { IdRangeSetting } from './sandbox-ids.js';
import type { KernelBudgets } from './supervisor-config.js';

export interface ProcessRuntimeOptions {
  /** Give each sandbox its own network namespace. */
  readonly network?: NamespaceNetwork;
  /** Why there is no network namespace per sandbox, for start-up output. */
  readonly proxyOnlyReason?: string;
  /** Run sandboxes unconfined where they cannot be confined (--unconfined-sandboxes). */
  readonly allowUnconfined: boolean;
  /** Host ids for sandboxes (--sandbox-ids). */
  readonly ids: IdRangeSetting;
  /** Size of a sandbox's disk when its limits do not say (--sandbox-disk-mb). */
  readonly defaultDiskMB: number;
  /** A CA (PEM) every sandbox trusts besides the host's bundle: Moat's egress CA. */
  readonly trustedCaPem?: string;
  /** Each sandbox's shares of the host's inotify and pty pools. */
  readonly kernelBudgets: KernelBudgets;
  /**
   * How long a sandbox's launcher or file agent may go without progress while Moat waits on
   * it (then it is ended, the call fails, and a new one starts on next use); `onMissed` hears
   * of each miss.
   */
  readonly roleDeadline: {
    readonly ms: number;
    readonly onMissed: (sandboxID: string, role: 'launcher' | 'file agent', user: string) => void;
  };
}
