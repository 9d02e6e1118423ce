/**
 * Many Moat nodes as one platform, over the Redis they share as store: each node announces
 * itself with a heartbeat key that expires, and network changes are announced on a channel so
 * that the node hosting the sandbox recompiles at once.
 *
 * Requests for a sandbox that another node hosts are carried out by that node: the API forwards
 * them over HTTP to the owner's platform API (see src/api/server.ts). Forwarding, rather than a
 * command queue in Redis, keeps one code path for every request (the owner runs the same
 * handler with the same validation and errors), needs no reply protocol of our own, and leaves
 * Redis as the store and message bus it is good at. Network changes are the exception: any
 * node stores them and the channel brings them to the owner, so a change accepted anywhere is
 * enforced within milliseconds even while the owner is busy.
 */
import type { Redis } from 'ioredis';
import type { HostPort } from '../net/index.js';

export interface NodeInfo {
  readonly id: string;
  /** host:port of its platform API, for forwarded requests. */
  readonly api: string;
  /** Its sandbox listener (sandbox API and ingress), for relayed requests. */
  readonly sandbox: HostPort;
  /** host:port of its egress proxy, where its sandboxes' explicit proxy traffic goes. */
  readonly proxy: string;
  readonly hostsSandboxes: boolean;
  /** Sandboxes it holds (placement prefers the emptiest). */
  readonly sandboxes: number;
}

export interface PolicyChange {
  readonly sandboxID: string;
  /** The node that hosts the sandbox (only it acts on the message). */
  readonly node: string;
  /** When the change was stored, ms since the epoch (for the propagation delay). */
  readonly sentAt: number;
}

/** A secret was created, updated or deleted (every node but the sender drops its copies). */
interface SecretsChange {
  readonly secrets: true;
  /** The node that made the change. */
  readonly node: string;
  readonly sentAt: number;
}

export interface ClusterOptions {
  readonly client: Redis;
  readonly prefix: string;
  readonly self: Omit<NodeInfo, 'sandboxes'>;
  readonly ttlMs: number;
  /** Sandboxes this node holds now (sent with each heartbeat). */
  readonly sandboxCount: () => number;
  /** A change for a sandbox this node hosts. */
  readonly onPolicyChange: (change: PolicyChange) => void;
  /** Another node changed a secret (this node's decrypted copies are out of date). */
  readonly onSecretsChange: () => void;
  /** The channel is back after an outage: changes may have been missed. */
  readonly onReconnect: () => void;
  /** Nodes whose heartbeat lapsed since the last look. */
  readonly onNodesGone: (ids: string[]) => void;
  readonly onError: (error: Error) => void;
}

export class Cluster {
  private view = new Map<string, NodeInfo>();
  private timer: NodeJS.Timeout | undefined;
  private readonly subscriber: Redis;
  private subscribedOnce = false;

  constructor(private readonly options: ClusterOptions) {
    // Its own connection: a subscribed connection can do nothing else, must not time out while
    // no message comes, and may queue its SUBSCRIBE until it is connected. It subscribes again
    // itself after a reconnection ('ready' below): ioredis's own resubscription drops its
    // promise, so a connection closed before the reply (a Redis going away again, or Moat
    // stopping) rejected it unhandled, which ends the process.
    this.subscriber = options.client.duplicate({
      socketTimeout: undefined,
      enableOfflineQueue: true,
      autoResubscribe: false,
    });
    this.subscriber.on('error', (error: Error) => options.onError(error));
  }

  get self(): string {
    return this.options.self.id;
  }

  private get channel(): string {
    return `${this.options.prefix}policy`;
  }

  private nodeKey(id: string): string {
    return `${this.options.prefix}node:${id}`;
  }

