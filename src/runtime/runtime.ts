/**
 * What a sandbox is on this host. The lifecycle (src/sandbox) drives a runtime through this
 * interface and never touches files or processes itself.
 */
import type { ProcessTable } from './processes.js';

export type EnforcementMode = 'namespace' | 'proxy';

/** Variables every process of a sandbox gets (create `envVars`, proxy settings...). */
export type SandboxEnvironment = Readonly<Record<string, string>>;

export interface SandboxRuntime {
  /** How egress of this runtime's sandboxes is enforced. */
  readonly enforcement: EnforcementMode;
  /** Why that mode, for start-up output (e.g. why namespaces are unavailable). */
  readonly enforcementReason: string;
  /** Processes run in their own namespaces, seeing only the sandbox's root as writable. */
  readonly confined: boolean;
  /** How processes are confined, for start-up output. */
  readonly confinementReason: string;
  /**
   * Makes the sandbox's root from a template (`base` or a snapshot's key) and, in namespace
   * mode, its network namespace with `address` (its source address) on its link.
   */
  create(
    sandboxID: string,
    templateKey: string,
    env: SandboxEnvironment,
    address: string,
  ): Promise<void>;
  /** Takes back a sandbox whose root survived a restart (its processes did not). */
  restore(sandboxID: string, env: SandboxEnvironment, address: string): Promise<void>;
  pause(sandboxID: string): Promise<void>;
  resume(sandboxID: string): Promise<void>;
  /**
   * Ends every process of the sandbox and takes down its network namespace; the root stays, so
   * a later restore takes the sandbox back. Idempotent.
   */
  release(sandboxID: string): Promise<void>;
  /** Ends every process of the sandbox and removes its root. Idempotent. */
  destroy(sandboxID: string): Promise<void>;
  /** Copies the sandbox's writable root into the template store under `templateKey`. */
  snapshot(sandboxID: string, templateKey: string): Promise<void>;
  removeTemplate(templateKey: string): Promise<void>;
  /** Removes sandbox roots that no record names (left by a crash mid-create). */
  reconcile(known: ReadonlySet<string>): Promise<string[]>;
  /** Ends every sandbox's processes (Moat is stopping); roots stay for the next start. */
  stop(): Promise<void>;
  /** The sandbox's root folder and processes, while it exists on this host. */
  sandbox(sandboxID: string): RuntimeSandbox | undefined;
}

export interface RuntimeSandbox {
  readonly sandboxID: string;
  /** Host folder that is `/` of the sandbox's own view. */
  readonly root: string;
  /** Where its ports are reached from the host. */
  readonly address: string;
  readonly processes: ProcessTable;
  readonly env: SandboxEnvironment;
  /**
   * The TCP ports the sandbox's own processes listen on (from their sockets), where ingress
   * may go when the sandbox shares the host's network: nothing else of the host.
   */
  listeningPorts(): Promise<ReadonlySet<number>>;
}
