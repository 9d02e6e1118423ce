import type net from 'node:net';
import type { EnforcedSandbox } from '../enforce/index.js';
import type { OpenFlow } from '../flows/index.js';
import {
  type CanonicalName,
  canonicalName,
  type Decision,
  formatDestination,
  type DestinationRules,
  type IPAddress,
} from '../policy/index.js';
import { ArrivingBytes } from '../net/index.js';
import {
  type Connected,
  type Dialer,
  type Dialled,
  denial,
  type Plan,
  type Refusal,
  removed,
  type Target,
  tunnelSocket,
} from './dial.js';
import type { ProxyOptions } from './options.js';
import { writeRawError } from './http-errors.js';
import { MAX_REQUEST_HEAD_BYTES, type RequestHead } from './http1.js';
import { authorityMismatch, RequestStreamGuard } from './host-guard.js';
import { type Interceptor, protocolRefusal, readFirstBytes } from './intercept.js';
import type { NativeClient, NativeTcp, NativeUpstream } from './native-tcp.js';
import { looksLikeTls, readClientHello, startsLikeHttp, tlsRecordStart } from './peek.js';
import { type Splice, type SpliceOptions, splice } from './splice.js';
import { TlsHelloGuard } from './tls-guard.js';
import { flowAsk, spliceTunnel, unreadUnderRules } from './tunnels.js';

const CONNECT_ESTABLISHED = 'HTTP/1.1 200 Connection Established\r\n\r\n';
const CONNECT_ESTABLISHED_BYTES = Buffer.from(CONNECT_ESTABLISHED, 'latin1');

/** The client of a CONNECT, on Node's sockets or on the native relay, and how it dials. */
export interface ConnectClient<U> {
  readonly remoteAddress: string | undefined;
  /** Node's socket of the client (undefined on the native relay). */
  readonly socket: net.Socket | undefined;
  /** The client left while its tunnel was being dialled. */
  readonly gone: boolean;
  /** Answers with an error and closes. */
  refuse(
    status: number,
    message: string,
    decision?: Decision,
    extra?: Record<string, string>,
  ): void;
  destroy(): void;
  /** Connects the decided target (through the sandbox's upstream proxy, if it has one). */
  dial(
    dialer: Dialer,
    sandbox: EnforcedSandbox,
    target: Target,
    addresses: readonly IPAddress[],
  ): Promise<Connected<U>>;
  closeUpstream(upstream: U): void;
  /** Sends the 200 and joins client and upstream (client bytes held until released). */
  splice(upstream: U, options: SpliceOptions): Splice;
}

export function nodeClient(client: net.Socket, early: Buffer): ConnectClient<net.Socket> {
  return {
    socket: client,
    get remoteAddress() {
      return client.remoteAddress;
    },
    // A client that ended without a byte for the tunnel has nothing to carry.
    get gone() {
      return client.destroyed || (client.readableEnded && early.length === 0);
    },
    refuse: (status, message, decision, extra) =>
      writeRawError(client, status, message, decision, extra),
    destroy: () => client.destroy(),
    dial: (dialer, sandbox, target, addresses) =>
      dialer.reach(sandbox, target, addresses, tunnelSocket),
    closeUpstream: (upstream) => upstream.destroy(),
    splice: (upstream, options) => {
      client.write(CONNECT_ESTABLISHED);
      return splice(client, upstream, options);
    },
  };
}

/**
 * A CONNECT client on the native relay, held in `clients` (the proxy's count of open client
 * connections) from here until it is refused (then Node answers it, on the socket `adopt`
 * makes), destroyed or its tunnel closes.
 */
export function nativeConnectClient(
  native: NativeTcp,
  client: NativeClient,
  clients: Set<NativeClient>,
  adopt: (client: NativeClient) => net.Socket,
): ConnectClient<NativeUpstream> {
  clients.add(client);
  const forget = () => clients.delete(client);
  return {
    socket: undefined,
    remoteAddress: client.remoteAddress,
    // Closed by shutdown while it was dialled (the relay never closes a parked client).
    get gone() {
      return !clients.has(client);
    },
    refuse: (status, message, decision, extra) => {
      forget();
      writeRawError(adopt(client), status, message, decision, extra);
    },
    destroy: () => {
      forget();
      native.close(client);
    },
    // The relay dials directly only: a tunnelled sandbox's CONNECTs are handed to Node (see
    // EgressProxy.onNativeClient); one whose proxy was set since is refused, never sent direct.
    dial: async (dialer, sandbox, target, addresses) =>
      sandbox.upstream === undefined
        ? dialer.connect(target, addresses, native.dial)
        : {
            ok: false,
            status: 502,
            message: `egress proxy ${sandbox.upstream.address} was set for this sandbox while the CONNECT to ${formatDestination(target)} was read; retry`,
          },
    closeUpstream: (upstream) => native.close(upstream),
    splice: (upstream, options) =>
      native.splice(client, upstream, CONNECT_ESTABLISHED_BYTES, {
        ...options,
        onClose: (up, down) => {
          forget();
          options.onClose(up, down);
        },
      }),
  };
}