  /** Announces this node, learns the others and starts listening for changes. */
  async start(): Promise<void> {
    this.subscriber.on('message', (_channel: string, text: string) => {
      let change: PolicyChange | SecretsChange;
      try {
        change = JSON.parse(text) as PolicyChange | SecretsChange;
      } catch {
        return;
      }
      if ('secrets' in change) {
        if (change.node !== this.self) this.options.onSecretsChange();
      } else if (change.node === this.self && typeof change.sandboxID === 'string') {
        this.options.onPolicyChange(change);
      }
    });
    // Either connection coming back may be the later one: each ready after an outage asks for a
    // reload (the caller retries until the store answers, and runs one at a time).
    this.subscriber.on('ready', () => {
      if (this.subscribedOnce) {
        this.subscriber
          .subscribe(this.channel)
          .catch((error: Error) => this.options.onError(error));
        this.options.onReconnect();
      }
      this.subscribedOnce = true;
    });
    this.options.client.on('ready', () => this.options.onReconnect());
    await this.subscriber.subscribe(this.channel);
    this.subscribedOnce = true;
    await this.beat();
    this.timer = setInterval(
      () => void this.beat().catch((error: Error) => this.options.onError(error)),
      Math.max(100, Math.floor(this.options.ttlMs / 3)),
    );
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.options.client.del(this.nodeKey(this.self)).catch(() => undefined);
    this.subscriber.disconnect();
  }

  /** Nodes with a live heartbeat, as last seen (this node included). */
  nodes(): NodeInfo[] {
    return [...this.view.values()];
  }

  alive(id: string): boolean {
    return id === this.self || this.view.has(id);
  }

  /**
   * The node as it announces itself now (read from the store, not the view: a node that
   * restarted may listen elsewhere); undefined when its heartbeat has lapsed.
   */
  async locate(id: string): Promise<NodeInfo | undefined> {
    const value = await this.options.client.get(this.nodeKey(id));
    if (value === null) return undefined;
    try {
      return JSON.parse(value) as NodeInfo;
    } catch {
      return undefined;
    }
  }

  /** Where a new sandbox goes: the live node hosting the fewest, this one on a tie. */
  place(): NodeInfo | undefined {
    const hosts = this.nodes().filter((n) => n.hostsSandboxes);
    hosts.sort(
      (a, b) =>
        a.sandboxes - b.sandboxes ||
        Number(b.id === this.self) - Number(a.id === this.self) ||
        a.id.localeCompare(b.id),
    );
    return hosts[0];
  }

  /** Tells the sandbox's node that its network config changed (it reads the store). */
  async announce(change: PolicyChange): Promise<void> {
    await this.options.client.publish(this.channel, JSON.stringify(change));
  }

  /** Tells every other node that this one changed a secret. */
  async announceSecretsChange(): Promise<void> {
    const change: SecretsChange = { secrets: true, node: this.self, sentAt: Date.now() };
    await this.options.client.publish(this.channel, JSON.stringify(change));
  }

  /** Refreshes this node's heartbeat and the view of the others. */
  private async beat(): Promise<void> {
    const { client, self, ttlMs } = this.options;
    const mine: NodeInfo = { ...self, sandboxes: this.options.sandboxCount() };
    await client.set(this.nodeKey(self.id), JSON.stringify(mine), 'PX', ttlMs);
    const keys: string[] = [];
    let cursor = '0';
    do {
      const [next, batch] = await client.scan(cursor, 'MATCH', this.nodeKey('*'), 'COUNT', 100);
      cursor = next;
      keys.push(...batch);
    } while (cursor !== '0');
    const values = keys.length ? await client.mget(...keys) : [];
    const view = new Map<string, NodeInfo>();
    for (const value of values) {
      if (value === null) continue;
      try {
        const node = JSON.parse(value) as NodeInfo;
        view.set(node.id, node);
      } catch {
        // Not one of ours; ignored.
      }
    }
    view.set(self.id, mine);
    const gone = [...this.view.keys()].filter((id) => !view.has(id));
    this.view = view;
    if (gone.length > 0) this.options.onNodesGone(gone);
  }
}
