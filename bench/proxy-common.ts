/**
 * Shared pieces of `npm run bench:proxy`: the names and credentials every process agrees on,
 * the messages the load client takes and answers over IPC, an incremental HTTP/1.1 response
 * reader for the load client, and percentiles.
 */
import type { HostPort } from '../src/net/index.js';

/** The name every proxy is asked for; Moat's fake DNS and squid's hosts_file map it. */
export const ORIGIN_NAME = 'origin.bench.test';
/** The origin listens here (loopback, outside 127.0.0.1 so nothing else is in the way). */
export const ORIGIN_IP = '127.0.0.20';
export const BENCH_SANDBOX_ID = 'iproxybench000000001';
export const BENCH_SECRET = 'bench-egress-secret';
/** Body size of the origin's small answers. */
export const SMALL_BODY_BYTES = 64;

export type Mode = 'moat' | 'squid' | 'direct';

/** Where the load client sends its traffic: through a proxy, or straight to the origin. */
export interface Via {
  readonly mode: Mode;
  /** The proxy; absent for direct. */
  readonly proxy?: HostPort;
}

export interface OriginAddress {
  readonly ip: string;
  readonly httpPort: number;
  readonly bulkPort: number;
}

export type Job =
  | {
      readonly type: 'tunnels';
      readonly via: Via;
      readonly concurrency: number;
      readonly seconds: number;
    }
  | { readonly type: 'rate'; readonly via: Via; readonly rate: number; readonly seconds: number }
  | { readonly type: 'bulk'; readonly via: Via; readonly bytes: number }
  | {
      readonly type: 'get';
      readonly via: Via;
      readonly connections: number;
      readonly seconds: number;
    };

/** Latency summary in milliseconds. */
export interface Latency {
  readonly p50: number;
  readonly p99: number;
  readonly max: number;
  readonly samples: number;
}

export interface ClosedLoopResult {
  /** Iterations (tunnels or requests) completed inside the measured window. */
  readonly completed: number;
  readonly perSecond: number;
  readonly errors: number;
  readonly firstError?: string;
  /** Full iteration (tunnels: connect to last response byte; GET: request to response). */
  readonly latency: Latency;
  /** Tunnels only: connect + CONNECT 200 (direct: TCP connect). */
  readonly setup?: Latency;
}

export interface RateResult {
  readonly launched: number;
  readonly completed: number;
  readonly errors: number;
  readonly firstError?: string;
  readonly achievedRate: number;
  /** Connect + CONNECT 200 (direct: TCP connect), from the moment the connect was issued. */
  readonly setup: Latency;
  readonly full: Latency;
  /** How late the client started iterations against their schedule (client-side noise). */
  readonly lag: Latency;
}

export interface BulkResult {
  readonly bytes: number;
  readonly seconds: number;
  /** 10^6 bytes per second. */
  readonly mbPerSecond: number;
  readonly error?: string;
}

export type JobResult = ClosedLoopResult | RateResult | BulkResult;

/** Nearest-rank percentile of values sorted in place. */
export function summarise(values: Float64Array | number[], count = values.length): Latency {
  if (count === 0) return { p50: Number.NaN, p99: Number.NaN, max: Number.NaN, samples: 0 };
  const sorted = Float64Array.from(values.slice(0, count)).sort();
  const at = (p: number) => sorted[Math.min(count - 1, Math.max(0, Math.ceil(p * count) - 1))]!;
  return { p50: at(0.5), p99: at(0.99), max: sorted[count - 1]!, samples: count };
}

const CRLF2 = Buffer.from('\r\n\r\n');

/**
 * Reads HTTP/1.1 responses from a byte stream, one at a time: Content-Length or chunked bodies
 * (a close-delimited body is reported as an error: every server here sends a length).
 * `push` returns 'more' until a response is complete, then 'done' (the status is in `status`
 * and bytes past the response stay in `rest`), or an error string.
 */
export class ResponseReader {
  status = 0;
  head = '';
  private buffered: Buffer | undefined;
  private bodyLeft = -1;
  private chunked = false;
  rest: Buffer | undefined;

  reset(): void {
    this.status = 0;
    this.head = '';
    this.buffered = undefined;
    this.bodyLeft = -1;
    this.chunked = false;
    this.rest = undefined;
  }

  push(chunk: Buffer): 'more' | 'done' | string {
    let data = this.buffered === undefined ? chunk : Buffer.concat([this.buffered, chunk]);
    this.buffered = undefined;
    if (this.status === 0) {
      const end = data.indexOf(CRLF2);
      if (end < 0) {
        if (data.length > 64 * 1024) return 'response head too long';
        this.buffered = data;
        return 'more';
      }
      this.head = data.toString('latin1', 0, end);
      this.status = Number(this.head.slice(9, 12));
      data = data.subarray(end + 4);
      const lower = this.head.toLowerCase();
      const length = /\r\ncontent-length:\s*(\d+)/.exec(lower);
      if (length) this.bodyLeft = Number(length[1]);
      else if (/\r\ntransfer-encoding:[^\r]*chunked/.test(lower)) this.chunked = true;
      else if (this.status === 204 || this.status === 304) this.bodyLeft = 0;
      else return `response without a length: ${this.head.split('\r\n')[0]}`;
    }
    if (!this.chunked) {
      if (data.length < this.bodyLeft) {
        this.bodyLeft -= data.length;
        return 'more';
      }
      this.rest = data.length > this.bodyLeft ? data.subarray(this.bodyLeft) : undefined;
      this.bodyLeft = 0;
      return 'done';
    }
    // Chunked: bodyLeft is what remains of the current chunk's data plus its CRLF (-1: a size).
    for (;;) {
      if (this.bodyLeft > 0) {
        if (data.length < this.bodyLeft) {
          this.bodyLeft -= data.length;
          return 'more';
        }
        data = data.subarray(this.bodyLeft);
        this.bodyLeft = -1;
      }
      const eol = data.indexOf('\r\n');
      if (eol < 0) {
        this.buffered = data;
        return 'more';
      }
      const size = Number.parseInt(data.toString('latin1', 0, eol), 16);
      if (!Number.isFinite(size)) return 'bad chunk size';
      if (size === 0) {
        // Last chunk; no trailers expected: CRLF follows.
        if (data.length < eol + 4) {
          this.buffered = data;
          return 'more';
        }
        this.rest = data.length > eol + 4 ? data.subarray(eol + 4) : undefined;
        return 'done';
      }
      data = data.subarray(eol + 2);
      this.bodyLeft = size + 2;
    }
  }
}
