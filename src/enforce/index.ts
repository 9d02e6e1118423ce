/**
 * The enforcement table: sandbox -> current compiled Policy, learned addresses and identities.
 * DNS and the proxy read it; the sandbox lifecycle writes it.
 */
export { AddressPool, type AddressPoolOptions } from './address-pool.js';
export { LearnedAddressTable } from './learned.js';
export {
  type EnforcedSandbox,
  type EnforcementEvent,
  EnforcementTable,
  type EnforcementTableOptions,
  type UpstreamProxy,
} from './table.js';
export {
  type Bandwidth,
  type KernelChange,
  KernelEnforcementError,
  KernelEnforcer,
  type KernelEnforcerOptions,
} from './kernel.js';
export {
  DNS_PORT,
  type KernelBudget,
  type KernelLayout,
  type LearnedElement,
  removeHostRuleset,
} from './kernel-rules.js';
export { HOST_REFRESH_MS, HostWatch, type HostWatchOptions } from './host-watch.js';
export {
  type ListenerGuard,
  listenerGuardRuleset,
  listenerGuardTable,
  overlappingListenerGuards,
  removeListenerGuard,
} from './listener-guard.js';
export {
  type BudgetedListener,
  ConnectionBudget,
  type ConnectionBudgetOptions,
  type ConnectionHold,
  type ConnectionRefusal,
} from './connection-budget.js';
