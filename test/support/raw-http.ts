/**
 * Byte-exact HTTP/1.1 for proxy tests: a raw client that writes exactly the bytes it is given and
 * parses what comes back, and origins that count what they see (a scripted raw one and a
 * node:http one). Every wait is bounded.
 */
import http from 'node:http';
import net from 'node:net';
import type { HostPort } from '../../src/net/index.js';

export interface RawResponse {
  readonly version: string;
  readonly status: number;
  readonly reason: string;
  /** The status line and header lines, without the blank line that ends them. */
  readonly head: string;
  readonly headers: ReadonlyArray<readonly [string, string]>;
  /** How the body was delimited. */
  readonly framing: 'none' | 'length' | 'chunked' | 'close';
  /** Empty when read with `keepBody: false`. */
  readonly body: Buffer;
  readonly bodyLength: number;
  readonly trailers: ReadonlyArray<readonly [string, string]>;
}

/** Every value of a header (case-insensitive name). */
export function headerValues(response: RawResponse, name: string): string[] {
  const lower = name.toLowerCase();
  return response.headers.filter(([n]) => n.toLowerCase() === lower).map(([, v]) => v);
}

export function header(response: RawResponse, name: string): string | undefined {
  return headerValues(response, name)[0];
}

/** A client connection that writes exactly what it is told and reads responses one at a time. */
export class RawClient {
  /** Bytes received and not yet consumed by `response()`. */
  private buffer: Buffer = Buffer.alloc(0);
  private wake: (() => void) | undefined;
  /** Set once the peer ended or reset the connection. */
  endedAt: number | undefined;
  received = 0;

