/**
 * What a sandbox is on this host. The lifecycle (src/sandbox) drives a runtime through this
 * interface and never touches files or processes itself.
 */
import type { AdoptRequest, NamespaceIdentity } from './adoption.js';
import type { SandboxListeners } from './listening-ports.js';
import type { SandboxLimits } from './cgroups.js';
import type { ProcessTable } from './processes.js';
import type { SandboxFiles } from './sandbox-files.js';
import type { SandboxUsage } from './usage.js';

export type EnforcementMode = 'namespace' | 'proxy';

/** Variables every process of a sandbox gets (create `envVars`, proxy settings...). */
export type SandboxEnvironment = Readonly<Record<string, string>>;

export interface SandboxRuntime {
  /** How egress of this runtime's sandboxes is enforced. */
  readonly enforcement: EnforcementMode;
  /** Why that mode, for start-up output (e.g. why namespaces are unavailable). */
  readonly enforcementReason: string;
  /** Sandboxes are confined (their own namespaces, ids, file system, seccomp filter, limits). */
  readonly confined: boolean;
  /** How sandboxes are confined, or why they are not (and whether they are refused). */
  readonly confinementReason: string;
  /**
   * Variables naming the CA bundle sandboxes trust (the host's and Moat's CA), for every
   * sandbox's environment: NODE_EXTRA_CA_CERTS, SSL_CERT_FILE... Empty when Moat adds no CA.
   */
  readonly trustEnvironment: SandboxEnvironment;
  /** The host uids (and gids) every sandbox process runs as: undefined when unconfined. */
  readonly sandboxHostIds: { readonly first: number; readonly last: number } | undefined;
  /**
   * Makes the sandbox from a template (`base` or a snapshot's key) and starts its supervisor;
   * in namespace mode with its own network namespace and `address` (its source address).
   */
  create(
    sandboxID: string,
    templateKey: string,
    env: SandboxEnvironment,
    address: string,
    limits: SandboxLimits,
  ): Promise<void>;
  /** Takes back a sandbox whose files survived a restart (its processes did not). */
  restore(
    sandboxID: string,
    env: SandboxEnvironment,
    address: string,
    limits: SandboxLimits,
  ): Promise<void>;
  /**
   * Makes a network-only sandbox: adopts the existing network namespace `request.netns` names
   * (namespace mode only), with a link whose end in it is `request.ifname` and `address` its
   * source address. With `expected` (a restart), only that namespace is adopted. Refuses
   * (AdoptRefused) what cannot be adopted, changing nothing. `release` and `destroy` detach it:
   * the namespace stays, Moat's link and firewall in it go. It has no processes and no files
   * (`sandbox()` knows it not).
   */
  adopt(
    sandboxID: string,
    request: AdoptRequest,
    address: string,
    expected?: NamespaceIdentity,
  ): Promise<NamespaceIdentity>;
  /** The adopted namespaces whose path no longer names them, each with why. */
  lostNamespaces(): Promise<Map<string, string>>;
  pause(sandboxID: string): Promise<void>;
  resume(sandboxID: string): Promise<void>;
  /**
   * Ends every process of the sandbox and takes down its network namespace; its files stay, so
   * a later restore takes the sandbox back. Idempotent.
   */
  release(sandboxID: string): Promise<void>;
  /** Ends every process of the sandbox and removes its files. Idempotent. */
  destroy(sandboxID: string): Promise<void>;
  /** Copies the sandbox's files into the template store under `templateKey`. */
  snapshot(sandboxID: string, templateKey: string): Promise<void>;
  removeTemplate(templateKey: string): Promise<void>;
  /**
   * Removes sandboxes that no record names (left by a crash mid-create), and templates whose
   * snapshot no record names (a crash between taking it and recording it). Returns the sandboxes.
   */
  reconcile(known: ReadonlySet<string>, knownTemplates: ReadonlySet<string>): Promise<string[]>;
  /** Ends every sandbox's processes (Moat is stopping); files stay for the next start. */
  stop(): Promise<void>;
  /** The sandbox's processes and files, while it runs on this host. */
  sandbox(sandboxID: string): RuntimeSandbox | undefined;
}

export interface RuntimeSandbox {
  readonly sandboxID: string;
  /** Where its ports are reached from the host. */
  readonly address: string;
  readonly processes: ProcessTable;
  /** Its files, as its own users reach them (every operation runs inside the sandbox). */
  readonly files: SandboxFiles;
  readonly env: SandboxEnvironment;
  readonly limits: SandboxLimits;
  readonly confined: boolean;
  /** Host pids of every process of the sandbox (its supervisor's included). */
  processIds(): Promise<number[]>;
  /**
   * The TCP ports the sandbox's own sockets listen on, each with the address to dial it at,
   * where ingress may go when the sandbox shares the host's network: nothing else of the host.
   */
  listeningPorts(): Promise<SandboxListeners>;
  /** What it uses now: CPU time, memory, disk. */
  usage(): Promise<SandboxUsage>;
}
