/**
 * Moat's own listeners, out of reach of sandbox processes that share the host's network (proxy
 * enforcement): a table in the host's nftables refuses TCP from the sandboxes' host ids to the
 * platform API, the sandbox API and the metrics listener on any local address. Every sandbox
 * process runs as one of those ids (runtime/sandbox-ids.ts), so none of them can call another
 * sandbox's API or Moat's own; the DNS interceptor and the egress proxy stay open to them.
 *
 * Each function returns one nft transaction (one line: NftSession applies it whole).
 */

export interface ListenerGuard {
  /** The table (family inet) this Moat owns in the host namespace. */
  readonly table: string;
  /** Host uid range of the sandboxes (inclusive). */
  readonly ids: { readonly first: number; readonly last: number };
  /** TCP ports of the listeners sandboxes must not reach. */
  readonly ports: readonly number[];
}

export function listenerGuardRuleset(guard: ListenerGuard): string {
  const table = `inet ${guard.table}`;
  return [
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
