/** This Moat as one node of many sharing a Redis store: joining, and routing requests. */
import type { Logger } from 'pino';
import type { ApiRouting } from '../api/index.js';
import { Cluster, type NodeInfo } from '../cluster/index.js';
import type { MoatConfig } from '../config.js';
import { formatHostPort, type HostPort } from '../net/index.js';
import type { MoatMetrics } from '../metrics/index.js';
import {
  NETWORK_ONLY,
  notFound,
  SANDBOX_ID,
  SandboxError,
  type SandboxService,
  unlessNotFound,
} from '../sandbox/index.js';
import type { SecretVault } from '../secrets/index.js';
import type { RedisStore } from '../store/index.js';
import type { Listening } from './listeners.js';
import { RetryingTask } from './retrying-task.js';

/**
 * The live node hosting a sandbox; undefined when it is this one. A 404 when the sandbox does not
 * exist or its node is gone, a 503 when the store or the node registry cannot be read.
 */
async function hostOf(
  self: string,
  cluster: Cluster,
  sandboxes: SandboxService,
  sandboxID: string,
): Promise<NodeInfo | undefined> {
  const node = await sandboxes.nodeOf(sandboxID);
  if (node === self) return undefined;
  const info = await cluster.locate(node).catch((error: Error) => {
    throw new SandboxError(503, `cannot find the node ${node}: ${error.message}`);
  });
  // Its heartbeat lapsed a moment ago: the sandbox is gone with it.
  if (info === undefined) throw notFound(sandboxID);
  return info;
}

/**
 * The sandbox listener of the node hosting a sandbox that is not here (undefined when no live
 * node hosts it): where the sandbox listener relays its requests. A store or node registry that
 * cannot be read is an error (the listener answers 503), not "the sandbox is not running".
 */
export function sandboxListenerOf(
  self: string,
  cluster: () => Cluster | undefined,
  sandboxes: SandboxService,
): (sandboxID: string) => Promise<HostPort | undefined> {
  return async (sandboxID) => {
    const joined = cluster();
    if (joined === undefined || !SANDBOX_ID.test(sandboxID)) return undefined;
    return (await unlessNotFound(hostOf(self, joined, sandboxes, sandboxID)))?.sandbox;
  };
}

/** Requests for sandboxes hosted elsewhere go to their node; new sandboxes to the emptiest. */
export function routingFor(
  self: string,
  cluster: () => Cluster,
  sandboxes: SandboxService,
): ApiRouting {
  return {
    self,
    async ownerOf(sandboxID) {
      return (await hostOf(self, cluster(), sandboxes, sandboxID))?.api;
    },
    async placement(templateID) {
      // A network-only sandbox's namespace is a path on the host that was asked: it stays here.
      if (templateID === NETWORK_ONLY) return undefined;
      // A snapshot's files are on the node that took it; anything else goes to the emptiest.
      const holder = await sandboxes.templateNode(templateID);
      if (holder !== undefined) {
        if (holder === self) return undefined;
        const info = await cluster().locate(holder);
        if (info === undefined)
          throw new SandboxError(
            503,
            `template "${templateID}" is on node ${holder}, which is not running`,
          );
        return info.api;
      }
      const target = cluster().place();
      if (target === undefined) throw new SandboxError(503, 'no live node hosts sandboxes');
      return target.id === self ? undefined : target.api;
    },
  };
}

export interface ClusterParts {
  readonly config: MoatConfig;
  readonly logger: Logger;
  readonly metrics: MoatMetrics;
  readonly listening: Listening;
  readonly sandboxes: SandboxService;
  readonly secrets: SecretVault;
}

/** Announces this node and acts on what the others announce. */
export async function joinCluster(
  store: RedisStore,
  self: string,
  parts: ClusterParts,
): Promise<Cluster> {
  const { config, logger, metrics, listening, sandboxes, secrets } = parts;
  const reload = new RetryingTask(
    async () => {
      await sandboxes.reloadAll();
      logger.info('store connection back; enforcing what it holds again');
    },
    (error) => logger.warn({ err: error.message }, 'reloading from the store failed; trying again'),
  );
  const cluster = new Cluster({
    client: store.client,
    prefix: config.storePrefix,
    self: {
      id: self,
      api: formatHostPort(config.advertiseApi ?? listening.api),
      // Relayed sandbox API and ingress requests come here.
      sandbox: listening.sandbox,
      proxy: formatHostPort(listening.proxy),
      hostsSandboxes: config.hostsSandboxes,
    },
    ttlMs: config.nodeTtlMs,
    sandboxCount: () => sandboxes.hostedCount,
    onPolicyChange: (change) => {
      void sandboxes.reload(change.sandboxID).then(
        (applied) => {
          if (applied)
            metrics.policyPropagation.observe(Math.max(0, Date.now() - change.sentAt) / 1000);
        },
        (error: Error) =>
          logger.error(
            { sandboxID: change.sandboxID, err: error.message },
            'network change not applied',
          ),
      );
    },
    onSecretsChange: () => secrets.invalidate(),
    onReconnect: () => {
      // Secrets changed while the channel was down went unannounced.
      secrets.invalidate();
      reload.request();
    },
    onNodesGone: (ids) => {
      logger.warn({ nodes: ids }, 'nodes stopped sending heartbeats; their sandboxes are gone');
      void sandboxes
        .forgetGoneNodes()
        .catch((error: Error) =>
          logger.error({ err: error.message }, 'removing the sandboxes of gone nodes failed'),
        );
    },
    onError: (error) => logger.warn({ err: error.message }, 'cluster channel'),
  });
  await cluster.start();
  metrics.countNodesWith(() => cluster.nodes().length);
  return cluster;
}
