import type net from 'node:net';
import type { UpstreamProxy } from '../enforce/index.js';
import type { IPAddress } from '../policy/index.js';
import { Inbox } from './inbox.js';

/** How long an upstream connection may wait in the pool for its next request. */
const POOL_IDLE_MS = 30_000;

/** What hears an origin connection's events: the exchange using it, or the pool holding it. */
export interface UpstreamHolder {
  upstreamTimeout(): void;
  upstreamEnd(): void;
  upstreamClose(): void;
}

/**
 * A connection to an origin. Its listeners are set once, when it is made, and call whoever
 * holds it now: handing it between the pool and an exchange (on every keep-alive request) is
 * one assignment instead of listeners added and removed on both sides.
 */
export class Upstream {
  readonly inbox: Inbox;
  holder: UpstreamHolder | undefined;
  /** Where the pool files it (its address, port and TLS name never change). */
  readonly poolKey: string;

  constructor(
    readonly socket: net.Socket,
    readonly ip: IPAddress,
    port: number,
    /** The upstream proxy it goes through (undefined: direct to `ip`). */
    readonly via: UpstreamProxy | undefined,
    /** The name its TLS certificate was verified for (undefined: plain HTTP). */
    readonly tlsName: string | undefined,
  ) {
    this.inbox = new Inbox(socket);
    this.poolKey = poolKey(ip, port, tlsName);
    // 'close' too: a reset destroys the socket without an 'end'.
    socket
      .on('timeout', () => this.holder?.upstreamTimeout())
      .on('end', () => this.holder?.upstreamEnd())
      .on('close', () => this.holder?.upstreamClose());
  }
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
    const { upstream } = idle;
    // The exchange taking it reads its response head at once.
    upstream.inbox.handOver();
    upstream.holder = undefined;
    return upstream;
  }

  put(sandboxID: string, upstream: Upstream): void {
    const { socket } = upstream;
    if (socket.destroyed) return;
    const ofSandbox = this.oldestBySandbox.get(sandboxID);
    if (ofSandbox !== undefined && ofSandbox.size >= this.maxIdlePerSandbox)
      ofSandbox.values().next().value?.drop();
    if (this.all.size >= this.maxIdle) this.all.values().next().value?.drop();
    const idle = new IdleUpstream(sandboxID, upstream, (gone) => this.forget(gone));
    let byAddress = this.bySandbox.get(sandboxID);
    if (byAddress === undefined) this.bySandbox.set(sandboxID, (byAddress = new Map()));
    let list = byAddress.get(upstream.poolKey);
    if (list === undefined) byAddress.set(upstream.poolKey, (list = []));
    list.push(idle);
    let oldest = this.oldestBySandbox.get(sandboxID);
    if (oldest === undefined) this.oldestBySandbox.set(sandboxID, (oldest = new Set()));
    oldest.add(idle);
    this.all.add(idle);
    socket.setTimeout(POOL_IDLE_MS);
    upstream.holder = idle;
    // An origin has nothing to say between requests: bytes now mean a broken connection.
    upstream.inbox.read(idle.spoke);
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
    const { poolKey } = idle.upstream;
    const list = byAddress.get(poolKey)!;
    list.splice(list.indexOf(idle), 1);
    if (list.length > 0) return;
    byAddress.delete(poolKey);
    if (byAddress.size === 0) this.bySandbox.delete(idle.sandboxID);
  }
}

/** A connection waiting in the pool: whatever it does there (speak, end, close, idle out) drops it. */
class IdleUpstream implements UpstreamHolder {
  constructor(
    readonly sandboxID: string,
    readonly upstream: Upstream,
    private readonly forget: (idle: IdleUpstream) => void,
  ) {}

  readonly drop = (): void => {
    this.upstream.socket.destroy();
    this.forget(this);
  };

  readonly spoke = (): number => {
    this.drop();
    return 0;
  };

  upstreamTimeout(): void {
    this.drop();
  }

  upstreamEnd(): void {
    this.drop();
  }

  upstreamClose(): void {
    this.drop();
  }
}
