import net from 'node:net';
import { type LoadedAddon, loadAddon } from '../process/index.js';
import type { Opener } from './dial.js';
import type { Checked, Splice, SpliceOptions, TunnelGuard } from './splice.js';

/**
 * How the explicit proxy accepts connections and carries CONNECT tunnels. `native`:
 * native/tcp_relay.c accepts, reads each client's first bytes, dials and relays on one epoll set,
 * calling into JavaScript only to decide; `node`: net.Server and net.Socket. Either way every
 * decision is made here in TypeScript, and a connection that is not a CONNECT whose head came
 * whole in its first bytes (and every refusal) is handed to Node as a net.Socket.
 */
export type TcpIo = 'native' | 'node';
/** `auto`: native where the addon is built and loads, else node. */
export type TcpIoSetting = 'auto' | 'node';

interface TcpRelayAddon {
  init(onEvent: (...event: RelayEvent) => void): void;
  listen(host: string, port: number, backlog: number, handshakeMs: number): [number, number];
  dial(ip: string, port: number): number;
  adopt(client: number): number;
  splice(
    client: number,
    upstream: number,
    idleMs: number,
    finishedIdleMs: number,
    watchClient: boolean,
    toClient?: Buffer,
  ): void;
  /** These three return false when the tunnel has closed (its CLOSED event is on its way). */
  watch(client: number, dir: Direction, on: boolean): boolean;
  send(client: number, dir: Direction, bytes: Buffer): boolean;
  end(client: number, dir: Direction): boolean;
  close(id: number): [number, number] | undefined;
  stats(): [number, number];
}

/** 0: client -> upstream, 1: upstream -> client (named by the side read from). */
type Direction = 0 | 1;

type RelayEvent = [
  type: number,
  id: number,
  a: number,
  b: number,
  c: number,
  bytes: Buffer | undefined,
  text: string | undefined,
];

const ACCEPTED = 1;
const CONNECTED = 2;
const DATA = 3;
const CLOSED = 4;
const OPENED = 5;
const GONE = 6;

/** A connection accepted natively, parked with its first bytes until it is spliced or adopted. */
export interface NativeClient {
  readonly id: number;
  /** Undefined only when the handshake time passed before any byte came. */
  readonly remoteAddress: string | undefined;
  /** The first read (empty: the handshake time passed with none). */
  readonly firstBytes: Buffer;
  /** Milliseconds between accept and those bytes. */
  readonly waitedMs: number;
}

export interface NativeListener {
  readonly port: number;
  close(): void;
}

/** What a native listener is told of each client, from accept to the relay letting it go. */
export interface NativeListenerHandlers {
  /**
   * A client was just accepted (nothing read yet): true keeps it, false has it closed with a
   * reset at once.
   */
  opened(id: number, remoteAddress: string | undefined): boolean;
  /** Its first bytes came (or the handshake time passed with none). */
  client(client: NativeClient): void;
  /** The relay no longer holds the client's descriptor (closed, or adopted by Node). */
  gone(id: number): void;
}

/** A connected upstream, parked until spliced (or closed). */
export interface NativeUpstream {
  readonly id: number;
}

interface TunnelHandlers {
  data(dir: Direction, bytes: Buffer): void;
  closed(up: number, down: number): void;
  /** Closes the tunnel after a defect in handling it. */
  abort(): void;
}

/** One per process (per worker): the addon keeps one epoll set for every listener and tunnel. */
export class NativeTcp {
  private readonly listeners = new Map<number, NativeListenerHandlers>();
  /** Clients kept at OPENED, until GONE: whom to tell. */
  private readonly openedBy = new Map<number, NativeListenerHandlers>();
  private readonly dials = new Map<number, (code: string | undefined, toSelf: boolean) => void>();
  private readonly tunnels = new Map<number, TunnelHandlers>();

  private readonly defectListeners = new Set<(error: unknown) => void>();

