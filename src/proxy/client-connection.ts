import type net from 'node:net';
import type { Logger } from 'pino';
import type { Decision } from '../policy/index.js';
import { ArrivingBytes } from '../net/index.js';
import type { Exchange } from './exchange.js';
import { endAndLinger, errorResponseText } from './http-errors.js';
import {
  fieldTokens,
  type Framing,
  headEnd,
  MAX_REQUEST_HEAD_BYTES,
  type Parsed,
  parseRequestHead,
  type RequestHead,
  requestFraming,
} from './http1.js';
import { Inbox } from './inbox.js';

/** How long a client connection may wait between two requests, where no deadlines are set. */
const KEEP_ALIVE_MS = 30_000;

/**
 * The deadlines of a listener's connections (each held against its sandbox's connection budget
 * all the while): its first byte after connecting, and the wait between requests. `passed` is
 * told of each connection closed for one.
 */
export interface ConnectionDeadlines {
  readonly firstByteMs: number;
  readonly keepAliveMs: number;
  passed(resource: 'first_byte_deadline' | 'idle_deadline'): void;
}

/** How a request's exchange ends the client connection's turn. */
export interface RequestTurn {
  readonly framing: Parsed<Framing>;
  /** A body follows the head (or its framing is broken). */
  readonly hasBody: boolean;
  /** The client asked to close after this exchange (HTTP/1.0, Connection: close). */
  readonly lastRequest: boolean;
  /** Moat's own answer may keep the connection (no unread body, no close asked, not draining). */
  readonly keepAlive: boolean;
}

export function requestTurn(head: RequestHead, draining: boolean): RequestTurn {
  const framing = requestFraming(head);
  const hasBody = !framing.ok || framing.value.kind !== 'none';
  const lastRequest = head.minor === 0 || fieldTokens(head.fields, 'connection').includes('close');
  // Moat's own answers to a request with a body close the connection: the body is not read.
  return { framing, hasBody, lastRequest, keepAlive: !hasBody && !lastRequest && !draining };
}

/** What serves the requests a ClientConnection reads. */
export interface RequestHandler {
  /** Shutting down: connections finish what they carry and take no new request. */
  readonly draining: boolean;
  readonly logger: Logger;
  /** Time a client has to send a request head once it began one (and its first one). */
  readonly handshakeTimeoutMs: number;
  /** First-byte and keep-alive deadlines; without them, keep-alive waits KEEP_ALIVE_MS. */
  readonly deadlines?: ConnectionDeadlines;
  /** The connection closed, or was taken over. */
  forget(connection: ClientConnection): void;
  onRequest(head: RequestHead, connection: ClientConnection): Promise<void>;
  /**
   * A CONNECT takes the socket over, with the bytes read after its head. Without it, CONNECT is
   * handed to onRequest like any method.
   */
  takeConnect?(head: RequestHead, socket: net.Socket, early: Buffer): Promise<void>;
}

/**
 * One HTTP/1.1 client connection (to the explicit proxy, or an intercepted TLS connection):
 * reads request heads one at a time and hands each to its handler; a CONNECT may take the
 * connection over, anything else is answered (by Moat or by an origin through an Exchange)
 * before the next head is read.
 */
export class ClientConnection {
  readonly inbox: Inbox;
  /** Reading a head, answering a request, closing after the last answer, or no longer ours. */
  private state: 'head' | 'busy' | 'closing' | 'gone' = 'head';
  /** Bytes of the next head have arrived (a pause from here on is no longer keep-alive idling). */
  private started = false;
  private served = 0;
  private ended = false;
  private current: Exchange | undefined;

  /**
   * `firstBytes`: already read (by the native relay), `waitedMs` after the client connected;
   * the first head is due a handshake timeout after it connected all the same.
   */
  constructor(
    private readonly handler: RequestHandler,
    readonly socket: net.Socket,
    firstBytes?: Buffer,
    private readonly waitedMs = 0,
  ) {
    this.inbox = new Inbox(socket, firstBytes);
    const { deadlines } = handler;
    if (deadlines !== undefined && (firstBytes === undefined || firstBytes.length === 0))
      this.firstByteDeadline = setTimeout(
        this.onFirstByteTimeout,
        Math.max(0, deadlines.firstByteMs - waitedMs),
      );
    socket.on('error', this.onError);
    socket.on('end', this.onEnd);
    socket.on('timeout', this.onTimeout);
    socket.on('close', this.onClose);
    this.readHead();
  }

