import type net from 'node:net';
import tls from 'node:tls';
import type { EnforcedSandbox, EnforcementTable } from '../enforce/index.js';
import type { FlowEnd, OpenFlow } from '../flows/index.js';
import { formatDestination, type IPAddress } from '../policy/index.js';
import { ArrivingBytes } from '../net/index.js';
import { type Dialer, denial, httpSocket, type Refusal, removed, type Target } from './dial.js';
import { errorResponseText } from './http-errors.js';
import {
  bodyScanner,
  endToEndFields,
  fieldTokens,
  fieldValues,
  type Framing,
  type HeaderField,
  framingFields,
  headEnd,
  MAX_RESPONSE_HEAD_BYTES,
  parseResponseHead,
  type RequestHead,
  type ResponseHead,
  responseFraming,
} from './http1.js';
import { Inbox } from './inbox.js';
import { type Redaction, SecretRedaction } from './redact.js';
import type { TunnelRegistry } from './tunnels.js';
import { switchedToWebSocket } from './websocket.js';
import { Upstream, type UpstreamHolder, type UpstreamPool } from './upstream-pool.js';

/** What the client connection learns when an exchange ends. */
export interface ExchangeResult {
  /** The client connection may carry another request. */
  readonly keepAlive: boolean;
}

export interface ExchangeContext {
  readonly table: EnforcementTable;
  readonly dialer: Dialer;
  readonly pool: UpstreamPool;
  readonly tunnels: TunnelRegistry;
  readonly idleTimeoutMs: number;
  /** Counts and logs a refusal the exchange answers (502/504, or a deny found after dialling). */
  readonly onRefusal: (request: ForwardRequest, refusal: Refusal) => void;
  /** Moat is shutting down: responses tell clients the connection closes after them. */
  readonly draining: () => boolean;
  /**
   * Origins are reached over TLS, their certificates verified for the target's name against
   * these CAs (intercepted connections); undefined: plain HTTP (absolute-form requests).
   */
  readonly originTls?: tls.SecureContext;
}

/** A header Moat sets on a request, replacing any of the same name. */
export interface SetField {
  readonly name: string;
  readonly value: string;
}

export interface ForwardRequest {
  readonly sandbox: EnforcedSandbox;
  readonly target: Target;
  readonly head: RequestHead;
  /** Origin-form path and query for the origin's request line. */
  readonly path: string;
  readonly framing: Framing;
  /** The client asked to close after this exchange (HTTP/1.0, Connection: close). */
  readonly lastRequest: boolean;
  /**
   * Its flow record, closed with the bytes sent to and read from the origin (an intercepted
   * connection's requests share the connection's record, which closes with the connection).
   */
  readonly flow: Pick<OpenFlow, 'dialled' | 'refused' | 'closed'>;
  /** Fields set on the request, each replacing any field of its name (case-insensitively). */
  readonly setFields?: readonly SetField[];
  /**
   * The client asks to switch to WebSocket (checked by `webSocketUpgrade`): passed to the
   * origin, whose 101 must carry this Sec-WebSocket-Accept. No other switch is ever asked for.
   */
  readonly webSocketAccept?: string;
  /** The request head went to the origin (with `setFields`). */
  readonly onSent?: () => void;
  /**
   * Values replaced by their placeholders in the response (head and body) before the client
   * reads it; the body is then re-framed (chunked, or closed for HTTP/1.0 clients).
   */
  readonly redactions?: readonly Redaction[];
}

const REQUEST_DROP = new Set(['host']);
/** The content codings of IANA's registry (and their x- aliases): named in a refusal. */
const CONTENT_CODINGS = new Set([
  'gzip',
  'x-gzip',
  'deflate',
  'br',
  'zstd',
  'compress',
  'x-compress',
  'exi',
  'pack200-gzip',
  'aes128gcm',
  'dcb',
  'dcz',
]);
/** Interim responses (100, 103) passed on before the final one; an origin sending more is broken. */
const MAX_INTERIM_RESPONSES = 16;
/** Methods that may be sent twice (RFC 9110 9.2.2). */
const IDEMPOTENT = new Set(['GET', 'HEAD', 'OPTIONS', 'TRACE', 'PUT', 'DELETE']);

