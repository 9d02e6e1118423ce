/**
 * The frames Moat exchanges with a sandbox role (launcher or file agent) over its socket:
 * an 8-byte head (header length, payload length: unsigned 32-bit big-endian), a JSON object,
 * raw payload bytes (supervisor/frames.py is the other side).
 *
 * A role runs inside the sandbox, so what it sends is hostile until checked: sizes are bounded
 * before anything is buffered, the header must parse to an object, and any violation is a
 * FrameError that ends that role's connection, never Moat.
 */

export const HEAD_BYTES = 8;
export const MAX_HEADER_BYTES = 4 << 20;
export const MAX_PAYLOAD_BYTES = 1 << 20;

export type FrameHeader = Record<string, unknown>;

export interface Frame {
  readonly header: FrameHeader;
  readonly payload: Buffer;
  /** Bytes it took on the wire. */
  readonly size: number;
}

export class FrameError extends Error {
  override readonly name = 'FrameError';
}

export function encodeFrame(header: object, payload: Buffer = Buffer.alloc(0)): Buffer {
  const json = Buffer.from(JSON.stringify(header));
  if (json.length > MAX_HEADER_BYTES || payload.length > MAX_PAYLOAD_BYTES) {
    throw new FrameError('frame over its size bound');
  }
  const head = Buffer.allocUnsafe(HEAD_BYTES);
  head.writeUInt32BE(json.length, 0);
  head.writeUInt32BE(payload.length, 4);
  return Buffer.concat([head, json, payload]);
}

/** Splits bytes from a role into frames; throws FrameError on anything malformed. */
export class FrameReader {
  private chunks: Buffer[] = [];
  private buffered = 0;

  push(chunk: Buffer): Frame[] {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const frames: Frame[] = [];
    for (;;) {
      if (this.buffered < HEAD_BYTES) break;
      const head = this.peek(HEAD_BYTES);
      const headerLength = head.readUInt32BE(0);
      const payloadLength = head.readUInt32BE(4);
      if (headerLength > MAX_HEADER_BYTES || payloadLength > MAX_PAYLOAD_BYTES) {
        throw new FrameError(
          `frame of ${headerLength} + ${payloadLength} bytes is over the bound (${MAX_HEADER_BYTES} + ${MAX_PAYLOAD_BYTES})`,
        );
      }
      const total = HEAD_BYTES + headerLength + payloadLength;
      if (this.buffered < total) break;
      const bytes = this.take(total);
      let header: unknown;
      try {
        header = JSON.parse(bytes.toString('utf8', HEAD_BYTES, HEAD_BYTES + headerLength));
      } catch {
        throw new FrameError('frame header is not JSON');
      }
      if (typeof header !== 'object' || header === null || Array.isArray(header)) {
        throw new FrameError('frame header is not a JSON object');
      }
      frames.push({
        header: header as FrameHeader,
        payload: bytes.subarray(HEAD_BYTES + headerLength),
        size: total,
      });
    }
    return frames;
  }

  private peek(length: number): Buffer {
    if (this.chunks[0]!.length < length) this.chunks = [Buffer.concat(this.chunks)];
    return this.chunks[0]!.subarray(0, length);
  }

  private take(length: number): Buffer {
    const all = this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks);
    const taken = all.subarray(0, length);
    const rest = all.subarray(length);
    this.chunks = rest.length > 0 ? [rest] : [];
    this.buffered = rest.length;
    return taken;
  }
}

/** Field readers for role frames: a wrong type is a FrameError naming the field. */
export const field = {
  int(header: FrameHeader, name: string): number {
    const value = header[name];
    if (!Number.isSafeInteger(value)) throw new FrameError(`frame field ${name} is not an integer`);
    return value as number;
  },
  string(header: FrameHeader, name: string): string {
    const value = header[name];
    if (typeof value !== 'string') throw new FrameError(`frame field ${name} is not a string`);
    return value;
  },
};