  /** Carrying a request, or still writing its last answer (shutdown waits for both). */
  get busy(): boolean {
    return this.state === 'busy' || (this.state === 'closing' && !this.socket.writableFinished);
  }

  /** Closes the connection if it is waiting for a request that has not begun. */
  closeIfIdle(): void {
    if (this.state === 'head' && !this.started) this.socket.destroy();
  }

  private readonly onError = () => this.socket.destroy();

  /** Set until the first byte comes: a silent connection holds its sandbox's budget no longer. */
  private firstByteDeadline: NodeJS.Timeout | undefined;

  private readonly onFirstByteTimeout = () => {
    this.firstByteDeadline = undefined;
    if (this.state !== 'head') return;
    this.handler.deadlines?.passed('first_byte_deadline');
    this.socket.destroy();
  };

  /** A defect in handling a request: this connection goes, the process (and every sandbox) stays. */
  private readonly failed = (error: unknown) => {
    this.handler.logger.error({ err: error }, 'egress request failed');
    this.socket.destroy();
  };

  // The client sent its last byte: a request it has not finished will never come.
  private readonly onEnd = () => {
    this.ended = true;
    // Whole requests still waiting (a client pipelining, then reading slowly) are answered
    // first: readHead closes once none is left.
    if (this.state === 'head' && !this.inbox.pending) this.close();
    else this.current?.clientEnded();
  };

  private readonly onTimeout = () => {
    // The keep-alive timer stays armed while a request is answered (see readHead); fired then,
    // it is disarmed, and the next readHead arms it anew.
    if (this.state === 'busy') this.socket.setTimeout(0);
    if (this.state !== 'head') return;
    if (this.socket.writableNeedDrain) return void this.socket.destroy();
    // A client idling between requests just loses the connection; one stuck in a head is told.
    if (this.started || this.served === 0)
      this.close(
        errorResponseText(
          408,
          'no complete request head within the handshake timeout',
          undefined,
          {},
          true,
        ),
      );
    else {
      this.handler.deadlines?.passed('idle_deadline');
      this.close();
    }
  };

  private readonly onClose = () => {
    this.headDone();
    this.state = 'gone';
    this.current?.close();
    this.handler.forget(this);
  };

  /** The head being read must be whole by then, however its bytes trickle in. */
  private headDeadline: NodeJS.Timeout | undefined;

  private headDone(): void {
    clearTimeout(this.headDeadline);
    clearTimeout(this.firstByteDeadline);
    this.headDeadline = this.firstByteDeadline = undefined;
  }