  constructor(private readonly addon: TcpRelayAddon) {
    addon.init((type, id, a, b, c, bytes, text) => {
      try {
        this.dispatch(type, id, a, b, c, bytes, text);
      } catch (error) {
        this.defect(id, error);
      }
    });
  }

  /**
   * A defect in handling one connection's event: that connection goes (through its tunnel's
   * owner, who counts and unregisters it), the process stays. Nothing here may throw: an
   * exception would end the process from inside the addon's callback.
   */
  private defect(id: number, error: unknown): void {
    const reported = error instanceof Error ? error : new Error(String(error));
    try {
      this.tunnels.get(id)?.abort();
    } catch {
      // The owner's own close failed: the socket is still closed below.
    }
    this.addon.close(id);
    for (const listener of this.defectListeners) {
      try {
        listener(reported);
      } catch {
        // A listener's failure must not end the process either.
      }
    }
    if (this.defectListeners.size === 0) process.emitWarning(reported);
  }

  /** Hears of exceptions thrown while handling the relay's events; returns the unsubscribe. */
  onDefect(listener: (error: unknown) => void): () => void {
    this.defectListeners.add(listener);
    return () => this.defectListeners.delete(listener);
  }

  private dispatch(...[type, id, a, b, c, bytes, text]: RelayEvent): void {
    if (type === OPENED) {
      const handlers = this.listeners.get(a);
      if (handlers?.opened(id, text) === true) this.openedBy.set(id, handlers);
      else this.addon.close(id);
    } else if (type === GONE) {
      const handlers = this.openedBy.get(id);
      this.openedBy.delete(id);
      handlers?.gone(id);
    } else if (type === ACCEPTED) {
      const firstBytes = bytes!;
      this.listeners.get(a)?.client({ id, remoteAddress: text, firstBytes, waitedMs: c });
      // A listener closed meanwhile: its client has no one to decide for it.
      if (!this.listeners.has(a)) this.addon.close(id);
    } else if (type === CONNECTED) {
      const done = this.dials.get(id);
      this.dials.delete(id);
      done?.(text, a === 1);
    } else if (type === DATA) {
      this.tunnels.get(id)?.data(a as Direction, bytes!);
    } else if (type === CLOSED) {
      const tunnel = this.tunnels.get(id);
      this.tunnels.delete(id);
      tunnel?.closed(a, b);
    }
  }

  /**
   * Listens on an IP address; `handlers` hear of each connection at accept, once its first
   * bytes are in (or `handshakeMs` passed with none), and when the relay lets it go.
   */
  listen(
    host: string,
    port: number,
    handshakeMs: number,
    handlers: NativeListenerHandlers,
  ): NativeListener {
    // Node's own default backlog.
    const [id, bound] = this.addon.listen(host, port, 511, handshakeMs);
    this.listeners.set(id, handlers);
    return {
      port: bound,
      close: () => {
        this.listeners.delete(id);
        this.addon.close(id);
      },
    };
  }

  /** Dials ip:port; fails with the error code (ECONNREFUSED, ...) as the message. */
  readonly dial: Opener<NativeUpstream> = (ip, port, done) => {
    let id: number;
    try {
      id = this.addon.dial(ip, port);
    } catch (error) {
      done(new Error((error as NodeJS.ErrnoException).code ?? (error as Error).message));
      return { abort: () => {} };
    }
    this.dials.set(id, (code, toSelf) =>
      code === undefined ? done(undefined, { id }, toSelf) : done(new Error(code)),
    );
    return {
      abort: () => {
        this.dials.delete(id);
        this.addon.close(id);
      },
    };
  };

  /** Hands a parked client to Node (to be answered or served there). */
  adopt(client: NativeClient): net.Socket {
    const fd = this.addon.adopt(client.id);
    const socket = new net.Socket({ fd, readable: true, writable: true, allowHalfOpen: true });
    // A reset before its new owner listens must not be an uncaught error.
    socket.on('error', () => socket.destroy());
    return socket;
  }

