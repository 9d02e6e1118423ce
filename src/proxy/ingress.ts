/**
 * Ingress: requests for `{port}-{sandboxID}.{domain}` (ports other than envd's 49983) proxied to
 * that port of the sandbox. The sandbox listener's router parses the address and looks the
 * sandbox up; this checks the traffic token, rewrites the headers and carries the bytes.
 */
import http, {
  type ClientRequest,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type OutgoingHttpHeaders,
  type ServerResponse,
  STATUS_CODES,
} from 'node:http';
import https from 'node:https';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import type { Logger } from 'pino';
import { endAndLinger } from './http-errors.js';
import { foldsToConnectionField, isHopByHop } from './http1.js';
import { type Splice, splice } from './splice.js';
import { jsonAnswer, sandboxErrorBody, sendSandboxError } from '../e2b-wire/index.js';
import { sameSecret } from '../secret-compare/index.js';
import type { FlowAsk, FlowRecorder, OpenFlow } from '../flows/index.js';

export interface IngressTarget {
  readonly sandboxID: string;
  /** Address to dial for the sandbox's ports (the process runtime: 127.0.0.1). */
  readonly host: string;
  readonly port: number;
  /** When set, header e2b-traffic-access-token must equal it (constant-time), else 403. */
  readonly trafficToken: string | null;
  /** e.g. "localhost:${PORT}": ${PORT} replaced by the target port; becomes the upstream Host. */
  readonly maskRequestHost: string | null;
  /**
   * The port serves TLS (E2B's `httpsPorts`): it is reached over TLS, its certificate not
   * verified (it is the sandbox's own, often self-signed), as E2B's proxy does.
   */
  readonly tls?: boolean;
  /**
   * The target is the sandbox listener of the Moat node that hosts the sandbox: the request
   * goes on as it came (Host, traffic token), for that node to route and check.
   */
  readonly relay?: boolean;
  /**
   * Where the port is really served (the address to dial instead of `host`), or why it is no
   * target of this sandbox's (502); asked once the traffic token passed (a client without it
   * learns nothing of the sandbox's ports). Unset: `host` serves every port.
   */
  readonly locate?: () => Promise<{ readonly host: string } | { readonly refused: string }>;
}

export interface IngressOptions {
  readonly logger: Logger;
  /** Where every request's decision (the traffic token's, the port's) and close are recorded. */
  readonly flows: FlowRecorder;
  /** Time to get a connection to the sandbox's port (504 after it). */
  readonly connectTimeoutMs: number;
  /**
   * Inactivity allowed on an upstream connection: before the response head it means the
   * service does not answer (504), afterwards the exchange is torn down. Idle pooled
   * keep-alive connections are closed after it too.
   */
  readonly idleTimeoutMs: number;
}

export const TRAFFIC_TOKEN_HEADER = 'e2b-traffic-access-token';

/** Upstream connections per sandbox port (the Agent keys its pools by host:port). */
const MAX_SOCKETS_PER_PORT = 256;
const MAX_FREE_SOCKETS_PER_PORT = 64;
/** How long a refused or declined client may stay quiet before its socket is freed. */
const ENDING_LINGER_MS = 10_000;

/** The placeholder E2B defines in maskRequestHost (a plain string, not a template). */
const PORT_PLACEHOLDER = '${PORT}';

/**
 * The end-to-end headers: without hop-by-hop ones, those the Connection header names, and
 * Upgrade unless `keepUpgrade` (an upgrade request or 101 answer needs it).
 */
function endToEnd(headers: IncomingHttpHeaders, keepUpgrade: boolean): OutgoingHttpHeaders {
  const named = new Set(
    String(headers.connection ?? '')
      .split(',')
      .map((token) => token.trim().toLowerCase()),
  );
  if (keepUpgrade) named.delete('upgrade');
  // No prototype: a header named like an Object member (`__proto__`) stays a header.
  const out: OutgoingHttpHeaders = Object.create(null);
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || named.has(name) || name === 'transfer-encoding') continue;
    // Node's parser takes `Transfer_Encoding` as any other field; the sandbox's server may not.
    if (foldsToConnectionField(name)) continue;
    if (isHopByHop(name) && !(name === 'upgrade' && keepUpgrade)) continue;
    out[name] = value;
  }
  return out;
}

