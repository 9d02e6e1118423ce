import net from 'node:net';
import { ListenerGroup } from '../dns/index.js';
import type { EnforcedSandbox } from '../enforce/index.js';
import {
  type CanonicalName,
  canonicalName,
  formatDestination,
  type IPAddress,
  parseAuthority,
  parseIP,
} from '../policy/index.js';
import { ArrivingBytes } from '../net/index.js';
import { type Dialled, type Refusal, type Target, tunnelSocket } from './dial.js';
import { interceptorFor, type ProxyListen } from './egress.js';
import type { ProxyOptions } from './options.js';
import { writeRawError } from './http-errors.js';
import { headEnd, MAX_REQUEST_HEAD_BYTES, parseRequestHead } from './http1.js';
import type { Interceptor } from './intercept.js';
import { authorityMismatch, RequestStreamGuard } from './host-guard.js';
import { identify } from './identity.js';
import { originalDestination } from './original-destination.js';
import { looksLikeTls, peekName } from './peek.js';
import { TlsHelloGuard } from './tls-guard.js';
import { splice } from './splice.js';
import { flowAsk, spliceTunnel } from './tunnels.js';

const EMPTY = Buffer.alloc(0);

/**
 * The transparent listener, for TCP 80/443 that the kernel enforcer redirects here. The sandbox
 * is known by its source address; the destination is the name in the TLS ClientHello (SNI) or
 * the HTTP Host header, read without consuming a byte the origin must see. No name: closed,
 * since deciding addresses is the kernel's job on this path. Other TCP of a sandbox with an
 * upstream proxy comes through Moat's listener inside its namespace (adoptInside).
 */
export class TransparentProxy {
  private readonly server: net.Server;
  private readonly listeners: ListenerGroup;
  /** Every accepted connection still open, spliced or not: closing ends them all. */
  private readonly clients = new Set<net.Socket>();
  /** Moat's listeners inside sandbox namespaces (adoptInside); the runtime closes them. */
  private readonly inside = new Set<net.Server>();
  /** Intercepts TLS to destinations with a header rule (secretless egress), when configured. */
  private readonly interceptor: Interceptor | undefined;

  constructor(private readonly options: ProxyOptions) {
    this.server = net.createServer({ allowHalfOpen: true, noDelay: true }, (socket) => {
      if (this.admitted(socket)) this.accept(socket);
    });
    this.listeners = new ListenerGroup(this.server);
    this.interceptor = interceptorFor(options);
  }

  /** Listens on one more address; resolves to the bound port. */
  listen(address: ProxyListen): Promise<number> {
    return this.listeners.listen(address);
  }

  /**
   * Stops listening and ends every connection still open (the egress proxy's close, which closes
   * every registered tunnel, normally ended the spliced ones already, after its drain).
   */
  async close(): Promise<void> {
    for (const socket of this.clients) socket.destroy();
    this.interceptor?.close();
    await Promise.all([
      new Promise<void>((resolve) => this.server.close(() => resolve())),
      this.listeners.closeExtra(),
    ]);
  }

  /**
   * The source ports of the connections from `address` this listener and those inside sandbox
   * namespaces (adoptInside) hold now. From inside the sandbox they look like direct connections
   * to their original destination; whoever ends direct connections by address must leave these
   * alone (Moat decides them itself: by name, or by address for those redirected inside).
   */
  portsHeldFrom(address: string): Set<number> {
    const ports = new Set<number>();
    for (const client of this.clients) {
      const from = client.remoteAddress?.replace(/^::ffff:/, '');
      if (from === address && client.remotePort !== undefined) ports.add(client.remotePort);
    }
    return ports;
  }

  /**
   * Takes the connections of Moat's listener inside `sandboxID`'s namespace: TCP to other ports
   * than the web's that its firewall redirects there when it has an upstream proxy. Each is
   * decided by the address it was sent to and dialled at once (its server may speak first).
   */
  adoptInside(sandboxID: string, server: net.Server): void {
    if (this.inside.has(server)) return;
    this.inside.add(server);
    server.on('connection', (client) => this.acceptRedirected(sandboxID, client));
    server.on('close', () => this.inside.delete(server));
  }

  private acceptRedirected(sandboxID: string, client: net.Socket): void {
    if (!this.admitted(client, sandboxID)) return;
    client.on('error', () => client.destroy());
    const sandbox = this.options.table.get(sandboxID);
    const original = originalDestination(client);
    const ip = original === undefined ? undefined : parseIP(original.ip);
    // Not redirected (equal to where it arrived): a sandbox process dialled this listener.
    const redirected =
      original !== undefined &&
      !(original.ip === client.localAddress && original.port === client.localPort);
    if (!redirected || !ip?.ok || sandbox === undefined) {
      client.destroy();
      return;
    }
    const target = { ip: ip.value, port: original.port };
    void this.connect(sandbox, target, client, EMPTY, 'tcp');
  }

