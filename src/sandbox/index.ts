/**
 * The sandbox lifecycle: records, the running/paused state machine, expiry, templates and
 * snapshots. It drives a runtime, stores through the store and publishes to the enforcement
 * table.
 */
export { SANDBOX_ID } from './ids.js';
export { InvalidTokenError, type Order, type Page, paginate } from './pages.js';
export { bandwidthOf } from './network-settings.js';
export { linkView, NETWORK_ONLY, networkOnlyRefusal } from './network-only.js';
export { IDENTITY_SETTING, JWT_SVID, MAX_AUDIENCE_LENGTH, MAX_IAM_TOKENS } from './iam.js';
export type {
  BandwidthSettings,
  IamSettings,
  NetworkSettings,
  SandboxRecord,
  SandboxState,
  SnapshotRecord,
} from './records.js';
export {
  type CreateRequest,
  DEFAULT_TIMEOUT,
  type EgressRules,
  type ForkResult,
  MAX_FORKS,
  notFound,
  SandboxError,
  type SandboxQuery,
  type SnapshotQuery,
  unlessNotFound,
} from './requests.js';
export { SandboxService, type SandboxServiceOptions } from './service.js';
export { SAMPLE_INTERVAL_MS, SAMPLES_KEPT, type UsageSample } from './usage-history.js';
export { sandboxEnvironment } from './environment.js';
