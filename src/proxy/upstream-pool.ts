import type net from 'node:net';
import type { UpstreamProxy } from '../enforce/index.js';
import type { IPAddress } from '../policy/index.js';
import type { Inbox } from './inbox.js';

/** How long an upstream connection may wait in the pool for its next request. */
const POOL_IDLE_MS = 30_000;

export interface Upstream {
  readonly socket: net.Socket;
  readonly inbox: Inbox;
  readonly ip: IPAddress;
  /** The upstream proxy it goes through (undefined: direct to `ip`). */
  readonly via?: UpstreamProxy;
  /** The name its TLS certificate was verified for (undefined: plain HTTP). */
  readonly tlsName?: string;
}

/** A pooled connection serves only requests for the same address, port and TLS name. */
const poolKey = (ip: IPAddress, port: number, tlsName: string | undefined) =>
  `${ip.text} ${port} ${tlsName ?? ''}`;

/** Idle origin connections kept for all sandboxes together. */
const MAX_IDLE_UPSTREAMS = 512;

/**
 * Idle keep-alive connections to origins, by sandbox and address: a connection only ever
 * carries requests of the sandbox that opened it, to the address it was dialled for (each
 * request is decided again before it is given one). Most recent first; an idle connection
 * that speaks, closes or idles out is dropped. A sandbox keeps at most its connection cap of
 * them, all sandboxes together MAX_IDLE_UPSTREAMS: past either, the oldest goes (idle
 * connections are not counted as the sandbox's open ones, so without a bound a sandbox could
 * hold one per port it may reach).
 */
export class UpstreamPool {
  private readonly bySandbox = new Map<string, Map<string, IdleUpstream[]>>();
  /** Every idle connection, oldest first; and each sandbox's. */
  private readonly all = new Set<IdleUpstream>();
  private readonly oldestBySandbox = new Map<string, Set<IdleUpstream>>();

  constructor(
    private readonly maxIdlePerSandbox: number,
    private readonly maxIdle = MAX_IDLE_UPSTREAMS,
  ) {}

  take(
    sandboxID: string,
    ip: IPAddress,
    port: number,
    tlsName: string | undefined,
  ): Upstream | undefined {
    const idle = this.bySandbox
      .get(sandboxID)
      ?.get(poolKey(ip, port, tlsName))
      ?.at(-1);
    if (idle === undefined) return undefined;
    this.forget(idle);
    const { socket, inbox } = idle.upstream;
    inbox.stop();
    socket.off('end', idle.drop).off('timeout', idle.drop).off('close', idle.drop);
    return idle.upstream;
  }

  put(sandboxID: string, port: number, upstream: Upstream): void {
    const { socket } = upstream;
    if (socket.destroyed) return;
    const ofSandbox = this.oldestBySandbox.get(sandboxID);
    if (ofSandbox !== undefined && ofSandbox.size >= this.maxIdlePerSandbox)
      ofSandbox.values().next().value?.drop();
    if (this.all.size >= this.maxIdle) this.all.values().next().value?.drop();
    const idle: IdleUpstream = {
      sandboxID,
      key: poolKey(upstream.ip, port, upstream.tlsName),
      upstream,
      drop: () => {
        socket.destroy();
        this.forget(idle);
      },
    };
    let byAddress = this.bySandbox.get(sandboxID);
    if (byAddress === undefined) this.bySandbox.set(sandboxID, (byAddress = new Map()));
    let list = byAddress.get(idle.key);
    if (list === undefined) byAddress.set(idle.key, (list = []));
    list.push(idle);
    let oldest = this.oldestBySandbox.get(sandboxID);
    if (oldest === undefined) this.oldestBySandbox.set(sandboxID, (oldest = new Set()));
    oldest.add(idle);
    this.all.add(idle);
    socket.setTimeout(POOL_IDLE_MS);
    // 'close' too: a reset destroys the socket without an 'end'.
    socket.on('end', idle.drop).on('timeout', idle.drop).on('close', idle.drop);
    // An origin has nothing to say between requests: bytes now mean a broken connection.
    upstream.inbox.read(() => {
      idle.drop();
      return 0;
    });
  }

  /** Closes every idle connection of a sandbox (its policy changed, or it is gone). */
  drop(sandboxID: string): void {
    for (const idle of [...(this.oldestBySandbox.get(sandboxID) ?? [])]) idle.drop();
  }

  closeAll(): void {
    for (const idle of [...this.all]) idle.drop();
  }

  /** Takes an idle connection out of every index (it is taken or dropped). */
  private forget(idle: IdleUpstream): void {
    if (!this.all.delete(idle)) return;
    const oldest = this.oldestBySandbox.get(idle.sandboxID)!;
    oldest.delete(idle);
    if (oldest.size === 0) this.oldestBySandbox.delete(idle.sandboxID);
    const byAddress = this.bySandbox.get(idle.sandboxID)!;
    const list = byAddress.get(idle.key)!;
    list.splice(list.indexOf(idle), 1);
    if (list.length > 0) return;
    byAddress.delete(idle.key);
    if (byAddress.size === 0) this.bySandbox.delete(idle.sandboxID);
  }
}

interface IdleUpstream {
  readonly sandboxID: string;
  readonly key: string;
  readonly upstream: Upstream;
  readonly drop: () => void;
}