function tokenMatches(given: string | string[] | undefined, expected: string): boolean {
  return typeof given === 'string' && sameSecret(given, expected);
}

/** `::ffff:1.2.3.4` as `1.2.3.4`: what the sandbox's service expects to read. */
function clientAddress(address: string | undefined): string | undefined {
  return address?.startsWith('::ffff:') && net.isIPv4(address.slice(7))
    ? address.slice(7)
    : address;
}

/**
 * The headers sent to the sandbox. X-Forwarded-For is appended to (Moat may sit behind a load
 * balancer); X-Forwarded-Host and -Proto are Moat's own statements and replace the client's.
 */
function upstreamHeaders(
  request: IncomingMessage,
  target: IngressTarget,
  upgrade: boolean,
): OutgoingHttpHeaders {
  const headers = endToEnd(request.headers, upgrade);
  const original = request.headers.host;
  if (!target.relay) {
    delete headers[TRAFFIC_TOKEN_HEADER];
    delete headers['x-forwarded-host'];
    headers.host =
      target.maskRequestHost?.replaceAll(PORT_PLACEHOLDER, String(target.port)) ??
      original ??
      `${target.host}:${target.port}`;
    if (original !== undefined) headers['x-forwarded-host'] = original;
  }
  headers['x-forwarded-proto'] = (request.socket as TLSSocket).encrypted ? 'https' : 'http';
  const client = clientAddress(request.socket.remoteAddress);
  const prior = request.headers['x-forwarded-for'];
  if (client !== undefined) headers['x-forwarded-for'] = prior ? `${prior}, ${client}` : client;
  if (upgrade) headers.connection = 'Upgrade';
  // The body was decoded on the way in; an unknown length goes on chunked (Node frames it).
  else if (request.headers['transfer-encoding'] !== undefined) {
    headers['transfer-encoding'] = 'chunked';
    delete headers['content-length'];
  }
  return canonicalNames(headers);
}

/**
 * `x-forwarded-for` as `X-Forwarded-For`: Node sends names as given (lower case, as it parsed
 * them), while the reference ingress writes the canonical form and services that read the raw
 * request (or compare case-sensitively) expect it.
 */
function canonicalNames(headers: OutgoingHttpHeaders): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = Object.create(null);
  for (const [name, value] of Object.entries(headers)) {
    const canonical = name
      .toLowerCase()
      .replace(/(^|-)([a-z])/g, (_m, dash: string, letter: string) => dash + letter.toUpperCase());
    out[canonical] = value;
  }
  return out;
}

/** A response head for a raw socket (upgrade requests have no ServerResponse). */
function rawHead(status: number, reason: string, headers: [string, string][]): string {
  const lines = headers.map(([name, value]) => `${name}: ${value}\r\n`).join('');
  return `HTTP/1.1 ${status} ${reason}\r\n${lines}\r\n`;
}

/** The raw header pairs of an answer, in order and case, minus the hop-by-hop ones. */
function rawEndToEnd(answer: IncomingMessage, keepUpgrade: boolean): [string, string][] {
  const kept = endToEnd(answer.headers, keepUpgrade);
  const pairs: [string, string][] = [];
  for (let i = 0; i + 1 < answer.rawHeaders.length; i += 2) {
    const name = answer.rawHeaders[i]!;
    if (Object.hasOwn(kept, name.toLowerCase())) pairs.push([name, answer.rawHeaders[i + 1]!]);
  }
  return pairs;
}

/** Destroys the upstream request when a timer runs out; the phase then says which timer. */
class UpstreamTimeout extends Error {
  constructor() {
    super('timeout');
  }
}

type Phase = 'connecting' | 'waiting' | 'answered';

/** How a failure before the response head is reported to the client. */
function failure(
  error: NodeJS.ErrnoException,
  phase: Phase,
  target: IngressTarget,
  options: IngressOptions,
): { status: 502 | 504; message: string } {
  const where = `port ${target.port} of sandbox ${target.sandboxID}`;
  if (error instanceof UpstreamTimeout)
    return phase === 'connecting'
      ? {
          status: 504,
          message: `${where} did not accept a connection within ${options.connectTimeoutMs} ms`,
        }
      : { status: 504, message: `${where} sent no response within ${options.idleTimeoutMs} ms` };
  const code = error.code ?? error.message;
  if (phase !== 'connecting')
    return { status: 502, message: `${where} closed the connection without a response (${code})` };
  return code === 'ECONNREFUSED'
    ? {
        status: 502,
        message: `no service listening on ${where}; a server in the sandbox must listen on 0.0.0.0 (every address), not only 127.0.0.1`,
      }
    : { status: 502, message: `${where} is unreachable (${code})` };
}