/**
 * Why a TLS server name (undefined: the ClientHello sent none) is not the one a tunnel was
 * decided for; undefined when it is.
 */
function serverNameProblem(target: Target, named: string | undefined): string | undefined {
  // A tunnel to an address may not name a host in TLS.
  if (target.host === undefined)
    return named === undefined
      ? undefined
      : `the TLS server name ${JSON.stringify(named)} names a host, but CONNECT named an address`;
  if (named === undefined) return `the tunnel to ${target.host} sends no TLS server name`;
  const canonical = canonicalName(named);
  return canonical.ok && canonical.value === target.host
    ? undefined
    : `the TLS server name ${JSON.stringify(named)} is not ${target.host} (domain fronting)`;
}

/**
 * Reads the first bytes of a tunnel: 'tls' for a ClientHello naming the host CONNECT named,
 * 'http' for plain HTTP (every request is checked: on port 80 any plain bytes, elsewhere bytes
 * that start like a request, since origins route plain HTTP by Host on any port), 'ok' for
 * other plain bytes, or why the tunnel must close.
 */
function checkFirstBytes(target: Target, data: Buffer): 'wait' | 'ok' | 'http' | 'tls' | string {
  const tls = looksLikeTls(data[0]!);
  if (!tls) {
    // A TLS record that is not a handshake (an alert, say) first: some TLS stacks skip it and
    // read the ClientHello after it, unchecked.
    const record = tlsRecordStart(data);
    if (record === 'wait') return 'wait';
    if (record) return `its first bytes are a TLS record of type ${data[0]}, not a ClientHello`;
    if (target.port === 80) return 'http';
    const http = startsLikeHttp(data, MAX_REQUEST_HEAD_BYTES);
    return http === 'wait' ? 'wait' : http ? 'http' : 'ok';
  }
  const hello = readClientHello(data);
  if (hello.status === 'incomplete') return 'wait';
  if (hello.status === 'invalid')
    return `its first bytes are not a valid TLS ClientHello: ${hello.reason}`;
  return serverNameProblem(target, hello.name) ?? 'tls';
}

/**
 * Opens the tunnel of a CONNECT that was identified, parsed and given a connection slot:
 * resolves, dials, decides again and splices it, checking its first bytes where asked, or hands
 * it to the interceptor when a header rule applies.
 */
export class TunnelOpener {
  constructor(
    private readonly options: ProxyOptions,
    private readonly interceptor: Interceptor | undefined,
  ) {}

  /** Resolves, dials, decides again and splices a CONNECT tunnel (its slot is held). */
  async open<U>(
    sandbox: EnforcedSandbox,
    target: Target,
    client: ConnectClient<U>,
    early: Buffer,
    refuse: (refusal: Refusal) => void,
  ): Promise<void> {
    const plan = await this.options.dialer.plan(sandbox, target);
    if (!plan.ok) return refuse(plan);
    const rule = this.interceptor?.ruleFor(sandbox, target);
    if (rule !== undefined && client.socket !== undefined)
      return this.interceptTunnel(sandbox, target, plan, rule, client.socket, early, refuse);
    // Rules that decide requests came while this client was handed to the native relay
    // (which cannot intercept): the tunnel may not open unread.
    const unread = rule === undefined ? undefined : unreadUnderRules(sandbox, target);
    if (unread !== undefined) return refuse(denial(target, unread));
    const connected = await client.dial(this.options.dialer, sandbox, target, plan.addresses);
    if (!connected.ok) return refuse(connected);
    const upstream = connected.socket;
    const dialled: Dialled = { ...target, ip: connected.ip, via: connected.via };
    // The policy may have changed while we dialled: decide once more, then register.
    const now = this.options.dialer.check(sandbox, dialled, connected.ip);
    const abandoned = client.gone;
    if (now.verdict === 'deny' || abandoned || !this.options.table.holds(sandbox)) {
      client.closeUpstream(upstream);
      if (now.verdict === 'deny') return refuse(denial(dialled, now));
      if (abandoned) return client.destroy();
      return client.refuse(403, removed(sandbox).message);
    }
    const flow = this.options.flows.opened(flowAsk('connect', sandbox, dialled, 'tcp'), now);
    const tunnel = spliceTunnel(this.options, flow, sandbox, dialled, (options) =>
      client.splice(upstream, options),
    );
    // The leak guard reads plain HTTP in every tunnel, even where names are not checked.
    const leaks = this.interceptor?.leakInspector(sandbox, dialled);
    if (!this.options.checkServerName && leaks === undefined) return tunnel.release(early);
    const { fairShare } = this.options;
    // Each later request read in the tunnel is work on Moat's loop: held to the sandbox's rate.
    const admit =
      fairShare && (() => fairShare.admitNow(sandbox.sandboxID, 'a request to', dialled));
    this.holdUntilChecked(dialled, early, tunnel, flow, leaks, admit);
  }

