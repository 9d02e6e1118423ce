import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type net from 'node:net';
import type { Logger } from 'pino';
import { ListenerGroup } from '../dns/index.js';
import type { EnforcedSandbox, EnforcementTable } from '../enforce/index.js';
import type { MoatMetrics, ProxyKind, ProxyVerdict } from '../metrics/index.js';
import { canonicalName, formatDestination, parseAuthority } from '../policy/index.js';
import { type Dialer, denial, type Refusal, type Target } from './dial.js';
import { sendError, writeRawError } from './http-errors.js';
import { identify } from './identity.js';
import { looksLikeTls, peekHttpHost, peekTlsServerName } from './peek.js';
import type { Splice } from './splice.js';
import { spliceTunnel, type TunnelRegistry } from './tunnels.js';

export interface ProxyListen {
  readonly host: string;
  readonly port: number;
}

export interface ProxyOptions {
  readonly table: EnforcementTable;
  readonly dialer: Dialer;
  readonly tunnels: TunnelRegistry;
  readonly metrics: MoatMetrics;
  readonly logger: Logger;
  /** Close CONNECT tunnels whose TLS SNI (or port-80 Host) names another host than CONNECT did. */
  readonly checkServerName: boolean;
  readonly maxTunnelsPerSandbox: number;
  /** Time a client has to send its request head, or its first tunnel bytes when they are checked. */
  readonly handshakeTimeoutMs: number;
  readonly idleTimeoutMs: number;
  /** Destination ports of traffic the kernel redirects to the transparent listener (443, 80). */
  readonly transparentPorts?: { readonly tls: number; readonly http: number };
}

/** Headers that describe one hop, never forwarded (RFC 9110 7.6.1), plus proxy credentials. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authorization',
  'proxy-authenticate',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

function endToEndHeaders(headers: http.IncomingHttpHeaders): http.OutgoingHttpHeaders {
  const named = new Set(
    String(headers.connection ?? '')
      .split(',')
      .map((token) => token.trim().toLowerCase()),
  );
  const out: http.OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined && !HOP_BY_HOP.has(name) && !named.has(name)) out[name] = value;
  }
  return out;
}

/** The Host header for a target, as the absolute URI gave it (RFC 9112 3.2.2). */
function hostHeader(target: Target): string {
  const host = target.host ?? (target.ip!.version === 6 ? `[${target.ip!.text}]` : target.ip!.text);
  return target.port === 80 ? host : `${host}:${target.port}`;
}

/** Reads the first bytes of a tunnel and says whether they name the host CONNECT named. */
function checkFirstBytes(target: Target, data: Buffer): 'wait' | 'ok' | string {
  const tls = looksLikeTls(data[0]!);
  if (!tls && target.port !== 80) return 'ok';
  const peek = tls ? peekTlsServerName(data) : peekHttpHost(data);
  if (peek.status === 'incomplete') return 'wait';
  if (peek.status === 'invalid')
    return `its first bytes are not a valid ${tls ? 'TLS ClientHello' : 'HTTP request'}: ${peek.reason}`;
  const named = peek.name;
  const what = tls ? 'TLS server name' : 'Host header';
  if (target.host === undefined) {
    // A tunnel to an address may not name a host in TLS; HTTP may only name that address.
    if (named === undefined) return 'ok';
    const host = tls ? undefined : parseAuthority(named);
    return host?.ok && host.value.ip?.text === target.ip?.text
      ? 'ok'
      : `the ${what} ${JSON.stringify(named)} names a host, but CONNECT named an address`;
  }
  if (named === undefined) return `the tunnel to ${target.host} sends no ${what}`;
  let name: string | undefined;
  if (tls) {
    const canonical = canonicalName(named);
    name = canonical.ok ? canonical.value : undefined;
  } else {
    const authority = parseAuthority(named);
    name = authority.ok ? authority.value.host : undefined;
  }
  return name === target.host
    ? 'ok'
    : `the ${what} ${JSON.stringify(named)} is not ${target.host} (domain fronting)`;
}

/**
 * The explicit egress proxy: `CONNECT host:port` and absolute-form HTTP (`GET http://host/`),
 * each request on a keep-alive connection decided on its own.
 */
