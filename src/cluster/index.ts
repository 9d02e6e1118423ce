/**
 * Many nodes as one platform over a shared Redis: node heartbeats, placement, and the channel
 * that brings network changes to the node hosting the sandbox.
 */
export { Cluster, type ClusterOptions, type NodeInfo, type PolicyChange } from './cluster.js';
