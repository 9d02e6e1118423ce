import net from 'node:net';
import type { Logger } from 'pino';
import { ListenerGroup } from '../dns/index.js';
import type { ConnectionHold, EnforcedSandbox } from '../enforce/index.js';
import type { ProxyKind, ProxyVerdict } from '../metrics/index.js';
import { type Decision, formatDestination, parseAuthority } from '../policy/index.js';
import { type Refusal, removed, type Target } from './dial.js';
import {
  ClientConnection,
  type ConnectionDeadlines,
  type RequestHandler,
  requestTurn,
} from './client-connection.js';
import { type ConnectClient, nativeConnectClient, nodeClient, TunnelOpener } from './connect.js';
import { Exchange, type ExchangeContext } from './exchange.js';
import { UpstreamPool } from './upstream-pool.js';
import {
  fieldValues,
  headEnd,
  MAX_REQUEST_HEAD_BYTES,
  parseRequestHead,
  type RequestHead,
} from './http1.js';
import { type Identity, identify } from './identity.js';
import {
  type NativeClient,
  type NativeListener,
  type NativeTcp,
  nativeTcp,
  nativeTcpUnavailable,
  type TcpIo,
} from './native-tcp.js';
import { Interceptor } from './intercept.js';
import type { ProxyOptions } from './options.js';
import { flowAsk } from './tunnels.js';
import type { HostPort } from '../net/index.js';

/** Where a proxy listener binds. */
export type ProxyListen = HostPort;

/** The interceptor of a proxy whose options ask for one. */
export function interceptorFor(options: ProxyOptions): Interceptor | undefined {
  const { injection } = options;
  return injection === undefined ? undefined : new Interceptor({ ...options, injection });
}

/**
 * The explicit egress proxy: `CONNECT host:port` and absolute-form HTTP (`GET http://host/`),
 * each request on a keep-alive connection decided on its own. Request heads are read by Moat's
 * own strict HTTP/1.1 code (src/proxy/http1.ts), which is also what lets a forwarded request
 * reach its origin as one write and its answer come back as one.
 */
export class EgressProxy implements RequestHandler {
  private readonly server: net.Server;
  private readonly listeners: ListenerGroup;
  private readonly pool: UpstreamPool;
  private readonly sockets = new Set<net.Socket>();
  /** The native relay, when it carries this proxy's connections (tcpIo). */
  private readonly native: NativeTcp | undefined;
  private readonly nativeListeners: NativeListener[] = [];
  /** Native clients being decided or carrying a tunnel (adopted ones are in `sockets`). */
  private readonly nativeClients = new Set<NativeClient>();
  private readonly stopHearingDefects: (() => void) | undefined;
  private readonly connections = new Set<ClientConnection>();
  private readonly exchangeContext: ExchangeContext;
  /** Intercepts TLS to destinations with a header rule (secretless egress), when configured. */
  private readonly interceptor: Interceptor | undefined;
  private readonly tunnelOpener: TunnelOpener;
  /** The budget charge of each client connection Node holds, and of each the relay holds. */
  private readonly holds = new WeakMap<net.Socket, ConnectionHold>();
  private readonly nativeHolds = new Map<number, ConnectionHold>();
  readonly deadlines: ConnectionDeadlines;
  private logged = false;
  /** close() was called: connections finish what they carry and take no new request. */
  draining = false;