  /**
   * A CONNECT to a destination with a header rule: answered 200, then its first bytes must be a
   * ClientHello naming the CONNECT's host, which Moat serves itself (plain HTTP there is refused:
   * credentials go over HTTPS only).
   */
  private async interceptTunnel(
    sandbox: EnforcedSandbox,
    target: Target,
    plan: Plan & { ok: true },
    rule: DestinationRules,
    socket: net.Socket,
    early: Buffer,
    refuse: (refusal: Refusal) => void,
  ): Promise<void> {
    const interceptor = this.interceptor!;
    socket.write(CONNECT_ESTABLISHED);
    const hello = await readFirstBytes(
      socket,
      early,
      this.options.handshakeTimeoutMs,
      (seen) => checkFirstBytes(target, seen) !== 'wait',
    );
    if (hello === undefined) return void socket.destroy();
    const verdict = checkFirstBytes(target, hello);
    if (verdict === 'tls') {
      const at: Dialled = { ...target, ip: plan.addresses[0]!, via: sandbox.upstream };
      const named = target as Target & { host: CanonicalName };
      return interceptor.intercept(
        'connect',
        sandbox,
        named,
        at,
        plan.decision,
        rule,
        socket,
        hello,
      );
    }
    if (verdict === 'http') return refuse(interceptor.plainRefusal(sandbox, target)!);
    refuse(
      protocolRefusal(
        verdict === 'ok' ? `the tunnel to ${target.host} carries neither TLS nor HTTP` : verdict,
      ),
    );
  }

  /**
   * Holds client bytes until the first ones show the tunnel talks to the host CONNECT named (when
   * names are checked), and plain HTTP carries no secret it may not (`leaks`, the leak guard)
   * and no more requests than the sandbox's rate (`admit`, its fair share).
   */
  private holdUntilChecked(
    target: Target,
    head: Buffer,
    tunnel: Splice,
    flow: OpenFlow,
    leaks: ((head: RequestHead) => string | undefined) | undefined,
    admit: (() => string | undefined) | undefined,
  ): void {
    const checkNames = this.options.checkServerName;
    const arriving = new ArrivingBytes();
    let seen = arriving.restart(head);
    const timer = setTimeout(
      () => finish('no first bytes within the handshake timeout'),
      this.options.handshakeTimeoutMs,
    );
    const stopHolding = tunnel.hold(
      (chunk) => {
        seen = arriving.append(chunk);
        examine();
      },
      // The client left (or the tunnel closed for another reason) before showing its first
      // bytes: nothing to judge, nothing to count, and no timer left to keep the process alive.
      () => {
        clearTimeout(timer);
        tunnel.close();
      },
    );
    const stopWatching = () => {
      clearTimeout(timer);
      stopHolding();
    };
    const refuse = (problem: string) =>
      flow.refused({ verdict: 'deny', list: 'invalid', rule: null, reason: problem });
    const finish = (problem: string) => {
      stopWatching();
      refuse(problem);
      tunnel.close();
    };
    const examine = () => {
      if (seen.length === 0) return;
      const verdict = checkFirstBytes(target, seen);
      if (verdict === 'wait') return;
      if (checkNames && verdict !== 'ok' && verdict !== 'tls' && verdict !== 'http')
        return finish(verdict);
      stopWatching();
      if (verdict !== 'http' && (!checkNames || verdict !== 'tls')) return tunnel.release(seen);
      // Every ClientHello the server acts on, or every request, is checked, not only the first.
      const guard =
        verdict === 'tls'
          ? new TlsHelloGuard((name) => serverNameProblem(target, name))
          : new RequestStreamGuard(
              (authority) => (checkNames ? authorityMismatch(target, authority) : undefined),
              leaks,
              admit,
            );
      tunnel.release(seen, guard, refuse);
    };
    examine();
  }
}