/** The Host header for a target, as the absolute URI gave it (RFC 9112 3.2.2). */
function hostHeader(target: Target, defaultPort: number): string {
  const host = target.host ?? (target.ip!.version === 6 ? `[${target.ip!.text}]` : target.ip!.text);
  return target.port === defaultPort ? host : `${host}:${target.port}`;
}

/** The request head sent to the origin: the client's end-to-end fields, `setFields` replacing theirs. */
export function originRequestText(
  request: Pick<
    ForwardRequest,
    'head' | 'target' | 'path' | 'framing' | 'setFields' | 'webSocketAccept'
  >,
  overTls: boolean,
): string {
  const { head, target, path, setFields = [], webSocketAccept } = request;
  const drop = new Set(REQUEST_DROP);
  let set = '';
  for (const field of setFields) {
    drop.add(field.name.toLowerCase());
    set += `${field.name}: ${field.value}\r\n`;
  }
  const connection =
    head.minor === 0
      ? 'Connection: close\r\n'
      : webSocketAccept === undefined
        ? ''
        : 'Connection: Upgrade\r\nUpgrade: websocket\r\n';
  return (
    `${head.method} ${path} HTTP/1.${head.minor}\r\n` +
    `Host: ${hostHeader(target, overTls ? 443 : 80)}\r\n` +
    endToEndFields(head.fields, drop) +
    set +
    framingFields(head.fields, request.framing) +
    connection +
    '\r\n'
  );
}

/**
 * Wraps a connection to an origin in TLS for `name`, verified against `trust`: the TLS socket,
 * or why the origin is refused (its certificate's problem, as OpenSSL and Node name it).
 */
function secureOrigin(
  socket: net.Socket,
  name: string,
  trust: tls.SecureContext,
  timeoutMs: number,
): Promise<{ ok: true; socket: tls.TLSSocket } | { ok: false; status: 502 | 504; reason: string }> {
  return new Promise((resolve) => {
    const secure = tls.connect({
      socket,
      servername: name,
      secureContext: trust,
      ALPNProtocols: ['http/1.1'],
      rejectUnauthorized: true,
    });
    const timer = setTimeout(() => {
      secure.destroy();
      resolve({ ok: false, status: 504, reason: `no TLS handshake within ${timeoutMs} ms` });
    }, timeoutMs);
    const failed = (error: Error) => {
      clearTimeout(timer);
      secure.destroy();
      resolve({ ok: false, status: 502, reason: error.message });
    };
    secure.once('error', failed);
    secure.once('secureConnect', () => {
      clearTimeout(timer);
      secure.off('error', failed);
      secure.on('error', () => secure.destroy());
      resolve({ ok: true, socket: secure });
    });
  });
}

/**
 * One request forwarded to an allowed address and its response relayed back, both bodies
 * streamed with their framing checked as they pass (so both connections stay in step), both
 * directions respecting backpressure. An origin's keep-alive connection goes back to the pool
 * only when both messages ended exactly where their framing said.
 */
export class Exchange implements UpstreamHolder {
  private upstream: Upstream | undefined;
  private reused = false;
  private requestDone: boolean;
  private responseStarted = false;
  /** The response said `Connection: close` to the client: the connection ends after it. */
  private closeAfter = false;
  private finished = false;
  /** The client sent its FIN; `relaying`: the request body relay has begun. */
  private clientGone = false;
  private relaying = false;
  private removeTunnel = () => {};
  private readonly requestText: string;
  /** Bytes this exchange sent to and read from origins, and the counts its upstream had before. */
  private bytesUp = 0;
  private bytesDown = 0;
  private upBefore = 0;
  private downBefore = 0;
  private end: FlowEnd = 'closed';
  /** The values to take back out of the response (undefined: nothing is redacted). */
  private readonly redaction: SecretRedaction | undefined;

  constructor(
    private readonly context: ExchangeContext,
    private readonly request: ForwardRequest,
    private readonly client: Inbox,
    private readonly addresses: readonly IPAddress[],
    private readonly done: (result: ExchangeResult) => void,
    /** Gives back the sandbox's connection slot held for this request until it is registered. */
    private readonly releaseSlot: () => void = () => {},
  ) {
    this.requestDone = request.framing.kind === 'none';
    this.requestText = originRequestText(request, context.originTls !== undefined);
    const { redactions = [] } = request;
    this.redaction = redactions.length > 0 ? new SecretRedaction(redactions) : undefined;
  }