  constructor(readonly options: ProxyOptions) {
    this.server = net.createServer({ allowHalfOpen: true, noDelay: true }, (socket) => {
      const hold = options.connections.admit('proxy', socket.remoteAddress);
      if (hold === undefined) return void socket.resetAndDestroy();
      this.accept(socket, hold);
    });
    this.deadlines = {
      firstByteMs: options.firstByteTimeoutMs,
      keepAliveMs: options.keepAliveTimeoutMs,
      passed: (resource) => options.metrics.budgetRefusals.inc({ resource }),
    };
    this.native = nativeTcp(options.tcpIo ?? 'auto');
    this.stopHearingDefects = this.native?.onDefect((error) =>
      options.logger.error({ err: error }, 'egress request failed'),
    );
    this.listeners = new ListenerGroup(this.server);
    // Upstream connections of a sandbox whose policy changed are dropped: every new request is
    // decided again anyway, and nothing idles towards a now-denied address.
    this.pool = new UpstreamPool(options.maxTunnelsPerSandbox);
    this.interceptor = interceptorFor(options);
    this.tunnelOpener = new TunnelOpener(options, this.interceptor);
    options.table.subscribe((event) => this.pool.drop(event.sandboxID));
    this.exchangeContext = {
      table: options.table,
      dialer: options.dialer,
      pool: this.pool,
      tunnels: options.tunnels,
      idleTimeoutMs: options.idleTimeoutMs,
      onRefusal: ({ sandbox, target }, refusal) =>
        this.refused('forward', sandbox, target, refusal),
      draining: () => this.draining,
    };
  }

  /** How connections are accepted and tunnels carried, and why when not natively. */
  get io(): { io: TcpIo; why?: string } {
    if (this.native !== undefined) return { io: 'native' };
    return {
      io: 'node',
      why: this.options.tcpIo === 'node' ? 'configured' : nativeTcpUnavailable(),
    };
  }

  /** Listens on one more address; resolves to the bound port. */
  async listen(address: ProxyListen): Promise<number> {
    if (!this.logged) {
      this.logged = true;
      this.options.logger.info(this.io, 'proxy listener');
    }
    // The native relay binds IP addresses only; a name or a scoped address is left to Node.
    if (this.native === undefined || net.isIP(address.host) === 0 || address.host.includes('%'))
      return this.listeners.listen(address);
    // The relay hands a client over when its first bytes come, or when the first-byte
    // deadline passes with none (then it is closed at once, see ClientConnection).
    const listener = this.native.listen(
      address.host,
      address.port,
      this.options.firstByteTimeoutMs,
      {
        opened: (id, remoteAddress) => {
          const hold = this.options.connections.admit('proxy', remoteAddress);
          if (hold !== undefined) this.nativeHolds.set(id, hold);
          return hold !== undefined;
        },
        client: (client) => this.onNativeClient(client),
        gone: (id) => {
          this.nativeHolds.get(id)?.release();
          this.nativeHolds.delete(id);
        },
      },
    );
    this.nativeListeners.push(listener);
    return listener.port;
  }

  /** A connection Node holds, charged to `hold`: read, head by head, by a ClientConnection. */
  private accept(
    socket: net.Socket,
    hold: ConnectionHold | undefined,
    firstBytes?: Buffer,
    waitedMs = 0,
  ): void {
    this.sockets.add(socket);
    if (hold !== undefined) this.holds.set(socket, hold);
    socket.once('close', () => {
      this.sockets.delete(socket);
      hold?.release();
    });
    this.connections.add(new ClientConnection(this, socket, firstBytes, waitedMs));
  }

  /** Hands a client of the relay to Node, with its budget charge. */
  private adopt(client: NativeClient): { socket: net.Socket; hold: ConnectionHold | undefined } {
    const hold = this.nativeHolds.get(client.id);
    this.nativeHolds.delete(client.id);
    const socket = this.native!.adopt(client);
    if (hold !== undefined) {
      this.holds.set(socket, hold);
      socket.once('close', () => hold.release());
    }
    return { socket, hold };
  }

  /**
   * Moves the connection's charge to the sandbox its credential named; false (after answering
   * 429 through `refuse`) when that sandbox is at its budget.
   */
  private charged(
    hold: ConnectionHold | undefined,
    sandbox: EnforcedSandbox,
    kind: ProxyKind,
    refuse: (status: number, message: string) => void,
  ): boolean {
    if (hold === undefined || hold.chargeTo(sandbox.sandboxID)) return true;
    this.count(kind, 'limited');
    refuse(
      429,
      `sandbox ${sandbox.sandboxID} already has ${this.options.maxTunnelsPerSandbox} open connections to Moat`,
    );
    return false;
  }

