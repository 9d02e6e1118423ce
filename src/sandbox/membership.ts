/** This node among the others sharing a store: which sandboxes are its, which nodes live. */
import type { SandboxRecord } from './records.js';

/** What the lifecycle needs to know of the other nodes of a platform. */
export interface ClusterMembership {
  readonly self: string;
  /** The node has a live heartbeat. */
  alive(node: string): boolean;
  /** Tells the node hosting `sandboxID` that its network config changed in the store. */
  announce(change: { sandboxID: string; node: string; sentAt: number }): Promise<void>;
}

/** The sandbox is this node's (always, for a Moat on its own). */
export const isLocal = (cluster: ClusterMembership | undefined, record: SandboxRecord): boolean =>
  cluster === undefined || record.node === undefined || record.node === cluster.self;

/** The sandbox's node still sends heartbeats (a sandbox of a gone node is gone with it). */
export const onLiveNode = (cluster: ClusterMembership | undefined, record: SandboxRecord) =>
  isLocal(cluster, record) || cluster!.alive(record.node!);

/** The `node` field of a record made here: absent for a Moat on its own. */
export const madeHere = (cluster: ClusterMembership | undefined): { node?: string } =>
  cluster ? { node: cluster.self } : {};
