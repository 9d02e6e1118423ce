/**
 * Moat's own listeners, out of reach of sandbox processes that share the host's network (proxy
 * enforcement): a table in the host's nftables refuses TCP from the sandboxes' host ids to the
 * platform API, the sandbox API and the metrics listener on any local address. Every sandbox
 * process runs as one of those ids (runtime/sandbox-ids.ts), so none of them can call another
 * sandbox's API or Moat's own; the DNS interceptor and the egress proxy stay open to them.
 *
 * The table is named by the id range it refuses. Whoever holds that range (a lock in /run/moat)
 * owns the table, so a table that a killed Moat left (naming ports since reused, perhaps by the
 * next holder's own egress proxy) is replaced by the next Moat that takes an overlapping range.
 *
 * Each function returns one nft transaction (one line: NftSession applies it whole).
 */

export interface IdRange {
  /** Host uid range of the sandboxes (inclusive). */
  readonly first: number;
  readonly last: number;
}

export interface ListenerGuard {
  readonly ids: IdRange;
  /** TCP ports of the listeners sandboxes must not reach. */
  readonly ports: readonly number[];
  /** Guard tables of dead Moats that overlap `ids` (overlappingListenerGuards). */
  readonly stale: readonly string[];
}

const PREFIX = 'moat_guard_';

/** The table (family inet) of the guard over `ids`. */
export const listenerGuardTable = (ids: IdRange): string => `${PREFIX}${ids.first}_${ids.last}`;

/**
 * The guard tables in `nft list tables` output whose id range overlaps `ids`, other than the
 * one for exactly `ids`: only a Moat that no longer holds its range can have left them.
 */
export function overlappingListenerGuards(listing: string, ids: IdRange): string[] {
  const own = listenerGuardTable(ids);
  const found: string[] = [];
  for (const match of listing.matchAll(/^table inet (moat_guard_(\d+)_(\d+))$/gm)) {
    const [, table, first, last] = match;
    if (table === own) continue;
    if (Number(first) <= ids.last && Number(last) >= ids.first) found.push(table!);
  }
  return found;
}

export function listenerGuardRuleset(guard: ListenerGuard): string {
  const table = `inet ${listenerGuardTable(guard.ids)}`;
  return [
    ...guard.stale.map((stale) => removeListenerGuard(stale)),
    // Declared first so that the delete never fails, then made anew: one atomic replacement.
    `add table ${table}`,
    `delete table ${table}`,
    `add table ${table}`,
    `add chain ${table} output { type filter hook output priority filter; policy accept; }`,
    `add rule ${table} output meta skuid ${guard.ids.first}-${guard.ids.last} fib daddr type local tcp dport { ${[...new Set(guard.ports)].join(', ')} } counter reject with tcp reset`,
  ].join('; ');
}

export function removeListenerGuard(table: string): string {
  return `add table inet ${table}; delete table inet ${table}`;
}