  private get what(): string {
    const ip = this.upstream?.ip;
    return formatDestination(ip ? { ...this.request.target, ip } : this.request.target);
  }

  /** Sends the request over a pooled connection to one of `addresses`, or a new one. */
  start(): void {
    const { sandbox, target } = this.request;
    const tlsName = this.tlsName;
    for (const ip of this.addresses) {
      const idle = this.context.pool.take(sandbox.sandboxID, ip, target.port, tlsName);
      if (idle !== undefined) {
        this.reused = true;
        return this.send(idle);
      }
    }
    void this.dial();
  }

  private get tlsName(): string | undefined {
    return this.context.originTls === undefined ? undefined : this.request.target.host;
  }

  /** Closes both sides: a policy change denied the destination, the sandbox or client left. */
  close(): void {
    this.abort();
  }

  /**
   * The client half-closed: fine once its request is whole, fatal before. Before the body relay
   * starts, the rest of the body may already be waiting in the inbox: the relay decides then.
   */
  clientEnded(): void {
    this.clientGone = true;
    if (this.finished || this.requestDone || !this.relaying) return;
    this.abort();
  }

  private async dial(): Promise<void> {
    this.reused = false;
    const { dialer } = this.context;
    const { sandbox, target } = this.request;
    const connected = await dialer.reach(sandbox, target, this.addresses, httpSocket);
    if (this.finished) {
      if (connected.ok) connected.socket.destroy();
      return;
    }
    if (!connected.ok) return this.answer(connected);
    // The sandbox may have gone (or gone and come back, a new record) while we dialled.
    if (!this.context.table.holds(sandbox)) {
      connected.socket.destroy();
      return this.answer(removed(sandbox));
    }
    // The policy may have changed while we dialled: decide once more.
    const dialled = { ...target, ip: connected.ip, via: connected.via };
    const now = dialer.check(sandbox, dialled, connected.ip);
    if (now.verdict === 'deny') {
      connected.socket.destroy();
      return this.answer(denial(dialled, now));
    }
    const { tlsName } = this;
    const trust = this.context.originTls;
    let socket: net.Socket = connected.socket;
    if (tlsName !== undefined && trust !== undefined) {
      const secured = await secureOrigin(socket, tlsName, trust, dialer.connectTimeoutMs);
      if (!secured.ok) {
        socket.destroy();
        const message = `${formatDestination(dialled)}: TLS to the origin failed: ${secured.reason}`;
        return this.answer({ status: secured.status, message, cause: 'origin-tls' });
      }
      socket = secured.socket;
      if (this.finished) return void socket.destroy();
    }
    this.send(new Upstream(socket, connected.ip, target.port, connected.via, tlsName));
  }

  private send(upstream: Upstream): void {
    this.upstream = upstream;
    const { socket } = upstream;
    this.request.flow.dialled(upstream.ip.text);
    this.upBefore = socket.bytesWritten;
    this.downBefore = socket.bytesRead;
    const { sandbox, target } = this.request;
    this.removeTunnel();
    this.removeTunnel = this.context.tunnels.add({
      sandbox,
      target: { ...target, ip: upstream.ip, via: upstream.via },
      close: (decision) => {
        if (decision !== undefined) this.request.flow.refused(decision);
        this.abort();
      },
    });
    this.releaseSlot();
    // Closed by the registry already: the sandbox was removed while this request was dialled.
    if (this.finished) return;
    socket.setTimeout(this.context.idleTimeoutMs);
    upstream.holder = this;
    // Closed between the pool and here: handled as a connection that died unanswered.
    if (socket.destroyed) return this.upstreamClose();
    // The head and the body bytes that came with it (handed on at once by the client's inbox)
    // leave in one write: one TLS record, one system call.
    socket.cork();
    socket.write(this.requestText, 'latin1');
    this.request.onSent?.();
    this.readResponseHead(upstream);
    if (!this.requestDone) this.relayRequestBody(socket);
    socket.uncork();
  }