/** What the caller of `dial` does when the upstream fails. */
interface DialHandlers {
  /** Before any answer: tell the client `status` and `message`. */
  readonly refuse: (status: number, message: string) => void;
  /** After the answer began: nothing can be said any more, tear the client side down. */
  readonly broken: () => void;
  /** True when the client went away first (its leaving is why the upstream failed). */
  readonly gone: () => boolean;
}

/** An ingress request as a flow: to a port of the sandbox, at the address it is dialled on. */
function ingressAsk(target: IngressTarget): FlowAsk {
  return {
    sandboxID: target.sandboxID,
    kind: 'ingress',
    destination: { name: null, address: target.host, port: target.port, protocol: 'http' },
  };
}

export class IngressProxy {
  private readonly agent: http.Agent;
  /** The same pool, for ports that serve TLS. */
  private readonly tlsAgent: https.Agent;
  /** Open upgraded connections: detached from every server, so `close` ends them. */
  private readonly splices = new Set<Splice>();
  /** Raw sockets answered and ending (refusals, declined upgrades): destroyed on close. */
  private readonly ending = new Set<net.Socket>();

  constructor(private readonly options: IngressOptions) {
    const pool: http.AgentOptions = {
      keepAlive: true,
      maxSockets: MAX_SOCKETS_PER_PORT,
      maxFreeSockets: MAX_FREE_SOCKETS_PER_PORT,
      // Applies to pooled sockets: the Agent destroys a free socket that idles this long.
      timeout: options.idleTimeoutMs,
      scheduling: 'lifo',
    };
    this.agent = new http.Agent(pool);
    this.tlsAgent = new https.Agent({ ...pool, rejectUnauthorized: false });
  }

  /** Proxies one HTTP request (bodies streamed both ways, with backpressure). */
  async request(
    request: IncomingMessage,
    response: ServerResponse,
    target: IngressTarget,
  ): Promise<void> {
    const log = this.logger(target);
    if (!this.admitted(request, target))
      return sendSandboxError(response, 403, this.forbidden(request, target), target.sandboxID);
    const located = await this.locate(target);
    if ('refused' in located)
      return sendSandboxError(response, 502, located.refused, target.sandboxID);
    const flow = this.admit(located);
    let gone = false;
    const upstream = this.dial(request, located, false, log, {
      refuse: (status, message) => sendSandboxError(response, status, message, target.sandboxID),
      broken: () => response.destroy(),
      gone: () => gone,
    });
    if (upstream === undefined) return;
    upstream.on('response', (answer) => {
      answer.on('error', () => response.destroy());
      answer.on('close', () => {
        if (!answer.complete) response.destroy();
      });
      response.writeHead(
        answer.statusCode ?? 502,
        answer.statusMessage,
        endToEnd(answer.headers, false),
      );
      answer.pipe(response);
      answer.on('end', () =>
        log.debug({ method: request.method, status: answer.statusCode }, 'ingress request'),
      );
    });
    // The bytes this request moved on its (possibly pooled) upstream connection.
    let counted: { socket: net.Socket; up: number; down: number } | undefined;
    upstream.once('socket', (socket: net.Socket) => {
      counted = { socket, up: socket.bytesWritten, down: socket.bytesRead };
    });
    // Fires when the response is done or the client's connection went away (mid-body too).
    response.on('close', () => {
      const finished = response.writableFinished;
      flow.closed(
        counted === undefined ? 0 : counted.socket.bytesWritten - counted.up,
        counted === undefined ? 0 : counted.socket.bytesRead - counted.down,
        finished ? 'closed' : 'error',
      );
      if (finished) return;
      gone = true;
      upstream.destroy();
    });
    request.on('error', () => upstream.destroy());
    request.pipe(upstream);
  }