  /**
   * Charges a connection just accepted to its sandbox's connection budget (to `sandboxID` when
   * the listener it came to is that sandbox's own), tracked until it closes; false when it is
   * over budget, and then reset at once.
   */
  private admitted(client: net.Socket, sandboxID?: string): boolean {
    const hold = this.options.connections.admit('transparent', client.remoteAddress);
    if (hold === undefined || (sandboxID !== undefined && !hold.chargeTo(sandboxID))) {
      hold?.release();
      client.resetAndDestroy();
      return false;
    }
    this.track(client);
    client.once('close', () => hold.release());
    return true;
  }

  /** Tracks `client` until it closes. */
  private track(client: net.Socket): void {
    this.clients.add(client);
    client.once('close', () => this.clients.delete(client));
  }

  private accept(client: net.Socket): void {
    client.on('error', () => client.destroy());
    const who = identify(this.options.table, undefined, client, this.options.sourceIsProof);
    if (!who.ok) {
      this.options.metrics.proxyConnections.inc({
        kind: 'transparent',
        verdict: 'unauthenticated',
      });
      client.destroy();
      return;
    }
    const sandbox = who.sandbox;
    const arriving = new ArrivingBytes();
    let seen: Buffer = arriving.bytes;
    // Nothing names a destination yet: recorded as what the kernel redirected (the name unknown).
    const fail = (reason: string) => {
      this.options.flows.decided(
        {
          sandboxID: sandbox.sandboxID,
          kind: 'transparent',
          destination: { name: null, address: null, port: null, protocol: 'tcp' },
        },
        { verdict: 'deny', list: 'invalid', rule: null, reason },
      );
      // A reset, as the firewall refuses: a clean end would read as an empty answer.
      client.resetAndDestroy();
    };
    const { firstByteTimeoutMs, handshakeTimeoutMs, metrics } = this.options;
    const accepted = Date.now();
    // Silent, it holds its sandbox's budget only until the first-byte deadline; once it has
    // begun, its ClientHello or head has the handshake timeout from the connect.
    let timer = setTimeout(() => {
      metrics.budgetRefusals.inc({ resource: 'first_byte_deadline' });
      client.destroy();
    }, firstByteTimeoutMs);
    let begun = false;
    // A client that ends before naming its host is gone: nothing to wait for.
    const abandoned = () => client.destroy();
    const onData = (chunk: Buffer) => {
      if (!begun) {
        begun = true;
        clearTimeout(timer);
        timer = setTimeout(
          () => fail('no TLS ClientHello or HTTP request head within the handshake timeout'),
          Math.max(0, handshakeTimeoutMs - (Date.now() - accepted)),
        );
      }
      const scanned = seen.length;
      seen = arriving.append(chunk);
      const peek = peekName(seen, scanned);
      if (peek.status === 'incomplete') return;
      clearTimeout(timer);
      client.off('data', onData);
      client.off('end', abandoned);
      client.pause();
      if (peek.status === 'invalid') return fail(peek.reason);
      if (peek.name === undefined) return fail('the client named no host (no SNI, no Host header)');
      const tls = looksLikeTls(seen[0]!);
      const parsed = parseAuthority(peek.name);
      // The kernel redirects 443 and 80 only; a port in the Host header is not trusted.
      const ports = this.options.transparentPorts ?? { tls: 443, http: 80 };
      const port = tls ? ports.tls : ports.http;
      if (parsed.ok && parsed.value.ip !== undefined)
        return void this.toAddress(sandbox, client, seen, parsed.value.ip, port, tls);
      if (!parsed.ok || parsed.value.host === undefined)
        return fail(`${JSON.stringify(peek.name)} is not a host name`);
      const target = { host: parsed.value.host, port };
      void this.connect(sandbox, target, client, seen, tls ? 'tls' : 'http');
    };
    client.on('close', () => clearTimeout(timer));
    client.on('data', onData);
    client.once('end', abandoned);
  }

  /**
   * A web connection that names an address, not a host (`Host: 192.0.2.1`, or an address as
   * SNI): nothing names a host to decide, so it is decided by the address the kernel redirected
   * (the one named when it cannot say) as the firewall decides a direct web connection.
   * Refused, it is recorded with that address and the deciding rule, and reset.
   */
  private async toAddress(
    sandbox: EnforcedSandbox,
    client: net.Socket,
    seen: Buffer,
    named: IPAddress,
    port: number,
    tls: boolean,
  ): Promise<void> {
    const original = originalDestination(client);
    const redirected =
      original === undefined ||
      (original.ip === client.localAddress && original.port === client.localPort)
        ? undefined
        : parseIP(original.ip);
    const target =
      redirected?.ok === true
        ? { ip: redirected.value, port: original!.port }
        : { ip: named, port };
    const decision = this.options.dialer.check(sandbox, target, target.ip, true);
    if (decision.verdict === 'allow') return this.connect(sandbox, target, client, seen, 'tcp');
    const protocol = tls ? 'tls' : 'http';
    this.options.flows.decided(flowAsk('transparent', sandbox, target, protocol), decision);
    client.resetAndDestroy();
  }