  /**
   * A natively accepted connection with its first bytes: a CONNECT whose head came whole stays
   * native; anything else is handed to Node with the bytes read so far, and read as it would
   * have been there.
   */
  private onNativeClient(client: NativeClient): void {
    const native = this.native!;
    const bytes = client.firstBytes;
    const end = bytes.length === 0 ? 'incomplete' : headEnd(bytes, MAX_REQUEST_HEAD_BYTES, 0);
    const parsed = typeof end === 'number' ? parseRequestHead(bytes.subarray(0, end)) : undefined;
    if (
      typeof end !== 'number' ||
      !parsed?.ok ||
      parsed.value.method !== 'CONNECT' ||
      this.draining ||
      // A tunnel through the sandbox's upstream proxy is set up on a Node socket.
      this.tunnelled(parsed.value, client)
    ) {
      const { socket, hold } = this.adopt(client);
      try {
        return this.accept(socket, hold, bytes, client.waitedMs);
      } catch (error) {
        // Adopted, it is no longer the relay's to close.
        socket.destroy();
        throw error;
      }
    }
    const connectClient = nativeConnectClient(
      native,
      client,
      this.nativeClients,
      (parked) => this.adopt(parked).socket,
    );
    const hold = this.nativeHolds.get(client.id);
    this.onConnect(parsed.value, connectClient, bytes.subarray(end), hold).catch(
      (error: unknown) => {
        this.options.logger.error({ err: error }, 'egress request failed');
        connectClient.destroy();
      },
    );
  }

  /** A CONNECT through the sandbox's upstream proxy, or one Moat may intercept: Node's. */
  private tunnelled(head: RequestHead, client: NativeClient): boolean {
    const who = this.identify(head, client);
    if (!who.ok) return false;
    if (who.sandbox.upstream !== undefined) return true;
    if (this.interceptor === undefined) return false;
    const target = parseAuthority(head.target);
    return (
      target.ok &&
      target.value.port !== undefined &&
      this.interceptor.ruleFor(who.sandbox, target.value as Target) !== undefined
    );
  }