  /** Proxies an Upgrade request (WebSocket or other): checks as above, then splices raw bytes. */
  async upgrade(
    request: IncomingMessage,
    socket: Duplex,
    head: Buffer,
    target: IngressTarget,
  ): Promise<void> {
    const log = this.logger(target);
    socket.on('error', () => socket.destroy());
    if (!this.admitted(request, target))
      return this.refuse(socket, 403, this.forbidden(request, target), target.sandboxID);
    const located = await this.locate(target);
    if ('refused' in located) return this.refuse(socket, 502, located.refused, target.sandboxID);
    const flow = this.admit(located);
    if (!(socket instanceof net.Socket)) {
      // Node's servers always hand over a net.Socket (or a TLSSocket, which is one).
      log.error('ingress upgrade on a stream that is not a socket');
      socket.destroy();
      return;
    }
    let joined = false;
    const upstream = this.dial(request, located, true, log, {
      refuse: (status, message) => this.refuse(socket, status, message, target.sandboxID),
      broken: () => socket.destroy(),
      gone: () => socket.destroyed,
    });
    if (upstream === undefined) return;
    socket.on('close', () => {
      if (!joined) upstream.destroy();
    });
    upstream.on('upgrade', (answer: IncomingMessage, upstreamSocket: net.Socket, rest: Buffer) => {
      joined = true;
      if (socket.destroyed) return upstreamSocket.destroy();
      const status = answer.statusCode ?? 101;
      // Connection is hop-by-hop, but a 101 must say it is an upgrade on this hop too.
      const headers = [...rawEndToEnd(answer, true), ['Connection', 'Upgrade'] as [string, string]];
      socket.write(rawHead(status, answer.statusMessage ?? '', headers));
      if (rest.length > 0) socket.write(rest);
      log.debug({ status, protocol: answer.headers.upgrade }, 'ingress upgrade');
      const spliced = splice(socket, upstreamSocket, {
        idleTimeoutMs: this.options.idleTimeoutMs,
        onClose: (up, down, end) => {
          this.splices.delete(spliced);
          flow.closed(up, down, end);
          log.debug({ bytesUp: up, bytesDown: down }, 'ingress upgrade closed');
        },
      });
      this.splices.add(spliced);
      // Bytes the client sent after its request head belong to the upgraded protocol.
      spliced.release(head);
    });
    // The service declined the upgrade: relay its answer, then close (the body ends with it).
    upstream.on('response', (answer) => {
      answer.on('error', () => socket.destroy());
      answer.on('close', () => {
        if (!answer.complete) socket.destroy();
      });
      const headers = rawEndToEnd(answer, false);
      headers.push(['Connection', 'close']);
      socket.write(rawHead(answer.statusCode ?? 502, answer.statusMessage ?? '', headers));
      answer.pipe(socket, { end: false });
      answer.on('end', () => this.end(socket as net.Socket));
    });
    upstream.end();
  }

  /** Closes upstream keep-alive connections and open upgraded connections (Moat stopping). */
  close(): void {
    this.agent.destroy();
    this.tlsAgent.destroy();
    for (const spliced of [...this.splices]) spliced.close();
    for (const socket of this.ending) socket.destroy();
  }

  /**
   * Ends a raw socket after `text` and frees it once the client closes (or goes quiet): an
   * upgrade socket is not read by anyone, so its FIN would otherwise never be seen.
   */
  private end(socket: net.Socket, text?: string): void {
    if (socket.destroyed) return;
    this.ending.add(socket);
    socket.once('close', () => this.ending.delete(socket));
    endAndLinger(socket, text, ENDING_LINGER_MS);
  }

  private logger(target: IngressTarget): Logger {
    return this.options.logger.child({ sandboxID: target.sandboxID, port: target.port });
  }

  /** The target as it is dialed (its listener's own address), or why it is refused (recorded). */
  private async locate(target: IngressTarget): Promise<IngressTarget | { refused: string }> {
    if (target.locate === undefined) return target;
    const where = await target.locate().catch((error: Error) => ({
      refused: `cannot read the ports of sandbox ${target.sandboxID}: ${error.message}`,
    }));
    if ('refused' in where) {
      this.options.flows.decided(ingressAsk(target), {
        verdict: 'deny',
        list: 'ports',
        rule: null,
        reason: where.refused,
      });
      return where;
    }
    return { ...target, host: where.host };
  }

