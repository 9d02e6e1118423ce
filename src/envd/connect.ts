/**
 * The Connect protocol (JSON codec) as the sandbox API speaks it: unary calls (POST
 * application/json, 200 + JSON, errors as a status plus `{"code": "<name>", "message"}`) and
 * enveloped streams (application/connect+json; each message is one flag byte, a 4-byte
 * big-endian length and JSON; the stream ends with flag 0x02 holding `{}` or `{"error": ...}`).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { drainedOrClosed } from '../net/index.js';
import { sendJson } from '../e2b-wire/index.js';

export type ConnectCode =
  | 'canceled'
  | 'unknown'
  | 'invalid_argument'
  | 'deadline_exceeded'
  | 'not_found'
  | 'already_exists'
  | 'permission_denied'
  | 'resource_exhausted'
  | 'failed_precondition'
  | 'unimplemented'
  | 'internal'
  | 'unavailable'
  | 'unauthenticated';

const HTTP_STATUS: Record<ConnectCode, number> = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  unauthenticated: 401,
};

/** An error raised by an operation; the SDK maps its code to its own error classes. */
export class ConnectError extends Error {
  override readonly name = 'ConnectError';
  constructor(
    readonly code: ConnectCode,
    message: string,
  ) {
    super(message);
  }
}

const FLAG_END = 0x02;
const FLAG_COMPRESSED = 0x01;

/** The whole request body, refused past `limit` bytes (a sandbox's client is not trusted). */
export function readBody(request: IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    request.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        reject(new ConnectError('resource_exhausted', `request body over ${limit} bytes`));
        request.destroy();
        return;
      }
      chunks.push(chunk);
    });
    request.on('end', () => resolve(Buffer.concat(chunks)));
    request.on('error', reject);
  });
}

/** JSON that must be an object (every Connect request message is one). */
export function parseMessage(bytes: Buffer | string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(bytes.toString() || '{}');
  } catch (error) {
    throw new ConnectError(
      'invalid_argument',
      `request is not valid JSON: ${(error as Error).message}`,
    );
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new ConnectError('invalid_argument', 'request must be a JSON object');
  }
  return value as Record<string, unknown>;
}

export function encodeEnvelope(flags: number, message: unknown): Buffer {
  const json = Buffer.from(JSON.stringify(message));
  const frame = Buffer.allocUnsafe(5 + json.length);
  frame[0] = flags;
  frame.writeUInt32BE(json.length, 1);
  json.copy(frame, 5);
  return frame;
}

/**
 * Splits enveloped messages out of a byte stream as they arrive (client streams), refusing
 * compressed or oversized messages.
 */
export class EnvelopeReader {
  private buffered: Buffer = Buffer.alloc(0);

  constructor(private readonly maxMessage: number) {}

  push(chunk: Buffer): Array<{ end: boolean; message: Record<string, unknown> }> {
    this.buffered = this.buffered.length === 0 ? chunk : Buffer.concat([this.buffered, chunk]);
    const out: Array<{ end: boolean; message: Record<string, unknown> }> = [];
    while (this.buffered.length >= 5) {
      const flags = this.buffered[0]!;
      const length = this.buffered.readUInt32BE(1);
      if (flags & FLAG_COMPRESSED) {
        throw new ConnectError('unimplemented', 'compressed messages are not supported');
      }
      if (length > this.maxMessage) {
        throw new ConnectError('resource_exhausted', `message over ${this.maxMessage} bytes`);
      }
      if (this.buffered.length < 5 + length) break;
      out.push({
        end: (flags & FLAG_END) !== 0,
        message: parseMessage(this.buffered.subarray(5, 5 + length)),
      });
      this.buffered = this.buffered.subarray(5 + length);
    }
    return out;
  }

  get pending(): number {
    return this.buffered.length;
  }
}

/** The single message of a server-streaming request. */
export function parseStreamRequest(body: Buffer, maxMessage: number): Record<string, unknown> {
  const reader = new EnvelopeReader(maxMessage);
  const [first, ...rest] = reader.push(body);
  if (first === undefined || first.end || rest.length > 0 || reader.pending > 0) {
    throw new ConnectError('invalid_argument', 'expected exactly one enveloped request message');
  }
  return first.message;
}

/** A unary call's error: the HTTP status of its code, and `{code: "<name>", message, sandboxID}`. */
export function sendUnaryError(
  response: ServerResponse,
  error: ConnectError,
  sandboxID: string,
): void {
  sendJson(response, HTTP_STATUS[error.code], {
    code: error.code,
    message: error.message,
    sandboxID,
  });
}

/**
 * Bytes a stream may hold for a client that does not read. Producers that can wait (process
 * output) wait long before this; for those that cannot (watch events), a client this far
 * behind is cut off rather than buffered for.
 */
export const STREAM_BUFFER_LIMIT = 8 << 20;

/**
 * The response side of a server stream. Errors travel in the end-stream frame with HTTP 200:
 * the SDK reads a non-200 status on a stream from the status alone.
 */
export class ServerStream {
  private ended = false;

  constructor(private readonly response: ServerResponse) {
    response.writeHead(200, { 'Content-Type': 'application/connect+json' });
    response.flushHeaders();
  }

  get open(): boolean {
    return !this.ended && !this.response.destroyed;
  }

  send(message: object): void {
    if (!this.open) return;
    if (this.response.writableLength > STREAM_BUFFER_LIMIT) {
      this.ended = true;
      this.response.destroy();
      return;
    }
    this.response.write(encodeEnvelope(0, message));
  }

  /** The client is behind: what was sent waits in Moat's buffer. */
  get backedUp(): boolean {
    return this.open && this.response.writableNeedDrain;
  }

  /** Resolves once the client has caught up, or the stream is gone. */
  drained(): Promise<void> {
    return this.backedUp ? drainedOrClosed(this.response) : Promise.resolve();
  }

  end(error?: ConnectError): void {
    if (!this.open) return;
    this.ended = true;
    this.response.end(
      encodeEnvelope(
        FLAG_END,
        error ? { error: { code: error.code, message: error.message } } : {},
      ),
    );
  }
}

/** Client-supplied deadline in milliseconds (Connect-Timeout-Ms), if any. */
export function deadlineOf(request: IncomingMessage): number | undefined {
  const header = request.headers['connect-timeout-ms'];
  if (typeof header !== 'string' || !/^[0-9]{1,10}$/.test(header)) return undefined;
  const ms = Number(header);
  return ms > 0 ? ms : undefined;
}