  upstreamTimeout(): void {
    if (this.responseStarted) return this.abort();
    this.answer({
      status: 504,
      message: `${this.what} did not answer within ${this.context.idleTimeoutMs} ms`,
    });
  }

  /** Set while a response framed by the connection's end is relayed: what its end finishes. */
  private endsResponse: (() => void) | undefined;

  upstreamEnd(): void {
    const ends = this.endsResponse;
    this.endsResponse = undefined;
    if (ends === undefined) this.upstreamClose();
    else ends();
  }

  upstreamClose(): void {
    if (this.finished) return;
    if (this.responseStarted) return this.abort();
    if (
      this.reused &&
      this.request.framing.kind === 'none' &&
      IDEMPOTENT.has(this.request.head.method)
    ) {
      // A pooled connection the origin closed as we took it (most likely it processed
      // nothing): an idempotent request goes once more, on a new connection (RFC 9112 9.3.1).
      const stale = this.upstream;
      this.detach();
      stale?.socket.destroy();
      void this.dial();
      return;
    }
    this.answer({ status: 502, message: `${this.what} closed the connection without answering` });
  }

  /** Stops listening to the upstream socket (it goes back to the pool or is gone). */
  private detach(): Upstream | undefined {
    const upstream = this.upstream;
    if (upstream === undefined) return undefined;
    upstream.inbox.stop();
    upstream.holder = undefined;
    this.bytesUp += upstream.socket.bytesWritten - this.upBefore;
    this.bytesDown += upstream.socket.bytesRead - this.downBefore;
    this.upstream = undefined;
    return upstream;
  }

  private relayRequestBody(upstream: net.Socket): void {
    this.relayBody(this.client, upstream, this.request.framing, () => {
      this.requestDone = true;
    });
    this.relaying = true;
    // What was waiting did not complete the body, and no more will come.
    if (this.clientGone && !this.requestDone) this.abort();
  }

  /**
   * Streams one body from `from` to `to` as far as its framing says, pausing `from` while `to`
   * is not taking bytes; `done` learns whether more bytes followed the body in the same read.
   */
  private relayBody(
    from: Inbox,
    to: net.Socket,
    framing: Framing,
    done: (trailing: boolean) => void,
  ): void {
    const scanner = bodyScanner(framing);
    from.read((chunk) => {
      const used = scanner.scan(chunk);
      if (typeof used === 'string') {
        this.abort();
        return chunk.length;
      }
      if (used > 0 && !to.write(used === chunk.length ? chunk : chunk.subarray(0, used)))
        to.once('drain', from.throttle());
      if (scanner.done) {
        from.stop();
        done(used < chunk.length);
      }
      return used;
    });
  }