export class EgressProxy {
  private readonly server: http.Server;
  private readonly listeners: ListenerGroup;
  private readonly agents = new Map<string, http.Agent>();

  constructor(private readonly options: ProxyOptions) {
    this.server = http.createServer({
      maxHeaderSize: 16 * 1024,
      headersTimeout: options.handshakeTimeoutMs,
      requestTimeout: 0,
      keepAliveTimeout: 30_000,
    });
    this.server.maxHeadersCount = 100;
    this.listeners = new ListenerGroup(this.server);
    this.server.on('connect', (req: IncomingMessage, socket: net.Socket, head: Buffer) => {
      void this.onConnect(req, socket, head);
    });
    this.server.on('request', (req, res) => {
      void this.onRequest(req, res);
    });
    this.server.on('clientError', (_error, socket) =>
      writeRawError(socket as net.Socket, 400, 'malformed HTTP request'),
    );
    // Pooled upstream connections of a sandbox whose policy changed are dropped: every new
    // request is decided again anyway, and nothing idles towards a now-denied address.
    options.table.subscribe((event) => {
      this.agents.get(event.sandboxID)?.destroy();
      this.agents.delete(event.sandboxID);
    });
  }

  /** Listens on one more address; resolves to the bound port. */
  listen(address: ProxyListen): Promise<number> {
    return this.listeners.listen(address);
  }