  /** Closes a parked client or upstream. */
  close(connection: NativeClient | NativeUpstream): void {
    this.addon.close(connection.id);
  }

  /**
   * Writes `toClient` (the CONNECT answer) and joins client and upstream as splice() does:
   * upstream -> client at once, client -> upstream from `release`, held bytes shown to `hold`.
   */
  splice(
    client: NativeClient,
    upstream: NativeUpstream,
    toClient: Buffer,
    options: SpliceOptions,
  ): Splice {
    return new NativeSplice(this.addon, this.tunnels, client, upstream, toClient, options);
  }

  /** Native sockets open, and bytes they hold waiting for a slow reader. */
  stats(): { sockets: number; pendingBytes: number } {
    const [sockets, pendingBytes] = this.addon.stats();
    return { sockets, pendingBytes };
  }
}

class NativeSplice implements Splice {
  private closed = false;
  private released = false;
  /** Client bytes that came before `release` with no `hold` to show them to. */
  private readonly held: Buffer[] = [];
  private clientEnded = false;
  private onHeld: ((chunk: Buffer) => void) | undefined;
  private onGone: (() => void) | undefined;
  private fromClient: ((chunk: Buffer) => Buffer | undefined) | undefined;
  private fromUpstream: ((chunk: Buffer) => void) | undefined;
  private guard: TunnelGuard | undefined;
  private upstreamWatched = false;
  /** The client ended while the guard held its bytes for the upstream's answer. */
  private endHeld = false;
  private readonly id: number;

  constructor(
    private readonly addon: TcpRelayAddon,
    private readonly tunnels: Map<number, TunnelHandlers>,
    client: NativeClient,
    upstream: NativeUpstream,
    toClient: Buffer,
    private readonly options: SpliceOptions,
  ) {
    this.id = client.id;
    // Client bytes are watched (shown here, not relayed) until released.
    addon.splice(
      client.id,
      upstream.id,
      options.idleTimeoutMs,
      options.finishedIdleMs ?? 10_000,
      true,
      toClient,
    );
    tunnels.set(this.id, {
      data: (dir, bytes) => this.data(dir, bytes),
      closed: (up, down) => this.finish(up, down),
      abort: () => this.close(),
    });
  }

  hold(onData: (chunk: Buffer) => void, onGone: () => void): () => void {
    this.onHeld = onData;
    this.onGone = onGone;
    return () => {
      this.onHeld = undefined;
      this.onGone = undefined;
    };
  }

  release(initial?: Buffer, guard?: TunnelGuard, refused?: (problem: string) => void): void {
    if (this.closed || this.released) return;
    this.released = true;
    const checked = (result: Checked): Buffer | undefined => {
      if ('pass' in result) return result.pass;
      refused?.(result.problem);
      this.close();
      return undefined;
    };
    this.guard = guard;
    if (guard !== undefined) this.fromClient = (chunk) => checked(guard.fromClient(chunk));
    if (guard?.fromUpstream !== undefined) {
      const fromUpstream = guard.fromUpstream.bind(guard);
      this.fromUpstream = (chunk) => {
        const held = checked(fromUpstream(chunk));
        if (held !== undefined && held.length > 0) this.addon.send(this.id, 0, held);
        if (this.endHeld && !this.closed) this.endUpstream();
      };
    }
    this.followGuard();
    for (const chunk of [initial ?? EMPTY, ...this.held.splice(0)]) this.toUpstream(chunk);
    if (this.closed) return;
    if (this.clientEnded) this.endUpstream();
    else if (guard === undefined) this.addon.watch(this.id, 0, false);
    this.followGuard();
  }

  /** Passes the client's end on; while the guard holds client bytes for an answer, after them. */
  private endUpstream(): void {
    this.endHeld = this.guard?.watchesUpstream === true;
    if (!this.endHeld) this.addon.end(this.id, 0);
  }