  private readResponseHead(upstream: Upstream, interim = 0): void {
    const arriving = new ArrivingBytes();
    upstream.inbox.read((chunk) => {
      const scanned = arriving.bytes.length;
      const seen = arriving.append(chunk);
      const end = headEnd(seen, MAX_RESPONSE_HEAD_BYTES, scanned);
      if (end === 'incomplete') return chunk.length;
      upstream.inbox.stop();
      const unused = typeof end === 'number' ? seen.length - end : 0;
      const parsed = typeof end === 'number' ? parseResponseHead(seen.subarray(0, end)) : end;
      if ('status' in parsed) {
        this.answer({
          status: 502,
          message: `${this.what} sent a malformed response: ${parsed.message}`,
        });
        return chunk.length;
      }
      const head = parsed.value;
      const accept = this.request.webSocketAccept;
      if (accept !== undefined && switchedToWebSocket(head, accept)) {
        this.switchProtocols(upstream, head);
        return chunk.length - unused;
      }
      // Past a switch nothing more is read or redacted: only a proven WebSocket one passes.
      if (head.status === 101) {
        this.answer({
          status: 502,
          message:
            accept === undefined
              ? `${this.what} switched protocols, which Moat never asks for`
              : `${this.what} answered the WebSocket upgrade with 101 without the matching Sec-WebSocket-Accept`,
          cause: 'switch',
        });
        return chunk.length;
      }
      if (head.status < 200) {
        // Interim (100 Continue, 103): passed on to HTTP/1.1 clients; the final one follows.
        // Bounded, since they are written without waiting for the client to read them.
        if (interim === MAX_INTERIM_RESPONSES) {
          this.answer({
            status: 502,
            message: `${this.what} sent more than ${MAX_INTERIM_RESPONSES} interim responses`,
          });
          return chunk.length;
        }
        if (this.request.head.minor === 1)
          this.client.socket.write(
            `HTTP/1.1 ${head.status} ${this.redacted(head.reason)}\r\n` +
              `${endToEndFields(this.redactedFields(head.fields))}\r\n`,
            'latin1',
          );
        this.readResponseHead(upstream, interim + 1);
        return chunk.length - unused;
      }
      const framing = responseFraming(this.request.head.method, head);
      if (!framing.ok) {
        this.answer({
          status: 502,
          message: `${this.what} sent a malformed response: ${framing.message}`,
        });
        return chunk.length;
      }
      const { framing: body } = framing.value;
      // A body whose values are replaced changes length: it is re-framed for the client.
      const reframed = body.kind !== 'none' && this.redaction !== undefined;
      const codings = reframed
        ? fieldTokens(head.fields, 'content-encoding').filter((c) => c !== 'identity')
        : [];
      if (codings.length > 0) {
        // Only registered codings are named: any other token may be a credential, echoed.
        const named = codings.map((c) => (CONTENT_CODINGS.has(c) ? c : 'non-standard'));
        this.answer({
          status: 502,
          message: `${this.what} sent a ${named.join(', ')} coded body although Moat asked for none: secrets cannot be redacted in it`,
        });
        return chunk.length;
      }
      const chunkedToClient = reframed && this.request.head.minor === 1;
      // Moat asked an HTTP/1.0 request to close: the origin may do so any moment.
      const reusable = framing.value.reusable && this.request.head.minor === 1;
      // An origin answering before the whole request body arrived never read to its end: the
      // client connection cannot be trusted to be in step after this response.
      this.closeAfter =
        this.request.lastRequest ||
        body.kind === 'close' ||
        (reframed && !chunkedToClient) ||
        !this.requestDone ||
        this.context.draining();
      this.responseStarted = true;
      const client = this.client.socket;
      client.cork();
      client.write(
        `HTTP/1.1 ${head.status} ${this.redacted(head.reason)}\r\n` +
          endToEndFields(this.redactedFields(head.fields)) +
          (reframed
            ? chunkedToClient
              ? 'Transfer-Encoding: chunked\r\n'
              : ''
            : framingFields(head.fields, body)) +
          `${this.closeAfter ? 'Connection: close\r\n' : ''}\r\n`,
        'latin1',
      );
      if (reframed) this.relayRedactedBody(upstream, body, reusable, chunkedToClient);
      else this.relayResponseBody(upstream, body, reusable);
      // The body bytes read with the head reach the body's reader only once this reader
      // returns (the inbox hands them on in the same tick): uncorked after that, head and body
      // leave in one write, one TLS record and one system call instead of two.
      process.nextTick(() => client.uncork());
      return chunk.length - unused;
    });
  }

  /**
   * The origin accepted the Upgrade the client asked for: from here on both connections carry
   * the new protocol as it is, until either closes (which closes both and ends the exchange).
   */
  private switchProtocols(upstream: Upstream, head: ResponseHead): void {
    this.responseStarted = true;
    const client = this.client.socket;
    const protocol = fieldValues(head.fields, 'upgrade').join(', ');
    // The head is redacted; the new protocol's bytes (WebSocket frames) are passed as they are.
    client.write(
      `HTTP/1.1 101 ${this.redacted(head.reason)}\r\n${endToEndFields(this.redactedFields(head.fields))}` +
        `Connection: Upgrade\r\nUpgrade: ${protocol}\r\n\r\n`,
      'latin1',
    );
    const fromOrigin = upstream.inbox.detach();
    const fromClient = this.client.detach();
    if (fromOrigin.length > 0) client.write(fromOrigin);
    if (fromClient.length > 0) upstream.socket.write(fromClient);
    client.pipe(upstream.socket);
    upstream.socket.pipe(client);
    client.once('close', () => this.abort());
  }

