/** What a sandbox is on this host: its root folder and (with the runtime issue) its processes. */
export { BASE_TEMPLATE, ProcessRuntime } from './process-runtime.js';
export type { EnforcementMode, SandboxRuntime } from './runtime.js';
