/**
 * Network changes another node stored: enforced here when announced on the cluster channel, all
 * of them again after the store was out of reach, and the records of nodes that are gone removed.
 */
import { isLocal, onLiveNode } from './membership.js';
import { bandwidthOf, storedUpstream } from './network-settings.js';
import type { LifecycleParts } from './parts.js';
import type { SandboxRecord } from './records.js';

/** What reloading uses of the lifecycle's parts. */
export interface ReloadContext extends Pick<
  LifecycleParts,
  | 'queue'
  | 'records'
  | 'policies'
  | 'table'
  | 'kernel'
  | 'bandwidthDefaults'
  | 'cluster'
  | 'logger'
  | 'transition'
> {
  /** The sandbox's record; undefined only when it is not found (a store outage throws). */
  find(sandboxID: string): Promise<SandboxRecord | undefined>;
  /** The sandboxes running on this node. */
  running(): string[];
  /** Ends what runs here of a sandbox whose record is gone. */
  end(sandboxID: string): Promise<void>;
}

export class ClusterReload {
  constructor(private readonly context: ReloadContext) {}

  /**
   * Enforces the stored network config of a sandbox this node hosts (another node stored it and
   * said so on the cluster channel). Returns false, with the reason logged, when there was
   * nothing to do; a store that cannot be read is an error, never "nothing to do".
   */
  reload(sandboxID: string): Promise<boolean> {
    const { queue, policies, table, kernel, logger } = this.context;
    const skip = (reason: string) => {
      logger.warn({ sandboxID, reason }, 'announced network change not applied here');
      return false;
    };
    return queue.run(sandboxID, async () => {
      const record = await this.context.find(sandboxID);
      if (record === undefined) return skip('no sandbox of a live node has this ID');
      if (record.state !== 'running') return skip('it is paused (resuming it applies the change)');
      if (!isLocal(this.context.cluster, record)) return skip(`node ${record.node} hosts it`);
      const policy = policies.stored(record);
      const upstream = storedUpstream(record);
      if (!table.publish(sandboxID, policy, upstream)) return skip('this node does not enforce it');
      await kernel?.enforce(sandboxID, policy, upstream).catch((error: Error) => {
        logger.error({ sandboxID, err: error.message }, 'firewall update failed');
      });
      await kernel
        ?.limitBandwidth(sandboxID, bandwidthOf(record.network, this.context.bandwidthDefaults))
        .catch((error: Error) => {
          logger.error({ sandboxID, err: error.message }, 'bandwidth update failed');
        });
      this.context.transition(record, 'network', { from: 'cluster' });
      return true;
    });
  }

  /**
   * After the store was out of reach: enforces again what it holds for every running sandbox
   * here (changes announced meanwhile were missed); sandboxes whose record is gone are ended.
   */
  async reloadAll(): Promise<void> {
    for (const sandboxID of this.context.running()) {
      if ((await this.context.records.get(sandboxID)) === undefined) {
        this.context.logger.warn(
          { sandboxID },
          'the store no longer holds this sandbox; ending it',
        );
        await this.context.end(sandboxID);
        continue;
      }
      await this.reload(sandboxID);
    }
  }

  /** Removes the records of sandboxes whose node is gone (its heartbeat lapsed). */
  async forgetGoneNodes(): Promise<string[]> {
    const { cluster, records, logger } = this.context;
    if (cluster === undefined) return [];
    const gone = (await records.all()).filter((record) => !onLiveNode(cluster, record));
    if (gone.length === 0) return [];
    await records.delete(gone.map((r) => r.sandboxID));
    for (const record of gone) {
      logger.warn(
        { sandboxID: record.sandboxID, node: record.node },
        'removed a sandbox whose node is gone',
      );
    }
    return gone.map((r) => r.sandboxID);
  }
}