  /**
   * Shows the guard the bytes it asks for, after each of its calls. One that passes everything
   * from now on (a TLS handshake past its checks, a switch to WebSocket) sees no more: the rest
   * of the tunnel is relayed natively, spliced if it streams. Upstream bytes go to one only
   * while it watches them.
   */
  private followGuard(): void {
    const guard = this.guard;
    if (this.closed || guard === undefined) return;
    if (guard.done === true) {
      this.guard = this.fromClient = this.fromUpstream = undefined;
      if (!this.clientEnded) this.addon.watch(this.id, 0, false);
      if (this.upstreamWatched) this.addon.watch(this.id, 1, false);
      return;
    }
    const watch = this.fromUpstream !== undefined && guard.watchesUpstream === true;
    if (watch === this.upstreamWatched) return;
    this.upstreamWatched = watch;
    this.addon.watch(this.id, 1, watch);
  }

  close(): void {
    if (this.closed) return;
    const counts = this.addon.close(this.id);
    // Undefined: the relay closed it already, and its CLOSED event (with the counts) is queued.
    if (counts !== undefined) this.finish(counts[0], counts[1]);
  }

  /** Client bytes, through the guard when there is one. */
  private toUpstream(chunk: Buffer): void {
    if (this.closed || chunk.length === 0) return;
    const passed = this.fromClient === undefined ? chunk : this.fromClient(chunk);
    if (!this.closed && passed !== undefined && passed.length > 0)
      this.addon.send(this.id, 0, passed);
  }

  private data(dir: Direction, bytes: Buffer): void {
    if (this.closed) return;
    if (dir === 1) {
      if (bytes.length === 0) return void this.addon.end(this.id, 1);
      this.fromUpstream?.(bytes);
      if (!this.closed) this.addon.send(this.id, 1, bytes);
      return this.followGuard();
    }
    if (this.onHeld !== undefined) {
      // A held tunnel whose client ended has nothing to carry.
      if (bytes.length === 0) return this.gone();
      return this.onHeld(bytes);
    }
    if (!this.released) {
      if (bytes.length === 0) this.clientEnded = true;
      else this.held.push(bytes);
      return;
    }
    if (bytes.length === 0) return this.endUpstream();
    this.toUpstream(bytes);
    this.followGuard();
  }

  private finish(up: number, down: number): void {
    if (this.closed) return;
    this.closed = true;
    this.tunnels.delete(this.id);
    this.gone();
    this.options.onClose(up, down);
  }

  /** Tells hold()'s onGone, once. */
  private gone(): void {
    const onGone = this.onGone;
    this.onHeld = this.onGone = undefined;
    onGone?.();
  }
}

const EMPTY = Buffer.alloc(0);

let loaded: LoadedAddon<NativeTcp> | undefined;

function relay(): LoadedAddon<NativeTcp> {
  if (loaded !== undefined) return loaded;
  const found = loadAddon<TcpRelayAddon>(
    'moat_tcp_relay',
    'tcp_relay.c',
    'the native TCP relay (epoll)',
  );
  if ('problem' in found) return (loaded = found);
  try {
    loaded = { addon: new NativeTcp(found.addon) };
  } catch (error) {
    loaded = { problem: `the native TCP relay did not start: ${(error as Error).message}` };
  }
  return loaded;
}

/** The native relay for `setting`, or undefined (Node's sockets then). */
export function nativeTcp(setting: TcpIoSetting): NativeTcp | undefined {
  if (setting === 'node') return undefined;
  const found = relay();
  return 'addon' in found ? found.addon : undefined;
}

/** Why `auto` means node on this machine, or undefined when the native relay is available. */
export function nativeTcpUnavailable(): string | undefined {
  const found = relay();
  return 'problem' in found ? found.problem : undefined;
}
