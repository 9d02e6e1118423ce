/** What a sandbox is on this host: its root folder and the processes started in it. */
export { bubblewrapWorks, DEFAULT_USER, type SandboxUser, USERS } from './confinement.js';
export { NamespaceNetwork, type NamespaceNetworkOptions, namespacesWork } from './network.js';
export { type ResolvedPath, resolveInSandbox, SandboxPathError, sandboxView } from './paths.js';
export { BASE_TEMPLATE, ProcessRuntime, type ProcessRuntimeOptions } from './process-runtime.js';
export {
  type OutputStream,
  type ProcessConfig,
  type ProcessEnd,
  type ProcessTable,
  type SandboxProcess,
  type StartRequest,
} from './processes.js';
export type {
  EnforcementMode,
  RuntimeSandbox,
  SandboxEnvironment,
  SandboxRuntime,
} from './runtime.js';
