/** Whether kernel enforcement can be tested here: root, iproute2, nftables and bubblewrap. */
import { bubblewrapWorks, namespacesWork } from '../../src/runtime/index.js';

/** Why namespace tests cannot run on this machine, printed once per suite; undefined when they can. */
export function namespaceSkipReason(suite: string): string | undefined {
  const namespaces = namespacesWork();
  const bwrap = bubblewrapWorks();
  const reason = !namespaces.ok ? namespaces.reason : !bwrap.ok ? bwrap.reason : undefined;
  if (reason !== undefined) console.warn(`${suite}: skipped: ${reason}`);
  return reason;
}

export { hostNetworkLines } from '../../bench/lib/world.js';
