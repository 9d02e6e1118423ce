import net from 'node:net';
import type { HostResolver } from '../dns/index.js';
import type { EnforcedSandbox, UpstreamProxy } from '../enforce/index.js';
import {
  type Decision,
  type Destination,
  decide,
  formatDestination,
  type HostAddresses,
  type IPAddress,
} from '../policy/index.js';
import { socksConnect } from './socks5-client.js';
import { connectUpstream } from './splice.js';

/** A destination with its port known (the proxy always knows it). */
export type Target = Destination & { readonly port: number };
/**
 * A target with the address it was decided and dialled at, and the upstream proxy it went
 * through (undefined: direct).
 */
export type Dialled = Target & { readonly ip: IPAddress; readonly via?: UpstreamProxy };

/** A refusal, carrying the HTTP status and a message that names the destination. */
export interface Refusal {
  readonly status: 403 | 429 | 502 | 504;
  readonly message: string;
  readonly decision?: Decision;
  /**
   * An intercepted request's refusal: the origin's TLS failed verification (or its handshake),
   * or the origin switched protocols without proving a WebSocket handshake.
   */
  readonly cause?: 'origin-tls' | 'switch';
}

/** A connection made, to the address it was decided for, or a refusal. */
export type Connected<T> =
  { ok: true; socket: T; ip: IPAddress; via?: UpstreamProxy } | ({ ok: false } & Refusal);

export type Plan =
  | { readonly ok: true; readonly addresses: readonly IPAddress[]; readonly decision: Decision }
  | ({ readonly ok: false } & Refusal);

export interface DialerOptions {
  readonly resolver: Pick<HostResolver, 'lookup'>;
  readonly connectTimeoutMs: number;
  /**
   * The host itself (its addresses, Moat's listeners on them), the gateway and sandbox links:
   * denied before any policy, never dialled.
   */
  readonly host: HostAddresses;
  readonly onDial?: (seconds: number) => void;
}

/** An attempt that turned out to reach the host itself, closed before a byte. */
class ReachedHost extends Error {
  constructor(readonly decision: Decision) {
    super(decision.reason);
  }
}

/** The refusal for work whose sandbox went away (or away and back, a new record) meanwhile. */
export const removed = (sandbox: EnforcedSandbox): Refusal => ({
  status: 403,
  message: `sandbox ${sandbox.sandboxID} was removed`,
});

export function denial(target: Target, decision: Decision): Refusal {
  const by = decision.rule === null ? decision.list : `${decision.list} rule ${decision.rule}`;
  return {
    status: 403,
    message: `egress to ${formatDestination(target)} denied by ${by}: ${decision.reason}`,
    decision,
  };
}

/**
 * Decides and dials for a sandbox. A host name is resolved once, through Moat's resolver, and
 * only when the policy could allow it (a denied name is never looked up); every resolved
 * address is decided on its own, and only addresses that were decided are ever dialled.
 */
export class Dialer {
  constructor(private readonly options: DialerOptions) {}

  get connectTimeoutMs(): number {
    return this.options.connectTimeoutMs;
  }

  /** The addresses this sandbox may reach for `target`, in dialling order, or a refusal. */
  async plan(sandbox: EnforcedSandbox, target: Target): Promise<Plan> {
    if (target.ip !== undefined) {
      const decision = this.check(sandbox, target, target.ip);
      return decision.verdict === 'allow'
        ? { ok: true, addresses: [target.ip], decision }
        : { ok: false, ...denial(target, decision) };
    }
    const host = target.host!;
    const byName = decide(sandbox.policy, { host, port: target.port });
    if (byName.verdict === 'deny') return { ok: false, ...denial(target, byName) };
    let addresses: IPAddress[];
    try {
      addresses = await this.options.resolver.lookup(host);
    } catch (error) {
      return {
        ok: false,
        status: 502,
        message: `cannot resolve ${host}: ${(error as Error).message}`,
      };
    }
    if (addresses.length === 0)
      return { ok: false, status: 502, message: `${host} has no IPv4 or IPv6 address` };
    // Decided against the policy current *after* the lookup: a PUT may have landed meanwhile.
    const decisions = addresses.map((ip) => ({ ip, decision: this.check(sandbox, target, ip) }));
    const allowed = decisions.filter((d) => d.decision.verdict === 'allow').map((d) => d.ip);
    if (allowed.length === 0)
      return { ok: false, ...denial({ ...target, ip: decisions[0]!.ip }, decisions[0]!.decision) };
    // Recorded as decided by the name: its rule is the one a flow record shows.
    return { ok: true, addresses: allowed, decision: byName };
  }

  /**
   * The decision for one address of a target: the host first, then the sandbox's policy.
   * Learned addresses count only for a bare address (a named host is decided by its name), and
   * not with `byAddressOnly` (how the sandbox's firewall decides a web connection it holds
   * directly: nothing read its name).
   */
  check(sandbox: EnforcedSandbox, target: Target, ip: IPAddress, byAddressOnly = false): Decision {
    const host = this.options.host.decide(ip, target.port);
    if (host !== undefined) return host;
    const learned = target.host === undefined && !byAddressOnly ? sandbox.learned : undefined;
    return decide(sandbox.policy, { host: target.host, ip, port: target.port }, learned);
  }

  /**
   * Connects to the first planned address that answers (each gets the connect timeout), or
   * refuses with 502/504. `open` makes the connection: tunnelSocket, httpSocket, or the native
   * relay's dial.
   */
  connect<T>(
    target: Target,
    addresses: readonly IPAddress[],
    open: Opener<T>,
  ): Promise<Connected<T>> {
    return this.connectTo(target, addresses, open, true);
  }