  private async connect(
    sandbox: EnforcedSandbox,
    target: Target,
    client: net.Socket,
    seen: Buffer,
    protocol: 'tls' | 'http' | 'tcp',
  ): Promise<void> {
    const { dialer, metrics, logger, flows, fairShare } = this.options;
    const wait = fairShare?.wait(sandbox.sandboxID, 'the connection to', target);
    if (wait !== undefined && (await wait) !== undefined) return void client.resetAndDestroy();
    const plan = await dialer.plan(sandbox, target);
    const rule = plan.ok ? this.interceptor?.ruleFor(sandbox, target) : undefined;
    if (plan.ok && rule !== undefined) {
      if (protocol === 'http') {
        const { status, message, decision } = this.interceptor!.plainRefusal(sandbox, target)!;
        flows.decided(flowAsk('transparent', sandbox, target, protocol), decision!);
        return writeRawError(client, status, message, decision);
      }
      const at: Dialled = { ...target, ip: plan.addresses[0]!, via: sandbox.upstream };
      return this.interceptor!.intercept(
        'transparent',
        sandbox,
        target as Target & { host: CanonicalName },
        at,
        plan.decision,
        rule,
        client,
        seen,
      );
    }
    // The leak guard, as on the proxy: the first request is answered before anything is
    // dialled; later ones of the connection are checked by its guard below.
    const leak =
      plan.ok && protocol === 'http'
        ? await this.firstRequestLeak(sandbox, target, seen)
        : undefined;
    if (leak !== undefined) {
      flows.decided(flowAsk('transparent', sandbox, target, protocol), leak.decision!);
      return writeRawError(client, leak.status, leak.message, leak.decision);
    }
    // Raw TCP refused by its address gets a reset, as the firewall refuses direct TCP: a clean
    // end would read as an empty answer from the destination.
    const refuse = () => (protocol === 'tcp' ? client.resetAndDestroy() : client.destroy());
    const connected = plan.ok
      ? await dialer.reach(sandbox, target, plan.addresses, tunnelSocket)
      : plan;
    if (!connected.ok) {
      const { decision } = connected;
      if (decision) flows.decided(flowAsk('transparent', sandbox, target, protocol), decision);
      else {
        metrics.proxyConnections.inc({ kind: 'transparent', verdict: 'failed' });
        logger.info(
          {
            sandboxID: sandbox.sandboxID,
            kind: 'transparent',
            destination: formatDestination(target),
            reason: connected.message,
          },
          'egress failed',
        );
      }
      refuse();
      return;
    }
    const dialled: Dialled = { ...target, ip: connected.ip, via: connected.via };
    // Decided again: the policy may have changed, or the sandbox gone, while we dialled.
    const now = dialer.check(sandbox, dialled, connected.ip);
    if (client.destroyed || !this.options.table.holds(sandbox) || now.verdict === 'deny') {
      connected.socket.destroy();
      refuse();
      if (now.verdict === 'deny')
        flows.decided(flowAsk('transparent', sandbox, dialled, protocol), now);
      return;
    }
    const upstream = connected.socket;
    const flow = flows.opened(flowAsk('transparent', sandbox, dialled, protocol), now);
    const tunnel = spliceTunnel(this.options, flow, sandbox, dialled, (options) =>
      splice(client, upstream, options),
    );
    const refused = (problem: string) =>
      flow.refused({ verdict: 'deny', list: 'invalid', rule: null, reason: problem });
    // The first ClientHello's name, or the first request's Host, chose the destination: every
    // later one the server acts on must name it too. Other protocols were decided by address.
    const guard =
      protocol === 'tcp'
        ? undefined
        : protocol === 'tls'
          ? new TlsHelloGuard((name) => {
              const canonical = name === undefined ? undefined : canonicalName(name);
              return canonical?.ok && canonical.value === target.host
                ? undefined
                : `the TLS server name ${JSON.stringify(name)} is not ${target.host}`;
            })
          : new RequestStreamGuard(
              (authority) => authorityMismatch(target, authority),
              this.interceptor?.leakInspector(sandbox, target),
              fairShare && (() => fairShare.admitNow(sandbox.sandboxID, 'a request to', target)),
            );
    tunnel.release(seen, guard, refused);
  }

  /** The leak guard's refusal of a plain-HTTP connection's first request (the peek read it whole). */
  private async firstRequestLeak(
    sandbox: EnforcedSandbox,
    target: Target,
    seen: Buffer,
  ): Promise<Refusal | undefined> {
    if (this.interceptor === undefined) return undefined;
    const end = headEnd(seen, MAX_REQUEST_HEAD_BYTES);
    const parsed = typeof end === 'number' ? parseRequestHead(seen.subarray(0, end)) : undefined;
    // A head that does not parse is the guard's to refuse.
    if (parsed?.ok !== true) return undefined;
    return this.interceptor.leakRefusal(sandbox, target, parsed.value);
  }
}
