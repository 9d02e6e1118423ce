/**
 * What a sandbox is on this host. The lifecycle (src/sandbox) drives a runtime through this
 * interface and never touches files or processes itself.
 */
export type EnforcementMode = 'namespace' | 'proxy';

export interface SandboxRuntime {
  /** How egress of this runtime's sandboxes is enforced. */
  readonly enforcement: EnforcementMode;
  /** Why that mode, for start-up output (e.g. why namespaces are unavailable). */
  readonly enforcementReason: string;
  /** Makes the sandbox's root from a template (`base` or a snapshot's key). */
  create(sandboxID: string, templateKey: string): Promise<void>;
  pause(sandboxID: string): Promise<void>;
  resume(sandboxID: string): Promise<void>;
  /** Ends everything of the sandbox and removes its root. Idempotent. */
  destroy(sandboxID: string): Promise<void>;
  /** Copies the sandbox's writable root into the template store under `templateKey`. */
  snapshot(sandboxID: string, templateKey: string): Promise<void>;
  removeTemplate(templateKey: string): Promise<void>;
  /** Removes sandbox roots that no record names (left by a crash mid-create). */
  reconcile(known: ReadonlySet<string>): Promise<string[]>;
}
