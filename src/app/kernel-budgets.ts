/**
 * The connection budgets each namespaced sandbox's firewall enforces (new connections per
 * second, connections held open) are refused in the kernel, where Moat sees no packet. Their
 * named counters are read here on a timer, through each sandbox's nft session (no cost per
 * packet, one short command per sandbox per round), and what grew is counted in
 * `moat_budget_refusals_total{resource}` and logged once per sandbox per round.
 */
import type { Logger } from 'pino';
import type { KernelBudget, KernelEnforcer } from '../enforce/index.js';
import type { MoatMetrics } from '../metrics/index.js';
import type { NamespaceNetwork } from '../runtime/index.js';

/** How often the counters are read: also the most often a sandbox's refusals are logged. */
export const KERNEL_BUDGET_READ_MS = 5000;

const WHAT: Record<KernelBudget, string> = {
  new_connections: 'new connections over its rate',
  tracked_connections: 'new connections over its count of open ones',
};

export function watchKernelBudgets(
  network: NamespaceNetwork,
  kernel: KernelEnforcer,
  parts: { readonly logger: Logger; readonly metrics: MoatMetrics },
  everyMs = KERNEL_BUDGET_READ_MS,
): { stop(): void } {
  /** Each sandbox's counters as last read. */
  const seen = new Map<string, Record<KernelBudget, number>>();
  let reading: Promise<void> | undefined;
  const readAll = async () => {
    const present = new Set(network.sandboxes());
    for (const sandboxID of seen.keys()) if (!present.has(sandboxID)) seen.delete(sandboxID);
    for (const sandboxID of present) {
      const now = await kernel.refusals(sandboxID).catch(() => undefined);
      // A sandbox going away, or being set up: read at the next round.
      if (now === undefined) continue;
      const before = seen.get(sandboxID);
      seen.set(sandboxID, now);
      for (const resource of Object.keys(now) as KernelBudget[]) {
        // A firewall written anew (a restore) starts its counters at 0 again.
        const last = before?.[resource] ?? 0;
        const grown = now[resource] >= last ? now[resource] - last : now[resource];
        if (grown === 0) continue;
        parts.metrics.budgetRefusals.inc({ resource }, grown);
        parts.logger.warn(
          { sandboxID, resource, refused: grown, seconds: everyMs / 1000 },
          `sandbox over its budget: its firewall refused ${WHAT[resource]}`,
        );
      }
    }
  };
  // A round still reading (many sandboxes, a slow nft) is not started over.
  const timer = setInterval(() => {
    reading ??= readAll().finally(() => (reading = undefined));
  }, everyMs);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
