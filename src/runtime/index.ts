/** What a sandbox is on this host: its supervisor, its files and the processes started in it. */
export {
  AdoptRefused,
  type AdoptRequest,
  checkIfname,
  DEFAULT_IFNAME,
  devicesOf,
  GUEST_LINKS,
  type GuestLink,
  INNER_LINK,
  type NamespaceIdentity,
  uplinkOf,
} from './adoption.js';
export type { SandboxLimits } from './cgroups.js';
export { confinementWorks, DEFAULT_USER, type SandboxUser, USERS } from './confinement.js';
export { type DirectFlow, FLOW_LOG_GROUP } from './direct-flow-log.js';
export {
  MAX_BANDWIDTH_MBPS,
  NamespaceNetwork,
  type NamespaceNetworkOptions,
  namespacesWork,
  type SandboxConnection,
} from './network.js';
export { listNftTables, NftSession } from './nft-session.js';
export { BASE_TEMPLATE, ProcessRuntime, SandboxRefused } from './process-runtime.js';
export type { ProcessRuntimeOptions } from './process-runtime-options.js';
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
export { type IdRangeSetting, IDS_PER_SANDBOX } from './sandbox-ids.js';
export { RoleStalled } from './role-connection.js';
export type { KernelBudgets } from './supervisor-config.js';
export type { SandboxListeners } from './listening-ports.js';
export type { SandboxUsage } from './usage.js';
export {
  type EntryInfo,
  type FileEvent,
  type FileEventType,
  FileAgentError,
  type SandboxFiles,
  type WatchHandle,
} from './sandbox-files.js';