  private constructor(readonly socket: net.Socket) {
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => {
      this.received += chunk.length;
      this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
      this.notify();
    });
    const ended = () => {
      this.endedAt ??= performance.now();
      this.notify();
    };
    socket.on('end', ended);
    socket.on('close', ended);
    socket.on('error', ended);
  }

  /** `localAddress`: the source address to connect from (Moat budgets connections by it). */
  static connect(address: HostPort, timeoutMs = 3000, localAddress?: string): Promise<RawClient> {
    return new Promise((resolve, reject) => {
      const socket = net.connect({ host: address.host, port: address.port, localAddress });
      const timer = setTimeout(() => {
        socket.destroy();
        reject(
          new Error(`could not connect to ${address.host}:${address.port} in ${timeoutMs} ms`),
        );
      }, timeoutMs);
      socket.once('error', (error) => {
        clearTimeout(timer);
        reject(error);
      });
      socket.once('connect', () => {
        clearTimeout(timer);
        resolve(new RawClient(socket));
      });
    });
  }

  get ended(): boolean {
    return this.endedAt !== undefined;
  }

  /** Bytes received and not consumed by `response()`. */
  unread(): Buffer {
    return this.buffer;
  }

  send(data: string | Buffer): void {
    if (!this.socket.destroyed) this.socket.write(typeof data === 'string' ? latin1(data) : data);
  }

  pause(): void {
    this.socket.pause();
  }

  resume(): void {
    this.socket.resume();
  }

  /** Half-closes: sends FIN, keeps reading. */
  end(): void {
    this.socket.end();
  }

  destroy(): void {
    this.socket.destroy();
  }

  /** True once the peer closed (or reset) the connection, false if it is still open after the wait. */
  async waitClosed(timeoutMs: number): Promise<boolean> {
    await this.waitUntil(() => false, timeoutMs);
    return this.ended;
  }

  /**
   * Waits until `predicate` holds on the unread bytes; false when the connection ended or the
   * time ran out first.
   */
  async waitUntil(predicate: (unread: Buffer) => boolean, timeoutMs: number): Promise<boolean> {
    const deadline = performance.now() + timeoutMs;
    while (!predicate(this.buffer)) {
      if (this.ended) return false;
      try {
        await this.more(deadline, 'a condition');
      } catch {
        return predicate(this.buffer);
      }
    }
    return true;
  }

  /** Waits until at least `bytes` have been received in all (consumed or not). */
  async waitReceived(bytes: number, timeoutMs = 3000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (this.received < bytes) await this.more(deadline, `${bytes} bytes`);
  }

  /**
   * Reads the next response. `method` is the method of the request it answers (HEAD responses
   * have no body). Interim (1xx) responses are returned like any other.
   */
  async response(
    options: { method?: string; timeoutMs?: number; keepBody?: boolean } = {},
  ): Promise<RawResponse> {
    const { method = 'GET', timeoutMs = 3000, keepBody = true } = options;
    const deadline = performance.now() + timeoutMs;
    let end: number;
    while ((end = this.buffer.indexOf('\r\n\r\n')) < 0)
      await this.more(deadline, 'a response head');
    const head = this.take(end + 4)
      .subarray(0, end)
      .toString('latin1');
    const [statusLine = '', ...lines] = head.split('\r\n');
    const match = /^(HTTP\/\d\.\d) (\d{3})(?: (.*))?$/.exec(statusLine);
    if (!match) throw new Error(`not an HTTP status line: ${JSON.stringify(statusLine)}`);
    const status = Number(match[2]);
    const headers = lines.map((line) => splitHeader(line));
    const response = { version: match[1]!, status, reason: match[3] ?? '', head, headers };
    const values = (name: string) =>
      headers.filter(([n]) => n.toLowerCase() === name).map(([, v]) => v);
    const codings = values('transfer-encoding')
      .join(',')
      .split(',')
      .map((c) => c.trim().toLowerCase())
      .filter(Boolean);
    const lengths = values('content-length');
    const chunks: Buffer[] = [];
    let bodyLength = 0;
    const keep = (data: Buffer) => {
      bodyLength += data.length;
      if (keepBody) chunks.push(data);
    };
    const finish = (
      framing: RawResponse['framing'],
      trailers: Array<[string, string]> = [],
    ): RawResponse => ({
      ...response,
      framing,
      body: Buffer.concat(chunks),
      bodyLength,
      trailers,
    });
    if (method === 'HEAD' || (status >= 100 && status < 200) || status === 204 || status === 304)
      return finish('none');
    if (codings.length > 0) {
      if (codings[codings.length - 1] !== 'chunked')
        throw new Error(`response framing not understood: Transfer-Encoding ${codings.join(',')}`);
      for (;;) {
        let eol: number;
        while ((eol = this.buffer.indexOf('\r\n')) < 0) await this.more(deadline, 'a chunk size');
        const sizeLine = this.take(eol + 2)
          .subarray(0, eol)
          .toString('latin1');
        const size = parseInt(sizeLine.split(';')[0]!.trim(), 16);
        if (!Number.isInteger(size)) throw new Error(`bad chunk size line ${sizeLine}`);
        if (size === 0) break;
        await this.consume(size, deadline, keep, 'chunk data');
        let crlf = Buffer.alloc(0);
        await this.consume(2, deadline, (data) => (crlf = Buffer.concat([crlf, data])), 'CRLF');
        if (crlf.toString('latin1') !== '\r\n')
          throw new Error(`chunk data not followed by CRLF: ${JSON.stringify(String(crlf))}`);
      }
      const trailers: Array<[string, string]> = [];
      for (;;) {
        let eol: number;
        while ((eol = this.buffer.indexOf('\r\n')) < 0) await this.more(deadline, 'trailers');
        const line = this.take(eol + 2)
          .subarray(0, eol)
          .toString('latin1');
        if (line === '') break;
        trailers.push(splitHeader(line));
      }
      return finish('chunked', trailers);
    }
    if (lengths.length > 0) {
      const length = Number(lengths[0]);
      await this.consume(length, deadline, keep, `a body of ${length} bytes`);
      return finish('length');
    }
    for (;;) {
      if (this.buffer.length > 0) keep(this.take(this.buffer.length));
      if (this.ended) return finish('close');
      await this.more(deadline, 'the end of a close-delimited body');
    }
  }

  /** Hands `count` bytes to `sink` as they arrive, without holding them all at once. */
  private async consume(
    count: number,
    deadline: number,
    sink: (data: Buffer) => void,
    what: string,
  ): Promise<void> {
    let left = count;
    while (left > 0) {
      if (this.buffer.length === 0) await this.more(deadline, what);
      const n = Math.min(left, this.buffer.length);
      if (n > 0) sink(this.take(n));
      left -= n;
    }
  }

  private take(n: number): Buffer {
    const out = this.buffer.subarray(0, n);
    this.buffer = this.buffer.subarray(n);
    return out;
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  /** Waits for more bytes; throws when the connection ended first or at the deadline. */
  private more(deadline: number, what: string): Promise<void> {
    if (this.ended)
      return Promise.reject(
        new Error(
          `connection closed while waiting for ${what}; unread: ${JSON.stringify(preview(this.buffer))}`,
        ),
      );
    this.socket.resume();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => {
          this.wake = undefined;
          reject(
            new Error(
              `timed out waiting for ${what}; unread: ${JSON.stringify(preview(this.buffer))}`,
            ),
          );
        },
        Math.max(0, deadline - performance.now()),
      );
      this.wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }
}

