/**
 * HTTP/1.1 message heads and body framing for the forward proxy (RFC 9112), strict by design:
 * whatever two parsers could read differently (bare LF, obs-fold, Content-Length with
 * Transfer-Encoding, odd lengths) is refused rather than interpreted, so Moat and the origin
 * always agree on where one request ends and the next begins. Pure functions over bytes; every
 * byte is hostile.
 */

/** Longest request head accepted (request line, fields and the blank line). */
export const MAX_REQUEST_HEAD_BYTES = 16 * 1024;
/** Longest response head accepted from an origin. */
export const MAX_RESPONSE_HEAD_BYTES = 64 * 1024;
/** Most header fields in one head. */
export const MAX_HEADER_FIELDS = 100;
/** Longest chunk-size line (size and extensions), and all trailer fields together. */
const MAX_CHUNK_LINE_BYTES = 4 * 1024;
const MAX_TRAILER_BYTES = 16 * 1024;

export interface HeaderField {
  /** As received (forwarded in this case). */
  readonly name: string;
  readonly lower: string;
  readonly value: string;
}

export interface RequestHead {
  readonly method: string;
  readonly target: string;
  /** 0 for HTTP/1.0, 1 for HTTP/1.1. */
  readonly minor: 0 | 1;
  readonly fields: readonly HeaderField[];
}

export interface ResponseHead {
  readonly status: number;
  readonly reason: string;
  readonly minor: 0 | 1;
  readonly fields: readonly HeaderField[];
}

/** How a message body is delimited. */
export type Framing =
  | { readonly kind: 'none' }
  | { readonly kind: 'length'; readonly bytes: number }
  | { readonly kind: 'chunked' }
  /** Until the sender closes (responses only). */
  | { readonly kind: 'close' };

/** Why a head or body cannot be used, with the status a client should get. */
export interface MessageError {
  readonly status: 400 | 431 | 501 | 502;
  readonly message: string;
}

export type Parsed<T> =
  { readonly ok: true; readonly value: T } | ({ readonly ok: false } & MessageError);

const fail = (status: MessageError['status'], message: string): { ok: false } & MessageError => ({
  ok: false,
  status,
  message,
});

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** Field values: visible ASCII, space, tab and obs-text; never CR, LF, NUL or other controls. */
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
const REQUEST_LINE = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([!-~\x80-\xff]+) HTTP\/1\.([01])$/;
const STATUS_LINE = /^HTTP\/1\.([01]) ([1-9]\d\d)(?: ([\t\x20-\x7e\x80-\xff]*))?$/;

const CR = 0x0d;
const LF = 0x0a;

/**
 * Where the head in `data` ends (the index just past its blank line), 'incomplete', or a
 * problem: a bare LF anywhere (400), or more than `limit` bytes without an end (431).
 */
export function headEnd(
  data: Buffer,
  limit: number,
  /** Bytes at the start of `data` already looked at by an earlier call (the head grows). */
  from = 0,
): number | 'incomplete' | MessageError {
  const end = data.indexOf('\r\n\r\n', Math.max(0, from - 3), 'latin1');
  const scanned = end < 0 ? data.length : end + 4;
  // A bare LF would end a line for some parsers and not for others.
  for (let i = data.indexOf(LF, from); i >= 0 && i < scanned; i = data.indexOf(LF, i + 1)) {
    if (i === 0 || data[i - 1] !== CR)
      return { status: 400, message: 'a line ends in a bare LF (lines must end in CRLF)' };
  }
  const tooLong = { status: 431, message: `the head is longer than ${limit} bytes` } as const;
  if (end < 0) return data.length > limit ? tooLong : 'incomplete';
  return end + 4 > limit ? tooLong : end + 4;
}

const SP = 0x20;
const HTAB = 0x09;

