/**
 * A raw client for the sandbox API as the sandbox listener serves it: plain node:http on
 * loopback (so any Host header can be sent), Connect unary calls, server streams read frame by
 * frame, and client streams written envelope by envelope. No SDK code: these tests check the
 * wire itself.
 */
import http from 'node:http';

export const SANDBOX_API_PORT = '49983';

export interface HttpReply {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly text: string;
  /** The parsed body when it is JSON, else undefined. */
  readonly body: unknown;
}

export interface RawRequest {
  readonly method?: string;
  readonly path?: string;
  readonly headers?: Record<string, string | number>;
  readonly body?: string | Buffer;
}

/** A plain JSON body (not an enveloped one) parsed; undefined for anything else. */
function jsonOf(contentType: string, text: string): unknown {
  if (!/^application\/json\b/.test(contentType) || text === '') return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** One HTTP request to `base` exactly as given (no headers added). */
export function send(base: string, request: RawRequest = {}): Promise<HttpReply> {
  const url = new URL(request.path ?? '/', base);
  return new Promise((resolve, reject) => {
    const outgoing = http.request(
      url,
      { method: request.method ?? 'GET', headers: request.headers, timeout: 10_000 },
      (response) => {
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          resolve({
            status: response.statusCode ?? 0,
            headers: response.headers,
            text,
            body: jsonOf(String(response.headers['content-type']), text),
          });
        });
        response.on('error', reject);
      },
    );
    outgoing.on('timeout', () => outgoing.destroy(new Error(`${url.pathname} timed out`)));
    outgoing.on('error', reject);
    outgoing.end(request.body);
  });
}

/** One Connect envelope: flag byte, 4-byte big-endian length, JSON. */
export function envelope(message: unknown, flags = 0): Buffer {
  const json = Buffer.from(JSON.stringify(message));
  const frame = Buffer.alloc(5 + json.length);
  frame[0] = flags;
  frame.writeUInt32BE(json.length, 1);
  json.copy(frame, 5);
  return frame;
}

export interface Frame<M = Record<string, unknown>> {
  readonly flags: number;
  readonly message: M;
}

/**
 * An enveloped Connect call: the request body is written as given (or envelope by envelope with
 * `write`), the response is read frame by frame as it arrives.
 */
export class StreamCall<M = Record<string, unknown>> {
  status = 0;
  contentType = '';
  /** Bytes after the last whole frame when the response ended (must be none). */
  trailing = 0;
  private buffered = Buffer.alloc(0);
  private readonly frames: Frame<M>[] = [];
  private waiter: (() => void) | undefined;
  private ended = false;
  private readonly request: http.ClientRequest;
  readonly ready: Promise<void>;

  constructor(url: URL, headers: Record<string, string>, body?: Buffer) {
    this.request = http.request(url, {
      method: 'POST',
      headers: body === undefined ? headers : { ...headers, 'Content-Length': body.length },
    });
    this.ready = new Promise((resolve, reject) => {
      this.request.on('response', (response) => {
        this.status = response.statusCode ?? 0;
        this.contentType = String(response.headers['content-type']);
        response.on('data', (chunk: Buffer) => this.push(chunk));
        response.on('end', () => this.finish());
        response.on('error', () => this.finish());
        resolve();
      });
      this.request.on('error', (error) => {
        this.finish();
        reject(error);
      });
    });
    if (body !== undefined) this.request.end(body);
    else this.request.flushHeaders();
  }

  /** Sends one more request envelope (client streams). */
  write(message: unknown): void {
    this.request.write(envelope(message));
  }

  /** Ends the request body (client streams). */
  end(): void {
    this.request.end();
  }

  private push(chunk: Buffer) {
    this.buffered = Buffer.concat([this.buffered, chunk]);
    while (this.buffered.length >= 5) {
      const length = this.buffered.readUInt32BE(1);
      if (this.buffered.length < 5 + length) break;
      this.frames.push({
        flags: this.buffered[0]!,
        message: JSON.parse(this.buffered.subarray(5, 5 + length).toString()) as M,
      });
      this.buffered = this.buffered.subarray(5 + length);
    }
    this.waiter?.();
  }

  private finish() {
    this.ended = true;
    this.trailing = this.buffered.length;
    this.waiter?.();
  }

  /** The next frame, or undefined when the stream closed; fails after `timeoutMs`. */
  async next(timeoutMs = 5000): Promise<Frame<M> | undefined> {
    const deadline = Date.now() + timeoutMs;
    while (this.frames.length === 0 && !this.ended) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no frame within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiter = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    return this.frames.shift();
  }

  /** Every frame up to the end of the response; fails when it does not end in `timeoutMs`. */
  async rest(timeoutMs = 5000): Promise<Frame<M>[]> {
    const collected: Frame<M>[] = [];
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const frame = await this.next(Math.max(1, deadline - Date.now()));
      if (frame === undefined) return collected;
      collected.push(frame);
    }
  }

  /** Frames until `done` holds for the ones collected (or the stream ends). */
  async until(done: (frames: Frame<M>[]) => boolean, timeoutMs = 5000): Promise<Frame<M>[]> {
    const collected: Frame<M>[] = [];
    const deadline = Date.now() + timeoutMs;
    while (!done(collected)) {
      const frame = await this.next(Math.max(1, deadline - Date.now()));
      if (frame === undefined) break;
      collected.push(frame);
    }
    return collected;
  }

  /** Leaves the call (the server sees the client go away). */
  close(): void {
    this.request.destroy();
  }
}

/** The sandbox API of one sandbox, addressed by the E2b-Sandbox-* headers (as the SDK does). */
export class SandboxClient {
  constructor(
    readonly base: string,
    readonly sandboxID: string,
    /** Sent as X-Access-Token when not null. */
    readonly token: string | null,
  ) {}

  /** Routing and auth headers, then `extra` (which may override them). */
  headers(extra: Record<string, string> = {}): Record<string, string> {
    return {
      'E2b-Sandbox-Id': this.sandboxID,
      'E2b-Sandbox-Port': SANDBOX_API_PORT,
      ...(this.token === null ? {} : { 'X-Access-Token': this.token }),
      ...extra,
    };
  }

  /** The same sandbox with another (or no) access token. */
  withToken(token: string | null): SandboxClient {
    return new SandboxClient(this.base, this.sandboxID, token);
  }

  request(request: RawRequest & { headers?: Record<string, string> }): Promise<HttpReply> {
    return send(this.base, { ...request, headers: this.headers(request.headers) });
  }

  /** A unary Connect call with the JSON codec; `raw` sends the body as is. */
  unary(
    method: string,
    message: unknown,
    headers: Record<string, string> = {},
    raw?: string,
  ): Promise<HttpReply> {
    return this.request({
      method: 'POST',
      path: `/${method}`,
      headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1', ...headers },
      body: raw ?? JSON.stringify(message),
    });
  }

  /** A server-streaming call: one enveloped request message. */
  stream(method: string, message: unknown, headers: Record<string, string> = {}): StreamCall {
    return new StreamCall(
      new URL(`/${method}`, this.base),
      this.headers({
        'Content-Type': 'application/connect+json',
        'Connect-Protocol-Version': '1',
        ...headers,
      }),
      envelope(message),
    );
  }

  /** A client-streaming call; write envelopes, then end. `messages` are written at once. */
  clientStream(method: string, messages: unknown[] = []): StreamCall {
    const call = new StreamCall(
      new URL(`/${method}`, this.base),
      this.headers({
        'Content-Type': 'application/connect+json',
        'Connect-Protocol-Version': '1',
      }),
    );
    for (const message of messages) call.write(message);
    return call;
  }
}
