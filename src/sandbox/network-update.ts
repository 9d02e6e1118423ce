/**
 * A running sandbox's egress rules replaced (PUT network): checked, stored, then enforced here,
 * or announced to the node that hosts it. Counted in `moat_policy_publishes_total{result}`.
 */
import type { UpstreamProxy } from '../enforce/index.js';
import type { Policy } from '../policy/index.js';
import { checkIdentityTokens } from './iam.js';
import { isLocal } from './membership.js';
import { bandwidthOf, storedRules, upstreamProxy } from './network-settings.js';
import type { LifecycleParts } from './parts.js';
import type { SandboxRecord } from './records.js';
import { type EgressRules, SandboxError } from './requests.js';

/** What a network update uses of the lifecycle's parts. */
export type NetworkUpdateContext = Pick<
  LifecycleParts,
  | 'records'
  | 'policies'
  | 'table'
  | 'kernel'
  | 'bandwidthDefaults'
  | 'cluster'
  | 'metrics'
  | 'logger'
  | 'transition'
  | 'identity'
>;

/**
 * Replaces the egress rules of the running sandbox of `record` (the caller holds its queue
 * slot): validated, stored, compiled and published before it returns.
 */
export async function updateNetwork(
  context: NetworkUpdateContext,
  record: SandboxRecord,
  rules: EgressRules,
): Promise<SandboxRecord> {
  const { metrics, cluster } = context;
  const sandboxID = record.sandboxID;
  let policy: Policy;
  let upstream: UpstreamProxy | undefined;
  // The proxy is no part of the policy (which decides), but of where allowed flows go; the
  // bandwidth is the link's.
  const { egressProxy, bandwidth, ...written } = rules;
  // A body without a mode keeps the sandbox's (the E2B SDK never sends one).
  const mode = rules.mode ?? record.network.mode;
  const policyRules = { ...written, ...(mode === undefined ? {} : { mode }) };
  try {
    policy = context.policies.compile(policyRules);
    upstream = upstreamProxy(egressProxy);
    checkIdentityTokens(policy, record.iam, context.identity === true);
    await context.policies.checkSecrets(policy);
  } catch (error) {
    metrics.policyPublishes.inc({ result: 'invalid' });
    throw error;
  }
  const next: SandboxRecord = {
    ...record,
    network: {
      ...record.network,
      allowOut: rules.allowOut ?? [],
      denyOut: rules.denyOut ?? [],
      allowInternetAccess: rules.allow_internet_access ?? null,
      egressProxy: egressProxy ?? null,
      // Replaced like every other field: a body without rules clears them.
      rules: undefined,
      ...storedRules(rules.rules),
      bandwidth,
      mode,
    },
  };
  try {
    await context.records.save(next);
  } catch (error) {
    metrics.policyPublishes.inc({ result: 'failed' });
    throw error;
  }
  if (!isLocal(cluster, next)) {
    // Stored; the node that hosts it hears of it on the cluster channel and enforces it.
    await cluster!
      .announce({ sandboxID, node: next.node!, sentAt: Date.now() })
      .catch((error: Error) => {
        metrics.policyPublishes.inc({ result: 'failed' });
        throw new SandboxError(
          503,
          `the new network config is stored, but the node ${next.node} that hosts the sandbox could not be told (${error.message}); it applies it when its connection to the store returns`,
        );
      });
    metrics.policyPublishes.inc({ result: 'applied' });
    context.transition(next, 'network', { node: next.node });
    return next;
  }
  context.table.publish(sandboxID, policy, upstream);
  try {
    await context.kernel?.enforce(sandboxID, policy, upstream);
    await context.kernel?.limitBandwidth(
      sandboxID,
      bandwidthOf(next.network, context.bandwidthDefaults),
    );
  } catch (error) {
    metrics.policyPublishes.inc({ result: 'failed' });
    context.logger.error({ sandboxID, err: (error as Error).message }, 'firewall update failed');
    throw new SandboxError(
      503,
      `the new network config is stored and Moat's DNS and proxy enforce it, but ${(error as Error).message}`,
    );
  }
  metrics.policyPublishes.inc({ result: 'applied' });
  context.transition(next, 'network', {
    allowOut: next.network.allowOut.length,
    denyOut: next.network.denyOut.length,
  });
  return next;
}