/** `line` from `start` without the spaces and tabs around it (OWS; trim() would take more). */
function withoutOws(line: string, start: number): string {
  let from = start;
  let to = line.length;
  while (from < to && (line.charCodeAt(from) === SP || line.charCodeAt(from) === HTAB)) from++;
  while (to > from && (line.charCodeAt(to - 1) === SP || line.charCodeAt(to - 1) === HTAB)) to--;
  return line.slice(from, to);
}

/**
 * The header fields of a head. `quote`: a problem may quote the line at fault (a client's own
 * request); an origin's answer is named by line number only, since it may echo the credentials
 * Moat added, and the problem reaches the sandbox and the log, unredacted.
 */
function parseFields(lines: readonly string[], quote: boolean): Parsed<HeaderField[]> | string {
  if (lines.length > MAX_HEADER_FIELDS) return `more than ${MAX_HEADER_FIELDS} header fields`;
  const fields: HeaderField[] = [];
  for (const [index, line] of lines.entries()) {
    if (line.startsWith(' ') || line.startsWith('\t'))
      return fail(400, 'a header line starts with whitespace (obsolete line folding)');
    const colon = line.indexOf(':');
    const name = colon < 0 ? '' : line.slice(0, colon);
    const at = quote ? JSON.stringify(line.slice(0, 60)) : String(index + 1);
    if (!TOKEN.test(name))
      return fail(400, `header line ${at} is not "name: value" with a token name`);
    const value = withoutOws(line, colon + 1);
    if (line.includes('\r') || !FIELD_VALUE.test(value))
      return fail(400, `header ${quote ? name : `line ${at}`} holds a control character`);
    const lower = name.toLowerCase();
    if (foldsToConnectionField(lower))
      return fail(
        400,
        `header ${name} would read as ${lower.replaceAll('_', '-')} to a server that folds "_" into "-"`,
      );
    fields.push({ name, lower, value });
  }
  return { ok: true, value: fields };
}

/** Parses a request head (the bytes up to and including its blank line). */
export function parseRequestHead(head: Buffer): Parsed<RequestHead> {
  const lines = head.toString('latin1', 0, head.length - 4).split('\r\n');
  const start = REQUEST_LINE.exec(lines[0]!);
  if (!start)
    return fail(
      400,
      `request line ${JSON.stringify(lines[0]!.slice(0, 80))} is not "METHOD target HTTP/1.x"`,
    );
  const fields = parseFields(lines.slice(1), true);
  if (typeof fields === 'string') return fail(431, `the request has ${fields}`);
  if (!fields.ok) return fields;
  return {
    ok: true,
    value: {
      method: start[1]!,
      target: start[2]!,
      minor: start[3] === '1' ? 1 : 0,
      fields: fields.value,
    },
  };
}

/**
 * Parses a response head; problems are the origin's, so they map to 502, and quote none of its
 * bytes (they may echo the credentials Moat added).
 */
export function parseResponseHead(head: Buffer): Parsed<ResponseHead> {
  const lines = head.toString('latin1', 0, head.length - 4).split('\r\n');
  const start = STATUS_LINE.exec(lines[0]!);
  if (!start) return fail(502, 'its status line is not HTTP/1.x');
  const fields = parseFields(lines.slice(1), false);
  if (typeof fields === 'string') return fail(502, `its response has ${fields}`);
  if (!fields.ok) return fail(502, `its response is malformed: ${fields.message}`);
  return {
    ok: true,
    value: {
      status: Number(start[2]),
      reason: start[3] ?? '',
      minor: start[1] === '1' ? 1 : 0,
      fields: fields.value,
    },
  };
}

export function fieldValues(fields: readonly HeaderField[], lower: string): string[] {
  const values: string[] = [];
  for (const field of fields) if (field.lower === lower) values.push(field.value);
  return values;
}

/** The comma-separated tokens of every `lower` field, lower-cased (e.g. Connection options). */
export function fieldTokens(fields: readonly HeaderField[], lower: string): string[] {
  const values = fieldValues(fields, lower);
  // Most heads have no such field (asked of every request and response).
  if (values.length === 0) return values;
  return values
    .flatMap((value) => value.split(','))
    .map((token) => token.trim().toLowerCase())
    .filter((token) => token !== '');
}

