import type { HostAddresses } from '../../src/policy/index.js';

/**
 * The host as a Moat sees it whose origins are local servers on loopback: none of its addresses
 * is the host's, and a connection to one stays a destination like any other. For tests and
 * benchmarks that are not about the host (test/proxy/host.test.ts and test/netns/host.test.ts
 * are).
 */
export const LOOPBACK_IS_OUTSIDE: HostAddresses = Object.freeze({
  decide: () => undefined,
  reached: () => undefined,
});