  /** Stops accepting, lets open tunnels finish for up to `drainMs`, then closes what is left. */
  async close(drainMs = 0): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    const extraClosed = this.listeners.closeExtra();
    this.server.closeIdleConnections();
    const deadline = Date.now() + drainMs;
    while (this.options.tunnels.size > 0 && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 20));
    for (const tunnel of this.options.tunnels.all()) tunnel.close();
    this.server.closeAllConnections();
    for (const agent of this.agents.values()) agent.destroy();
    await Promise.all([closed, extraClosed]);
  }

  private count(kind: ProxyKind, verdict: ProxyVerdict): void {
    this.options.metrics.proxyConnections.inc({ kind, verdict });
  }

  /** Logs and counts a refusal; returns it for the caller to send. */
  private refused(
    kind: ProxyKind,
    sandbox: EnforcedSandbox,
    target: Target,
    refusal: Refusal,
  ): Refusal {
    if (refusal.decision !== undefined) {
      const { list, rule, reason } = refusal.decision;
      this.count(kind, 'denied');
      this.options.metrics.proxyDenials.inc({ kind, list });
      this.options.logger.info(
        {
          sandboxID: sandbox.sandboxID,
          kind,
          destination: formatDestination(target),
          rule,
          list,
          reason,
        },
        'egress denied',
      );
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

  private tunnelLimit(sandbox: EnforcedSandbox, target: Target): Refusal | undefined {
    const max = this.options.maxTunnelsPerSandbox;
    if (this.options.tunnels.count(sandbox.sandboxID) < max) return undefined;
    return {
      status: 429,
      message: `sandbox ${sandbox.sandboxID} already has ${max} open connections; ${formatDestination(target)} refused`,
    };
  }

  /** Traffic no sandbox owns: counted and logged (never with the credential it carried). */
  private unidentified(kind: 'connect' | 'forward', req: IncomingMessage, reason: string): void {
    this.count(kind, 'unauthenticated');
    this.options.logger.info(
      { kind, client: req.socket.remoteAddress, destination: req.url, reason },
      'egress refused: no sandbox identified',
    );
  }

  private async onConnect(req: IncomingMessage, client: net.Socket, head: Buffer): Promise<void> {
    client.on('error', () => client.destroy());
    const who = identify(
      this.options.table,
      req.headers['proxy-authorization'],
      req.socket.remoteAddress,
    );
    if (!who.ok) {
      this.unidentified('connect', req, who.reason);
      return writeRawError(client, 407, who.reason, undefined, {
        'Proxy-Authenticate': 'Basic realm="moat"',
      });
    }
    const sandbox = who.sandbox;
    const parsed = parseAuthority(req.url ?? '');
    if (!parsed.ok || parsed.value.port === undefined) {
      this.count('connect', 'invalid');
      const why = parsed.ok ? 'it has no port' : parsed.error;
      return writeRawError(
        client,
        400,
        `CONNECT target ${JSON.stringify(req.url)} must be host:port or [ipv6]:port: ${why}`,
      );
    }
    const target = parsed.value as Target;
    const refuse = (refusal: Refusal) => {
      const { status, message, decision } = this.refused('connect', sandbox, target, refusal);
      writeRawError(client, status, message, decision);
    };
    const limited = this.tunnelLimit(sandbox, target);
    if (limited) return refuse(limited);
    const plan = await this.options.dialer.plan(sandbox, target);
    if (!plan.ok) return refuse(plan);
    const connected = await this.options.dialer.connect(target, plan.addresses);
    if (!connected.ok) return refuse(connected);
    const upstream = connected.socket;
    const dialled: Target = { ...target, ip: connected.ip };
    // The policy may have changed while we dialled: decide once more, then register.
    const now = this.options.dialer.check(sandbox, dialled, connected.ip);
    if (now.verdict === 'deny' || client.destroyed) {
      upstream.destroy();
      return now.verdict === 'deny' ? refuse(denial(dialled, now)) : undefined;
    }
    this.count('connect', 'allowed');
    this.options.logger.debug(
      { sandboxID: sandbox.sandboxID, kind: 'connect', destination: formatDestination(dialled) },
      'egress allowed',
    );
    client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    const tunnel = spliceTunnel(this.options, 'connect', sandbox, dialled, client, upstream);
    if (!this.options.checkServerName) return tunnel.release(head);
    this.holdUntilChecked(sandbox, dialled, client, head, tunnel);
  }

  /** Holds client bytes until the first ones show the tunnel talks to the host CONNECT named. */
  private holdUntilChecked(
    sandbox: EnforcedSandbox,
    target: Target,
    client: net.Socket,
    head: Buffer,
    tunnel: Splice,
  ): void {
    let seen = head;
    const timer = setTimeout(
      () => finish('no first bytes within the handshake timeout'),
      this.options.handshakeTimeoutMs,
    );
    const stopWatching = () => {
      clearTimeout(timer);
      client.off('data', onData);
      client.off('end', abandoned);
      client.off('close', stopWatching);
    };
    // The client left (or the tunnel closed for another reason) before showing its first bytes:
    // nothing to judge, nothing to count, and no timer left to keep the process alive.
    const abandoned = () => {
      stopWatching();
      tunnel.close();
    };
    const finish = (problem: string | undefined) => {
      stopWatching();
      if (problem === undefined) return tunnel.release(seen);
      this.options.metrics.proxyDenials.inc({ kind: 'connect', list: 'invalid' });
      this.options.logger.info(
        {
          sandboxID: sandbox.sandboxID,
          kind: 'connect',
          destination: formatDestination(target),
          reason: problem,
        },
        'tunnel closed',
      );
      tunnel.close();
    };
    const examine = () => {
      if (seen.length === 0) return;
      const verdict = checkFirstBytes(target, seen);
      if (verdict !== 'wait') finish(verdict === 'ok' ? undefined : verdict);
    };
    const onData = (chunk: Buffer) => {
      seen = seen.length === 0 ? chunk : Buffer.concat([seen, chunk]);
      examine();
    };
    client.on('data', onData);
    client.once('end', abandoned);
    client.once('close', stopWatching);
    examine();
  }

  private agentFor(sandboxID: string): http.Agent {
    let agent = this.agents.get(sandboxID);
    if (agent === undefined) {
      agent = new http.Agent({
        keepAlive: true,
        maxSockets: this.options.maxTunnelsPerSandbox,
        // As many idle connections as may be busy: fewer means reconnecting under steady load.
        maxFreeSockets: this.options.maxTunnelsPerSandbox,
      });
      this.agents.set(sandboxID, agent);
    }
    return agent;
  }

  /** Absolute-form HTTP: `GET http://host[:port]/path`, forwarded to a decided address. */
  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = req.url ?? '';
    const scheme = /^http:\/\//i.exec(url);
    if (!scheme) {
      this.count('forward', 'invalid');
      const hint = /^https:\/\//i.test(url)
        ? 'use CONNECT for https'
        : 'send absolute-form requests (GET http://host/path) or CONNECT host:port';
      return sendError(res, 400, `Moat is an egress proxy: ${hint}`);
    }
    const who = identify(
      this.options.table,
      req.headers['proxy-authorization'],
      req.socket.remoteAddress,
    );
    if (!who.ok) {
      this.unidentified('forward', req, who.reason);
      return sendError(res, 407, who.reason, undefined, {
        'Proxy-Authenticate': 'Basic realm="moat"',
      });
    }
    const sandbox = who.sandbox;
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
      return sendError(res, 400, `request target ${JSON.stringify(url)}: ${parsed.error}`);
    }
    const target: Target = { ...parsed.value, port: parsed.value.port ?? 80 };
    const refuse = (refusal: Refusal) => {
      const { status, message, decision } = this.refused('forward', sandbox, target, refusal);
      sendError(res, status, message, decision);
    };
    const limited = this.tunnelLimit(sandbox, target);
    if (limited) return refuse(limited);
    const plan = await this.options.dialer.plan(sandbox, target);
    if (!plan.ok) return refuse(plan);
    // Retrying another address is only safe while no body has been sent.
    const bodiless =
      req.headers['content-length'] === undefined && req.headers['transfer-encoding'] === undefined;
    const addresses = bodiless ? plan.addresses : plan.addresses.slice(0, 1);
    const headers = { ...endToEndHeaders(req.headers), host: hostHeader(target) };
    this.count('forward', 'allowed');
    for (const [index, ip] of addresses.entries()) {
      const last = index === addresses.length - 1;
      const outcome = await this.forwardOnce(
        sandbox,
        { ...target, ip },
        path,
        headers,
        req,
        res,
        last,
        bodiless,
      );
      if (outcome !== 'retry') return;
    }
  }

  /** One attempt to forward to one address; 'retry' when it could not connect and may try another. */
  private forwardOnce(
    sandbox: EnforcedSandbox,
    target: Target,
    path: string,
    headers: http.OutgoingHttpHeaders,
    req: IncomingMessage,
    res: ServerResponse,
    last: boolean,
    bodiless: boolean,
  ): Promise<'done' | 'retry'> {
    return new Promise((resolve) => {
      const started = performance.now();
      const upstream = http.request({
        agent: this.agentFor(sandbox.sandboxID),
        host: target.ip!.text,
        port: target.port,
        method: req.method,
        path,
        headers,
        setHost: false,
      });
      let connected = false;
      const remove = this.options.tunnels.add({
        sandboxID: sandbox.sandboxID,
        target,
        close: (decision) => {
          if (decision !== undefined)
            this.options.metrics.proxyDenials.inc({ kind: 'forward', list: decision.list });
          upstream.destroy();
          res.destroy();
        },
      });
      const timer = setTimeout(
        () => upstream.destroy(new Error('connect timeout')),
        this.options.dialer.connectTimeoutMs,
      );
      upstream.on('socket', (socket: net.Socket) => {
        const ready = () => {
          connected = true;
          clearTimeout(timer);
          this.options.metrics.proxyDialDuration.observe((performance.now() - started) / 1000);
        };
        if (socket.connecting) socket.once('connect', ready);
        else ready();
      });
      // On the request, not the pooled socket: the request removes its own listener when it
      // ends, a listener added to the socket would stay for every later request.
      upstream.setTimeout(this.options.idleTimeoutMs, () =>
        upstream.destroy(new Error('idle timeout')),
      );
      upstream.on('response', (answer) => {
        res.writeHead(
          answer.statusCode ?? 502,
          answer.statusMessage,
          endToEndHeaders(answer.headers),
        );
        answer.pipe(res);
        answer.on('end', () => {
          remove();
          resolve('done');
        });
        answer.on('error', () => res.destroy());
      });
      upstream.on('error', (error: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        remove();
        if (!connected && !last) return resolve('retry');
        const timedOut = error.message === 'connect timeout';
        const status = connected ? 502 : timedOut ? 504 : 502;
        const what = formatDestination(target);
        this.count('forward', 'failed');
        sendError(
          res,
          status,
          connected
            ? `${what} failed: ${error.code ?? error.message}`
            : timedOut
              ? `${what} did not answer in time`
              : `${what} refused the connection (${error.code ?? error.message})`,
        );
        resolve('done');
      });
      res.on('close', () => {
        if (!res.writableFinished) upstream.destroy();
      });
      if (bodiless) upstream.end();
      else req.pipe(upstream);
    });
  }
}