const DIGITS = /^\d{1,15}$/;

/** How a request's body is delimited; anything ambiguous is refused (RFC 9112 6.1-6.3). */
export function requestFraming(head: RequestHead): Parsed<Framing> {
  const lengths = fieldValues(head.fields, 'content-length');
  const codings = fieldTokens(head.fields, 'transfer-encoding');
  const hasCodings = head.fields.some((field) => field.lower === 'transfer-encoding');
  if (hasCodings) {
    // HTTP/1.0 has no transfer codings: such a message is faulty (RFC 9112 6.1).
    if (head.minor === 0) return fail(400, 'an HTTP/1.0 request has Transfer-Encoding');
    if (lengths.length > 0)
      return fail(400, 'the request has both Transfer-Encoding and Content-Length');
    if (codings.length !== 1 || codings[0] !== 'chunked')
      return fail(
        501,
        `Transfer-Encoding ${JSON.stringify(codings.join(', '))} is not supported (only chunked)`,
      );
    return { ok: true, value: { kind: 'chunked' } };
  }
  if (lengths.length > 1) return fail(400, 'the request has more than one Content-Length');
  if (lengths.length === 0) return { ok: true, value: { kind: 'none' } };
  if (!DIGITS.test(lengths[0]!))
    return fail(400, `Content-Length ${JSON.stringify(lengths[0])} is not a decimal number`);
  const bytes = Number(lengths[0]);
  return { ok: true, value: bytes === 0 ? { kind: 'none' } : { kind: 'length', bytes } };
}

/**
 * How a response's body is delimited (RFC 9112 6.3), given the request method. `reusable` is
 * false when the connection must not carry another request afterwards.
 */
export function responseFraming(
  method: string,
  head: ResponseHead,
): Parsed<{ framing: Framing; reusable: boolean }> {
  const reusable = head.minor === 1 && !fieldTokens(head.fields, 'connection').includes('close');
  const lengths = fieldValues(head.fields, 'content-length');
  if (method === 'HEAD' || head.status < 200)
    return { ok: true, value: { framing: { kind: 'none' }, reusable } };
  if (head.status === 204 || head.status === 304) {
    // No body, whatever the head announces. An origin that announces one anyway may send it,
    // and on a pooled connection those bytes would be read as the next request's answer.
    const announcesBody =
      head.fields.some((field) => field.lower === 'transfer-encoding') ||
      lengths.some((value) => value.trim() !== '0');
    return { ok: true, value: { framing: { kind: 'none' }, reusable: reusable && !announcesBody } };
  }
  if (head.fields.some((field) => field.lower === 'transfer-encoding')) {
    const codings = fieldTokens(head.fields, 'transfer-encoding');
    // Chunked last delimits the body; any other coding last runs until close. A length beside
    // a coding is ignored, and the connection is not trusted with another request.
    return codings.at(-1) === 'chunked'
      ? {
          ok: true,
          value: { framing: { kind: 'chunked' }, reusable: reusable && lengths.length === 0 },
        }
      : { ok: true, value: { framing: { kind: 'close' }, reusable: false } };
  }
  if (lengths.length === 0)
    return { ok: true, value: { framing: { kind: 'close' }, reusable: false } };
  const distinct =
    lengths.length === 1 && DIGITS.test(lengths[0]!)
      ? lengths // One plain number, the usual case: nothing to split.
      : [...new Set(lengths.flatMap((value) => value.split(',')).map((v) => v.trim()))];
  const [length] = distinct;
  if (distinct.length !== 1 || !DIGITS.test(length!))
    // Not quoted: the origin's bytes may echo the credentials Moat added.
    return fail(502, `its Content-Length (${lengths.length} field(s)) is not one number`);
  const bytes = Number(length);
  return {
    ok: true,
    value: { framing: bytes === 0 ? { kind: 'none' } : { kind: 'length', bytes }, reusable },
  };
}