  /** The traffic token check. The token itself is never logged or recorded. */
  private admitted(request: IncomingMessage, target: IngressTarget): boolean {
    if (target.trafficToken === null) return true;
    const given = request.headers[TRAFFIC_TOKEN_HEADER];
    if (tokenMatches(given, target.trafficToken)) return true;
    this.options.flows.decided(ingressAsk(target), {
      verdict: 'deny',
      list: 'trafficToken',
      rule: null,
      reason: `${given === undefined ? 'missing' : 'wrong'} traffic access token`,
    });
    return false;
  }

  /** Records a request let through to the sandbox's port. */
  private admit(target: IngressTarget): OpenFlow {
    const token = target.trafficToken !== null;
    return this.options.flows.opened(ingressAsk(target), {
      verdict: 'allow',
      list: token ? 'trafficToken' : 'public',
      rule: null,
      reason: token ? 'the traffic access token matched' : 'the sandbox takes public traffic',
    });
  }

  private forbidden(request: IncomingMessage, target: IngressTarget): string {
    const what = request.headers[TRAFFIC_TOKEN_HEADER] === undefined ? 'missing' : 'invalid';
    return `${what} traffic access token (header ${TRAFFIC_TOKEN_HEADER}) for sandbox ${target.sandboxID}`;
  }

  /**
   * Starts the upstream request with the connect and idle timers, and reports a failure once,
   * to `refuse` before the answer began or to `broken` after. Undefined when it cannot start.
   */
  private dial(
    request: IncomingMessage,
    target: IngressTarget,
    upgrade: boolean,
    log: Logger,
    handlers: DialHandlers,
  ): ClientRequest | undefined {
    let upstream: ClientRequest;
    try {
      const options: https.RequestOptions = {
        // Upgraded connections are never given back to a pool.
        agent: upgrade ? false : target.tls ? this.tlsAgent : this.agent,
        host: target.host,
        port: target.port,
        method: request.method,
        path: request.url,
        headers: upstreamHeaders(request, target, upgrade),
        setHost: false,
      };
      upstream = target.tls
        ? https.request({ ...options, rejectUnauthorized: false })
        : http.request(options);
    } catch (error) {
      // Node refuses header values it cannot send (say a maskRequestHost with a newline).
      const message = `cannot forward to port ${target.port} of sandbox ${target.sandboxID}: ${(error as Error).message}`;
      log.warn({ status: 502, reason: message }, 'ingress failed');
      handlers.refuse(502, message);
      return undefined;
    }
    let phase: Phase = 'connecting';
    const timer = setTimeout(
      () => upstream.destroy(new UpstreamTimeout()),
      this.options.connectTimeoutMs,
    );
    upstream.on('socket', (socket: net.Socket) => {
      const connected = () => {
        if (phase === 'connecting') phase = 'waiting';
        clearTimeout(timer);
      };
      if (socket.connecting) socket.once('connect', connected);
      else connected();
    });
    // On the request, not the pooled socket: the request removes its listener when it ends.
    upstream.setTimeout(this.options.idleTimeoutMs, () => upstream.destroy(new UpstreamTimeout()));
    const answered = () => {
      phase = 'answered';
      clearTimeout(timer);
    };
    upstream.once('response', answered);
    upstream.once('upgrade', answered);
    upstream.on('error', (error: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      if (handlers.gone()) return log.debug({ phase }, 'ingress client went away');
      if (phase === 'answered') return handlers.broken();
      const { status, message } = failure(error, phase, target, this.options);
      log.warn({ status, reason: message }, 'ingress failed');
      handlers.refuse(status, message);
    });
    return upstream;
  }

  /** An error on a raw socket: the whole response, then close once the client has read it. */
  refuse(socket: Duplex, status: number, message: string, sandboxID: string): void {
    if (socket.destroyed) return;
    const { body, headers } = jsonAnswer(sandboxErrorBody(status, message, sandboxID), true);
    const pairs = Object.entries(headers);
    this.end(socket as net.Socket, rawHead(status, STATUS_CODES[status] ?? '', pairs) + body);
  }
}