  /**
   * `connect`; with `guardHost`, a connection that turns out to have reached the host itself
   * (an address it got after Moat last read its addresses, or one only a local route delivers)
   * is closed before a byte and refused like any host address. Off only for the operator's
   * upstream proxy.
   */
  private async connectTo<T>(
    target: Target,
    addresses: readonly IPAddress[],
    open: Opener<T>,
    guardHost: boolean,
  ): Promise<Connected<T>> {
    let timedOut = false;
    const failures: string[] = [];
    for (const ip of addresses) {
      const started = performance.now();
      try {
        const socket = await this.attempt(open, ip, target.port, guardHost);
        this.options.onDial?.((performance.now() - started) / 1000);
        return { ok: true, socket, ip };
      } catch (error) {
        if (error instanceof ReachedHost)
          return { ok: false, ...denial({ ...target, ip }, error.decision) };
        const message = (error as Error).message;
        timedOut ||= message === 'timeout';
        failures.push(`${ip.text}: ${message}`);
      }
    }
    const what = formatDestination(target);
    return timedOut
      ? {
          ok: false,
          status: 504,
          message: `${what} did not answer within ${this.options.connectTimeoutMs} ms (${failures.join('; ')})`,
        }
      : {
          ok: false,
          status: 502,
          message: `${what} refused the connection (${failures.join('; ')})`,
        };
  }

  /**
   * Connects a decided target for the sandbox: through its upstream proxy when it has one
   * (never direct then, whatever happens to the proxy), else as `connect` does with `open`.
   */
  reach(
    sandbox: EnforcedSandbox,
    target: Target,
    addresses: readonly IPAddress[],
    open: Opener<net.Socket>,
  ): Promise<Connected<net.Socket>> {
    const upstream = sandbox.upstream;
    return upstream === undefined
      ? this.connect(target, addresses, open)
      : this.throughProxy(upstream, target, addresses);
  }

  /**
   * Asks the upstream proxy for the target: by the name Moat decided on (the proxy resolves it)
   * or by the decided address. Any failure is a 502 naming the proxy by its address only.
   */
  private async throughProxy(
    upstream: UpstreamProxy,
    target: Target,
    addresses: readonly IPAddress[],
  ): Promise<Connected<net.Socket>> {
    const refuse = (why: string): Connected<net.Socket> => ({
      ok: false,
      status: 502,
      message: `egress proxy ${upstream.address} for ${formatDestination(target)}: ${why}`,
    });
    let proxyAddresses: readonly IPAddress[];
    if (upstream.at.ip !== undefined) proxyAddresses = [upstream.at.ip];
    else {
      try {
        proxyAddresses = await this.options.resolver.lookup(upstream.at.host!);
      } catch (error) {
        return refuse(`cannot resolve the proxy: ${(error as Error).message}`);
      }
      if (proxyAddresses.length === 0) return refuse('the proxy name has no address');
    }
    // The operator's proxy may well run on the host itself.
    const proxy = await this.connectTo(upstream.at, proxyAddresses, proxySocket, false);
    if (!proxy.ok) return refuse(`cannot connect to the proxy: ${proxy.message}`);
    const started = performance.now();
    try {
      await socksConnect(proxy.socket, {
        destination: target.host !== undefined ? target : { ip: addresses[0]!, port: target.port },
        username: upstream.username,
        password: upstream.password,
        timeoutMs: this.options.connectTimeoutMs,
      });
    } catch (error) {
      proxy.socket.destroy();
      return refuse((error as Error).message);
    }
    this.options.onDial?.((performance.now() - started) / 1000);
    return { ok: true, socket: proxy.socket, ip: addresses[0]!, via: upstream };
  }

  private attempt<T>(open: Opener<T>, ip: IPAddress, port: number, guardHost: boolean): Promise<T> {
    return new Promise((resolve, reject) => {
      let settled = false;
      const timer = setTimeout(() => {
        settled = true;
        opening.abort();
        reject(new Error('timeout'));
      }, this.options.connectTimeoutMs);
      const opening = open(ip.text, port, (error, connection, toSelf) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        if (error !== undefined) return reject(error);
        const host = guardHost && toSelf === true ? this.options.host.reached(port) : undefined;
        if (host === undefined) return resolve(connection!);
        opening.abort();
        reject(new ReachedHost(host));
      });
    });
  }
}

/**
 * Opens a connection to ip:port; calls `done` once (the error's message is its code, such as
 * ECONNREFUSED), unless `abort` came first.
 */
export type Opener<T> = (
  ip: string,
  port: number,
  done: (error: Error | undefined, connection?: T, toSelf?: boolean) => void,
) => { abort(): void };

function socketOpener(connect: (options: net.TcpNetConnectOpts) => net.Socket): Opener<net.Socket> {
  return (ip, port, done) => {
    const socket = connect({ host: ip, port, noDelay: true });
    const failed = (error: NodeJS.ErrnoException) => {
      socket.destroy();
      done(new Error(error.code ?? error.message));
    };
    socket.once('error', failed);
    socket.once('connect', () => {
      socket.off('error', failed);
      // Errors after this end the connection; whoever splices it cleans up on 'close'.
      socket.on('error', () => socket.destroy());
      done(undefined, socket, socket.localAddress === socket.remoteAddress);
    });
    return { abort: () => socket.destroy() };
  };
}

/** A socket for a tunnel: it reads into splice()'s recycled buffers once spliced. */
export const tunnelSocket = socketOpener(connectUpstream);
/** An ordinary socket, read by whoever parses its messages. */
export const httpSocket = socketOpener(net.connect);
/**
 * A socket to an upstream proxy: read by the SOCKS handshake first, then by whoever carries the
 * flow; half-open like a tunnel's, so the origin's end does not cut the upload.
 */
const proxySocket = socketOpener((options) => net.connect({ ...options, allowHalfOpen: true }));