/** Fields that describe one connection (RFC 9110 7.6.1). */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'te', 'trailer', 'upgrade']);

/**
 * A field (lower case) that stops at this hop: one describing the connection, or any `Proxy-*`
 * field (credentials and options meant for a proxy). The framing fields are the caller's
 * business: Moat's own HTTP code rewrites them, Node's writes its own.
 */
export function isHopByHop(lower: string): boolean {
  return HOP_BY_HOP.has(lower) || lower.startsWith('proxy-');
}

/** Fields that say where a body ends: written by Moat from the framing it checked. */
const FRAMING_FIELDS = new Set(['content-length', 'transfer-encoding']);

/**
 * A field name (lower case) with `_` that some servers (CGI, PHP, nginx with
 * underscores_in_headers) read as a framing or hop-by-hop field once `_` becomes `-`:
 * `Transfer_Encoding` beside the Content-Length Moat frames by would split one request in two
 * there. Such a name is never forwarded.
 */
export function foldsToConnectionField(lower: string): boolean {
  if (!lower.includes('_')) return false;
  const folded = lower.replaceAll('_', '-');
  return isHopByHop(folded) || FRAMING_FIELDS.has(folded);
}

/**
 * The fields to forward: without hop-by-hop fields and those the Connection field names,
 * without the framing fields (see `framingFields`), and without `drop` (fields the caller
 * writes itself).
 */
export function endToEndFields(
  fields: readonly HeaderField[],
  drop: ReadonlySet<string> = new Set(),
): string {
  const named = fieldTokens(fields, 'connection');
  let out = '';
  for (const field of fields) {
    const skip =
      isHopByHop(field.lower) ||
      FRAMING_FIELDS.has(field.lower) ||
      drop.has(field.lower) ||
      named.includes(field.lower);
    if (!skip) out += `${field.name}: ${field.value}\r\n`;
  }
  return out;
}

/**
 * The framing fields for the next hop, from the framing Moat checked and relays: so what the
 * next hop reads as the body's end is exactly where Moat found it (a Connection option naming
 * Content-Length, or a length beside a transfer coding, cannot make them disagree). Without a
 * body (HEAD, 204, 304, a zero length) the fields received are passed on as information.
 */
export function framingFields(fields: readonly HeaderField[], framing: Framing): string {
  switch (framing.kind) {
    case 'length':
      return `Content-Length: ${framing.bytes}\r\n`;
    case 'chunked':
    case 'close': {
      const codings = fieldTokens(fields, 'transfer-encoding');
      return codings.length === 0 ? '' : `Transfer-Encoding: ${codings.join(', ')}\r\n`;
    }
    case 'none': {
      let out = '';
      for (const field of fields)
        if (FRAMING_FIELDS.has(field.lower)) out += `${field.name}: ${field.value}\r\n`;
      return out;
    }
  }
}

/**
 * Finds where a body ends in the bytes that follow its head, one chunk at a time. `scan`
 * answers how many bytes of `data` belong to the body (the rest is the next message), or a
 * problem; after `done` is true no more bytes belong to it. `content`, when given, is handed the
 * body's content as it passes: the bytes themselves, without the chunked coding's framing.
 */
export interface BodyScanner {
  scan(data: Buffer, content?: (bytes: Buffer) => void): number | string;
  readonly done: boolean;
}

export function bodyScanner(framing: Framing): BodyScanner {
  switch (framing.kind) {
    case 'none':
      return { scan: () => 0, done: true };
    case 'length':
      return new LengthScanner(framing.bytes);
    case 'chunked':
      return new ChunkedScanner();
    case 'close':
      return {
        scan: (data, content) => {
          content?.(data);
          return data.length;
        },
        done: false,
      };
  }
}

class LengthScanner implements BodyScanner {
  constructor(private remaining: number) {}

  get done(): boolean {
    return this.remaining === 0;
  }

