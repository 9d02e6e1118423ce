/**
 * The parts the pieces of the lifecycle share, built once by `SandboxService`. Each piece (restore,
 * snapshots, forks, network updates, cluster reloads) names the few it uses in its context.
 */
import type { Logger } from 'pino';
import type { AddressPool, Bandwidth, EnforcementTable, KernelEnforcer } from '../enforce/index.js';
import type { MoatMetrics } from '../metrics/index.js';
import type { SandboxEnvironment, SandboxRuntime } from '../runtime/index.js';
import type { ClusterMembership } from './membership.js';
import type { SandboxPolicies } from './policies.js';
import type { SandboxRecord } from './records.js';
import type { SandboxStore } from './sandbox-store.js';
import type { KeyedQueue } from './serial.js';

export interface LifecycleParts {
  /** One change of a sandbox (or of a template, under `templateKey`) at a time. */
  readonly queue: KeyedQueue;
  readonly records: SandboxStore;
  readonly policies: SandboxPolicies;
  readonly runtime: SandboxRuntime;
  readonly table: EnforcementTable;
  /** Writes each sandbox's firewall in its network namespace (namespace enforcement only). */
  readonly kernel?: KernelEnforcer;
  /** The operator's bandwidth for sandboxes whose `network.bandwidth` leaves a direction out. */
  readonly bandwidthDefaults: Bandwidth;
  readonly sources: AddressPool;
  /** Other nodes sharing the store; absent for a Moat on its own. */
  readonly cluster?: ClusterMembership;
  readonly metrics: MoatMetrics;
  readonly logger: Logger;
  readonly now: () => number;
  /** The variables every process of the sandbox gets. */
  readonly environment: (record: SandboxRecord) => SandboxEnvironment;
  /** The team namespace of named snapshots (`<team namespace>/<alias>:<tag>`). */
  readonly teamNamespace: string;
  /** Workload identity is enabled: rules may name the sandbox's `iam` tokens. */
  readonly identity?: boolean;
  /** Counts a transition of the sandbox and logs it. */
  transition(record: SandboxRecord, what: string, details: object): void;
}