  private readHead(): void {
    this.state = 'head';
    this.started = false;
    if (this.handler.draining || (this.ended && !this.inbox.pending)) return this.close();
    const { handshakeTimeoutMs } = this.handler;
    // The first head is due a handshake timeout after the client connected; between requests
    // a quiet client may wait KEEP_ALIVE_MS, and a head, once begun, has the handshake timeout.
    // The keep-alive timer is armed once, not on every request: every byte either way re-arms
    // it, and the answer's last write was just now.
    if (this.served === 0)
      this.headDeadline ??= setTimeout(
        this.onTimeout,
        Math.max(0, handshakeTimeoutMs - this.waitedMs),
      );
    else {
      const keepAliveMs = this.handler.deadlines?.keepAliveMs ?? KEEP_ALIVE_MS;
      if (this.socket.timeout !== keepAliveMs) this.socket.setTimeout(keepAliveMs);
    }
    // A client that does not read its answers gets no more of them (pipelined requests would
    // otherwise queue answers without bound); one that never reads again times out.
    if (this.socket.writableNeedDrain) {
      this.socket.once('drain', () => {
        if (this.state === 'head') this.readHead();
      });
      return;
    }
    const arriving = new ArrivingBytes();
    this.inbox.read((chunk) => {
      clearTimeout(this.firstByteDeadline);
      this.firstByteDeadline = undefined;
      const scanned = arriving.bytes.length;
      const seen = arriving.append(chunk);
      const end = headEnd(seen, MAX_REQUEST_HEAD_BYTES, scanned);
      if (end === 'incomplete') {
        // A head begun and not whole (one that arrives whole, the usual case, needs no timer).
        if (!this.started) {
          this.started = true;
          if (this.served > 0) {
            this.socket.setTimeout(0);
            this.headDeadline = setTimeout(this.onTimeout, handshakeTimeoutMs);
          }
        }
        return chunk.length;
      }
      // Not paused: the next reader (a body's, or the next head's) usually comes before any
      // byte does, and resuming a paused socket costs a tick of stream work per request. Bytes
      // that arrive meanwhile wait in the inbox, which pauses then.
      this.inbox.handOver();
      this.state = 'busy';
      this.headDone();
      if (typeof end !== 'number') {
        this.answer(
          errorResponseText(end.status, `request head: ${end.message}`, undefined, {}, true),
          false,
        );
        return chunk.length;
      }
      const head = seen.subarray(0, end);
      // Handled once the inbox holds the bytes after the head (a CONNECT's first tunnel bytes).
      queueMicrotask(() => this.dispatch(head));
      return chunk.length - (seen.length - end);
    });
  }

  private dispatch(bytes: Buffer): void {
    if (this.state === 'gone') return;
    this.served++;
    const parsed = parseRequestHead(bytes);
    if (!parsed.ok)
      return this.answer(
        errorResponseText(parsed.status, `request head: ${parsed.message}`, undefined, {}, true),
        false,
      );
    const takeConnect = this.handler.takeConnect?.bind(this.handler);
    if (parsed.value.method !== 'CONNECT' || takeConnect === undefined)
      return void this.handler.onRequest(parsed.value, this).catch(this.failed);
    // The tunnel takes the socket over.
    this.state = 'gone';
    this.handler.forget(this);
    this.socket.off('error', this.onError).off('end', this.onEnd).off('timeout', this.onTimeout);
    this.socket.off('close', this.onClose);
    this.socket.setTimeout(0);
    // Stays paused until the tunnel reads it: bytes sent meanwhile wait in the socket.
    const early = this.inbox.detach();
    this.socket.on('error', () => this.socket.destroy());
    void takeConnect(parsed.value, this.socket, early).catch(this.failed);
  }

  /** Moat's own error answer to `head`; the next request is read only if `keepAlive`. */
  refuse(
    head: RequestHead,
    keepAlive: boolean,
    status: number,
    message: string,
    decision?: Decision,
    extra: Record<string, string> = {},
  ): void {
    const toHead = head.method === 'HEAD';
    this.answer(errorResponseText(status, message, decision, extra, !keepAlive, toHead), keepAlive);
  }

  /** Sends Moat's own answer to the current request; the next is read only if `keepAlive`. */
  answer(text: string, keepAlive: boolean): void {
    if (this.state === 'gone' || this.state === 'closing') return;
    if (!keepAlive) return this.close(text);
    this.socket.write(text);
    this.exchangeDone(true);
  }

  exchange(exchange: Exchange): void {
    if (this.state === 'gone') return exchange.close();
    this.current = exchange;
    exchange.start();
    if (this.ended) exchange.clientEnded();
  }

  exchangeDone(keepAlive: boolean): void {
    this.current = undefined;
    if (this.state === 'gone' || this.state === 'closing') return;
    if (keepAlive) this.readHead();
    else this.close();
  }

  /** Ends the connection after `text`; what the client sends from here on is dropped. */
  private close(text?: string): void {
    if (this.state === 'gone' || this.state === 'closing') return;
    this.headDone();
    this.state = 'closing';
    this.inbox.detach();
    endAndLinger(this.socket, text, this.handler.handshakeTimeoutMs);
  }
}