  scan(data: Buffer, content?: (bytes: Buffer) => void): number {
    const taken = Math.min(this.remaining, data.length);
    this.remaining -= taken;
    if (taken > 0) content?.(data.subarray(0, taken));
    return taken;
  }
}

const enum Chunked {
  Size,
  Extension,
  SizeLF,
  Data,
  DataCR,
  DataLF,
  TrailerStart,
  Trailer,
  TrailerLF,
  EndLF,
  Done,
}

const HEX: Record<number, number> = {};
for (let i = 0; i < 16; i++) {
  HEX['0123456789abcdef'.charCodeAt(i)] = i;
  HEX['0123456789ABCDEF'.charCodeAt(i)] = i;
}

/** Chunked transfer coding (RFC 9112 7.1): sizes, extensions, data, CRLFs and trailers. */
class ChunkedScanner implements BodyScanner {
  private state = Chunked.Size;
  private size = 0;
  private digits = 0;
  private lineBytes = 0;
  private trailerBytes = 0;

  get done(): boolean {
    return this.state === Chunked.Done;
  }

  scan(data: Buffer, content?: (bytes: Buffer) => void): number | string {
    let i = 0;
    while (i < data.length && this.state !== Chunked.Done) {
      if (this.state === Chunked.Data) {
        const taken = Math.min(this.size, data.length - i);
        if (taken > 0) content?.(data.subarray(i, i + taken));
        this.size -= taken;
        i += taken;
        if (this.size === 0) this.state = Chunked.DataCR;
        continue;
      }
      const byte = data[i++]!;
      switch (this.state) {
        case Chunked.Size: {
          const digit = HEX[byte];
          if (digit !== undefined && this.digits < 12) {
            this.size = this.size * 16 + digit;
            this.digits++;
          } else if (this.digits === 0) return 'a chunk size is not hexadecimal';
          else if (digit !== undefined) return 'a chunk size is too large';
          else if (byte === CR) this.state = Chunked.SizeLF;
          else if (byte === 0x3b /* ; */ || byte === 0x20 || byte === 0x09) {
            this.state = Chunked.Extension;
            this.lineBytes = this.digits + 1;
          } else return 'a chunk size line holds an unexpected byte';
          break;
        }
        case Chunked.Extension:
          if (byte === CR) this.state = Chunked.SizeLF;
          else if (byte === LF || byte === 0) return 'a chunk extension holds LF or NUL';
          else if (++this.lineBytes > MAX_CHUNK_LINE_BYTES) return 'a chunk size line is too long';
          break;
        case Chunked.SizeLF:
          if (byte !== LF) return 'a chunk size line does not end in CRLF';
          this.digits = 0;
          if (this.size === 0) this.state = Chunked.TrailerStart;
          else this.state = Chunked.Data;
          break;
        case Chunked.DataCR:
          if (byte !== CR) return 'chunk data is longer than its size';
          this.state = Chunked.DataLF;
          break;
        case Chunked.DataLF:
          if (byte !== LF) return 'chunk data does not end in CRLF';
          this.state = Chunked.Size;
          break;
        case Chunked.TrailerStart:
          if (byte === CR) this.state = Chunked.EndLF;
          else if (byte === LF || byte === 0x20 || byte === 0x09)
            return 'a trailer line starts badly';
          else {
            this.state = Chunked.Trailer;
            this.trailerBytes++;
          }
          break;
        case Chunked.Trailer:
          if (++this.trailerBytes > MAX_TRAILER_BYTES) return 'the trailer section is too long';
          if (byte === CR) this.state = Chunked.TrailerLF;
          else if (byte === LF || byte === 0) return 'a trailer line holds LF or NUL';
          break;
        case Chunked.TrailerLF:
          if (byte !== LF) return 'a trailer line does not end in CRLF';
          this.state = Chunked.TrailerStart;
          break;
        case Chunked.EndLF:
          if (byte !== LF) return 'the chunked body does not end in CRLF';
          this.state = Chunked.Done;
          break;
      }
    }
    return i;
  }
}