function splitHeader(line: string): [string, string] {
  const colon = line.indexOf(':');
  if (colon < 0) return [line, ''];
  return [line.slice(0, colon), line.slice(colon + 1).trim()];
}

function preview(buffer: Buffer): string {
  const text = buffer.subarray(0, 300).toString('latin1');
  return buffer.length > 300 ? `${text}...` : text;
}

/** Strings in these tests are bytes: one character, one byte (NUL, CR, 0xff included). */
export function latin1(text: string): Buffer {
  return Buffer.from(text, 'latin1');
}

const listen = (server: net.Server, host: string): Promise<number> =>
  new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve((server.address() as net.AddressInfo).port));
  });

export interface RawRequest {
  readonly head: string;
  readonly method: string;
  readonly target: string;
  /** Which connection (0-based, in accept order) carried it. */
  readonly connection: number;
}

export interface CountingOrigin {
  readonly host: string;
  readonly port: number;
  /** Connections accepted so far. */
  connections: number;
  close(): Promise<void>;
}

export interface ScriptedOrigin extends CountingOrigin {
  readonly requests: RawRequest[];
  /** Bytes received on all connections. */
  bytesReceived: number;
  /** Sockets still open. */
  readonly sockets: Set<net.Socket>;
}

/**
 * A raw TCP origin for bodiless requests: each complete request head it receives is handed to
 * `respond`, which writes whatever bytes it likes (or nothing) on the socket.
 */
export async function scriptedOrigin(
  host: string,
  respond: (socket: net.Socket, request: RawRequest) => void,
): Promise<ScriptedOrigin> {
  const sockets = new Set<net.Socket>();
  const origin: ScriptedOrigin = {
    host,
    port: 0,
    connections: 0,
    requests: [],
    bytesReceived: 0,
    sockets,
    close: () => Promise.resolve(),
  };
  const server = net.createServer((socket) => {
    const connection = origin.connections++;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => socket.destroy());
    let buffer = Buffer.alloc(0);
    socket.on('data', (chunk: Buffer) => {
      origin.bytesReceived += chunk.length;
      buffer = Buffer.concat([buffer, chunk]);
      let end: number;
      while ((end = buffer.indexOf('\r\n\r\n')) >= 0) {
        const head = buffer.subarray(0, end).toString('latin1');
        buffer = buffer.subarray(end + 4);
        const [method = '', target = ''] = head.split('\r\n')[0]!.split(' ');
        const request = { head, method, target, connection };
        origin.requests.push(request);
        respond(socket, request);
      }
    });
  });
  const port = await listen(server, host);
  return Object.assign(origin, {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  });
}

/** A node:http origin that counts the connections it accepts. */
export async function countingHttpOrigin(
  host: string,
  handler: http.RequestListener,
): Promise<CountingOrigin> {
  const server = http.createServer(handler);
  const origin: CountingOrigin = { host, port: 0, connections: 0, close: () => Promise.resolve() };
  server.on('connection', () => origin.connections++);
  const port = await listen(server, host);
  return Object.assign(origin, {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  });
}