  /** Stops accepting, lets open tunnels and requests finish for up to `drainMs`, then closes. */
  async close(drainMs = 0): Promise<void> {
    this.draining = true;
    for (const listener of this.nativeListeners.splice(0)) listener.close();
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    const extraClosed = this.listeners.closeExtra();
    for (const connection of this.connections) connection.closeIfIdle();
    const deadline = Date.now() + drainMs;
    const busy = () => this.options.tunnels.size > 0 || [...this.connections].some((c) => c.busy);
    while (busy() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    for (const tunnel of this.options.tunnels.all()) tunnel.close();
    for (const socket of this.sockets) socket.destroy();
    for (const client of this.nativeClients) this.native!.close(client);
    this.nativeClients.clear();
    this.stopHearingDefects?.();
    this.interceptor?.close();
    this.pool.closeAll();
    await Promise.all([closed, extraClosed]);
  }

  /** Client sockets accepted and not yet closed (whatever they carry now). */
  get openConnections(): number {
    return this.sockets.size + this.nativeClients.size;
  }

  forget(connection: ClientConnection): void {
    this.connections.delete(connection);
  }

  get logger(): Logger {
    return this.options.logger;
  }

  get handshakeTimeoutMs(): number {
    return this.options.handshakeTimeoutMs;
  }

  /** A CONNECT read by a ClientConnection: the tunnel takes its socket over. */
  takeConnect(head: RequestHead, socket: net.Socket, early: Buffer): Promise<void> {
    return this.onConnect(head, nodeClient(socket, early), early, this.holds.get(socket));
  }

  private count(kind: ProxyKind, verdict: ProxyVerdict): void {
    this.options.metrics.proxyConnections.inc({ kind, verdict });
  }

  /** Records (a denial) or logs and counts (a failure) a refusal; returns it to be sent. */
  private refused(
    kind: ProxyKind,
    sandbox: EnforcedSandbox,
    target: Target,
    refusal: Refusal,
  ): Refusal {
    if (refusal.decision !== undefined) {
      const flowKind = kind === 'forward' ? 'http' : kind;
      const protocol = kind === 'forward' ? 'http' : 'tcp';
      this.options.flows.decided(flowAsk(flowKind, sandbox, target, protocol), refusal.decision);
    } else {
      this.count(kind, refusal.status === 429 ? 'limited' : 'failed');
      this.options.logger.warn(
        {
          sandboxID: sandbox.sandboxID,
          kind,
          destination: formatDestination(target),
          status: refusal.status,
          reason: refusal.message,
        },
        'egress failed',
      );
    }
    return refusal;
  }

  /**
   * Traffic no sandbox owns, or a sandbox's with another's credential: counted and logged
   * (never with the credential it carried).
   */
  private unidentified(
    kind: 'connect' | 'forward',
    client: { readonly remoteAddress: string | undefined },
    destination: string,
    who: Identity & { ok: false },
  ): void {
    this.count(kind, 'unauthenticated');
    const { reason, sandbox } = who;
    if (sandbox === undefined)
      this.options.logger.info(
        { kind, client: client.remoteAddress, destination, reason },
        'egress refused: no sandbox identified',
      );
    else
      this.options.logger.warn(
        { sandboxID: sandbox.sandboxID, kind, client: client.remoteAddress, destination, reason },
        "egress refused: a sandbox sent another sandbox's credential",
      );
  }

  private identify(head: RequestHead, client: { readonly remoteAddress: string | undefined }) {
    const credentials = fieldValues(head.fields, 'proxy-authorization');
    // Two credentials are one too many: neither is picked.
    return identify(
      this.options.table,
      credentials.length > 1 ? '' : credentials[0],
      client,
      this.options.sourceIsProof,
    );
  }

  async onConnect<U>(
    head: RequestHead,
    client: ConnectClient<U>,
    early: Buffer,
    hold: ConnectionHold | undefined,
  ): Promise<void> {
    const who = this.identify(head, client);
    if (!who.ok) {
      this.unidentified('connect', client, head.target, who);
      return client.refuse(407, who.reason, undefined, {
        'Proxy-Authenticate': 'Basic realm="moat"',
      });
    }
    const sandbox = who.sandbox;
    if (
      !this.charged(hold, sandbox, 'connect', (status, message) => client.refuse(status, message))
    )
      return;
    const parsed = parseAuthority(head.target);
    if (!parsed.ok || parsed.value.port === undefined) {
      this.count('connect', 'invalid');
      const why = parsed.ok ? 'it has no port' : parsed.error;
      return client.refuse(
        400,
        `CONNECT target ${JSON.stringify(head.target)} must be host:port or [ipv6]:port: ${why}`,
      );
    }
    const target = parsed.value as Target;
    const wait = this.options.fairShare?.wait(sandbox.sandboxID, 'CONNECT', target);
    if (wait !== undefined) {
      const over = await wait;
      if (over !== undefined) {
        this.count('connect', 'limited');
        return client.refuse(429, over);
      }
    }
    const refuse = (refusal: Refusal) => {
      const { status, message, decision } = this.refused('connect', sandbox, target, refusal);
      client.refuse(status, message, decision);
    };
    await this.tunnelOpener.open(sandbox, target, client, early, refuse);
  }

  /**
   * Absolute-form HTTP: `GET http://host[:port]/path`, forwarded to a decided address.
   * `answer` writes a response of Moat's own; `exchange` starts a forwarded one.
   */
  async onRequest(head: RequestHead, connection: ClientConnection): Promise<void> {
    const client = connection.socket;
    const url = head.target;
    const { framing, hasBody, lastRequest, keepAlive } = requestTurn(head, this.draining);
    const answer = (status: number, message: string, decision?: Decision, extra = {}) =>
      connection.refuse(head, keepAlive, status, message, decision, extra);
    if (!framing.ok) {
      this.count('forward', 'invalid');
      return answer(
        framing.status,
        `request ${JSON.stringify(url.slice(0, 200))}: ${framing.message}`,
      );
    }
    const scheme = /^http:\/\//i.exec(url);
    if (!scheme) {
      this.count('forward', 'invalid');
      const hint = /^https:\/\//i.test(url)
        ? 'use CONNECT for https'
        : 'send absolute-form requests (GET http://host/path) or CONNECT host:port';
      return answer(400, `Moat is an egress proxy: ${hint}`);
    }
    const who = this.identify(head, client);
    if (!who.ok) {
      this.unidentified('forward', client, url, who);
      return answer(407, who.reason, undefined, { 'Proxy-Authenticate': 'Basic realm="moat"' });
    }
    const sandbox = who.sandbox;
    const overBudget = (status: number, message: string) =>
      connection.refuse(head, false, status, message);
    if (!this.charged(this.holds.get(client), sandbox, 'forward', overBudget)) return;
    const rest = url.slice(scheme[0].length);
    const pathStart = rest.search(/[/?#]/);
    const authority = pathStart < 0 ? rest : rest.slice(0, pathStart);
    const path =
      pathStart < 0
        ? '/'
        : rest[pathStart] === '/'
          ? rest.slice(pathStart)
          : `/${rest.slice(pathStart)}`;
    const parsed = parseAuthority(authority);
    if (!parsed.ok) {
      this.count('forward', 'invalid');
      return answer(400, `request target ${JSON.stringify(url)}: ${parsed.error}`);
    }
    const target: Target = { ...parsed.value, port: parsed.value.port ?? 80 };
    const wait = this.options.fairShare?.wait(sandbox.sandboxID, 'a request to', target);
    if (wait !== undefined) {
      const over = await wait;
      if (over !== undefined) {
        this.count('forward', 'limited');
        return answer(429, over);
      }
      if (client.destroyed) return;
    }
    const refuse = (refusal: Refusal) => {
      const { status, message, decision } = this.refused('forward', sandbox, target, refusal);
      answer(status, message, decision);
    };
    const plan = await this.options.dialer.plan(sandbox, target);
    if (client.destroyed) return;
    // Plain HTTP to a destination with a header rule, or a request leaking a stored secret:
    // checked first, so that a refused request's record never repeats a secret it carried.
    const secretRefusal = plan.ok
      ? (this.interceptor?.plainRefusal(sandbox, target, true) ??
        (await this.interceptor?.leakRefusal(sandbox, target, head)))
      : undefined;
    // A destination's rules decide each request by its method and path (and record a refusal).
    const rules =
      plan.ok && secretRefusal === undefined
        ? this.interceptor?.ruleFor(sandbox, target)
        : undefined;
    if (rules?.decidesRequests === true && !client.destroyed) {
      const decided = this.interceptor!.decideRequest(sandbox, target, rules, head, path, 'http');
      if (!decided.ok) return answer(decided.status, decided.decision.reason, decided.decision);
    }
    if (client.destroyed) return;
    if (!plan.ok || !this.options.table.holds(sandbox) || secretRefusal !== undefined) {
      return refuse(plan.ok ? (secretRefusal ?? removed(sandbox)) : plan);
    }
    // Decided by name, or by the one address a bare-address request names.
    const flow = this.options.flows.opened(flowAsk('http', sandbox, target, 'http'), plan.decision);
    // Retrying another address is only safe while no body has been sent.
    const addresses = hasBody ? plan.addresses.slice(0, 1) : plan.addresses;
    connection.exchange(
      new Exchange(
        this.exchangeContext,
        { sandbox, target, head, path, framing: framing.value, lastRequest, flow },
        connection.inbox,
        addresses,
        (result) => connection.exchangeDone(result.keepAlive),
      ),
    );
  }
}