  private relayResponseBody(upstream: Upstream, framing: Framing, reusable: boolean): void {
    if (framing.kind === 'none') return this.responseDone(reusable);
    if (framing.kind === 'close') this.endsResponse = () => this.responseDone(false);
    // Bytes past the end of a response mean a broken origin: that connection is not reused.
    this.relayBody(upstream.inbox, this.client.socket, framing, (trailing) =>
      this.responseDone(reusable && !trailing),
    );
  }

  /**
   * Relays a response body's content with the request's injected values replaced, framed anew
   * for the client: chunked, or (`chunked` false, an HTTP/1.0 client) ended by closing.
   */
  private relayRedactedBody(
    upstream: Upstream,
    framing: Framing,
    reusable: boolean,
    chunked: boolean,
  ): void {
    const redactor = this.redaction!.stream();
    const client = this.client.socket;
    /** Writes redacted pieces as one chunk; false when the client is not taking bytes. */
    const write = (pieces: Buffer[]): boolean => {
      // A copy: the origin's read buffers are recycled once the reader returns.
      const data = Buffer.concat(pieces);
      if (data.length === 0) return true;
      if (!chunked) return client.write(data);
      client.write(`${data.length.toString(16)}\r\n`, 'latin1');
      client.write(data);
      return client.write('\r\n', 'latin1');
    };
    const end = (reusableNow: boolean) => {
      write(redactor.push(Buffer.alloc(0), true));
      // The origin's trailers, if any, are not passed on: they could carry a value too.
      if (chunked) client.write('0\r\n\r\n', 'latin1');
      this.responseDone(reusableNow);
    };
    if (framing.kind === 'close') this.endsResponse = () => end(false);
    const scanner = bodyScanner(framing);
    upstream.inbox.read((chunk) => {
      const pieces: Buffer[] = [];
      const used = scanner.scan(chunk, (content) => pieces.push(...redactor.push(content)));
      if (typeof used === 'string') {
        this.abort();
        return chunk.length;
      }
      if (!write(pieces)) client.once('drain', upstream.inbox.throttle());
      if (scanner.done) {
        upstream.inbox.stop();
        // Bytes past the end of a response mean a broken origin: that connection is not reused.
        end(reusable && used === chunk.length);
      }
      return used;
    });
  }

  /** `text` of the response head with the request's injected values replaced. */
  private redacted(text: string): string {
    return this.redaction?.text(text) ?? text;
  }

  private redactedFields(fields: readonly HeaderField[]): readonly HeaderField[] {
    const { redaction } = this;
    if (redaction === undefined) return fields;
    return fields
      .filter((field) => !redaction.inName(field.name))
      .map((field) => ({ ...field, value: redaction.text(field.value) }));
  }

  private responseDone(reusable: boolean): void {
    const upstream = this.detach();
    if (upstream !== undefined) {
      // A connection through a proxy went to the name asked for, which the pool (by address)
      // cannot tell apart from another name at that address: never reused.
      if (reusable && this.requestDone && upstream.via === undefined)
        this.context.pool.put(this.request.sandbox.sandboxID, upstream);
      else upstream.socket.destroy();
    }
    if (!this.requestDone) this.client.stop();
    this.finish(!this.closeAfter);
  }

  /** Answers the client with an error, before any byte of a response was relayed. */
  private answer(refusal: Refusal): void {
    if (this.finished) return;
    this.context.onRefusal(this.request, refusal);
    if (refusal.decision !== undefined) this.request.flow.refused(refusal.decision);
    this.end = 'error';
    this.detach()?.socket.destroy();
    const { status, message, decision } = refusal;
    if (this.responseStarted) this.client.socket.destroy();
    else {
      const toHead = this.request.head.method === 'HEAD';
      this.client.socket.write(errorResponseText(status, message, decision, {}, true, toHead));
    }
    this.finish(false);
  }

  /** A message broke in the middle, or the exchange must stop: both connections go. */
  private abort(): void {
    this.end = 'error';
    this.detach()?.socket.destroy();
    this.client.socket.destroy();
    this.finish(false);
  }

  private finish(keepAlive: boolean): void {
    if (this.finished) return;
    this.finished = true;
    this.releaseSlot();
    this.removeTunnel();
    this.request.flow.closed(this.bytesUp, this.bytesDown, this.end);
    this.done({ keepAlive });
  }
}
