/**
 * Reading the name a client is about to talk to from the first bytes it sends, without
 * consuming them: the TLS ClientHello's server_name, or a plain HTTP request's Host header.
 * Pure functions over a buffer that grows; every byte is hostile.
 */

export type Peek =
  | { readonly status: 'incomplete' }
  /** `name` is undefined when the client sent none (no SNI extension, no Host header). */
  | { readonly status: 'done'; readonly name: string | undefined }
  | { readonly status: 'invalid'; readonly reason: string };

type Incomplete = { readonly status: 'incomplete' };
type Invalid = { readonly status: 'invalid'; readonly reason: string };
const INCOMPLETE: Incomplete = { status: 'incomplete' };
const invalid = (reason: string): Invalid => ({ status: 'invalid', reason });

/** How much we buffer before giving up on finding a name. */
export const MAX_PEEK_BYTES = 64 * 1024;

export const looksLikeTls = (first: number) => first === 0x16;

/**
 * Whether bytes start like a TLS record header: a content type (change_cipher_spec, alert,
 * handshake, application_data), then version 3.0-3.4. 'wait' while too few bytes tell.
 * Client-first protocols (databases) may start with one of those bytes, but not with all three.
 */
export function tlsRecordStart(data: Buffer): boolean | 'wait' {
  if (data.length === 0) return 'wait';
  if (data[0]! < 0x14 || data[0]! > 0x17) return false;
  if (data.length < 3) return data.length < 2 || data[1] === 0x03 ? 'wait' : false;
  return data[1] === 0x03 && data[2]! <= 0x04;
}

/**
 * Records a ClientHello may be split into. Real ones take one or two; a client sending it a
 * byte per record would have every arrival re-read all of them.
 */
const MAX_HELLO_RECORDS = 16;

/** The first handshake message of a TLS stream, and where the record that ends it ends. */
interface HandshakeMessage {
  readonly message: Buffer;
  readonly end: number;
}

/**
 * Joins the handshake fragments carried by consecutive TLS handshake records up to the end of
 * the first message, which must be of `type` (`what` names it in problems). With `alone`, the
 * record that ends the message may carry nothing after it.
 */
function firstHandshakeMessage(
  data: Buffer,
  type: number,
  what: string,
  alone: boolean,
): HandshakeMessage | Incomplete | Invalid {
  const parts: Buffer[] = [];
  let total = 0;
  let offset = 0;
  let needed = Number.POSITIVE_INFINITY;
  while (total < needed) {
    if (parts.length >= MAX_HELLO_RECORDS)
      return invalid(`the ${what} is split over more than ${MAX_HELLO_RECORDS} TLS records`);
    if (offset + 5 > data.length) return INCOMPLETE;
    if (data[offset] !== 0x16)
      return invalid(`a TLS record other than handshake arrived before the ${what} ended`);
    if (data[offset + 1] !== 0x03) return invalid('not a TLS record (bad version byte)');
    const length = data.readUInt16BE(offset + 3);
    if (length === 0 || length > 16384 + 2048) return invalid('TLS record length out of range');
    if (offset + 5 + length > data.length) return INCOMPLETE;
    parts.push(data.subarray(offset + 5, offset + 5 + length));
    total += length;
    offset += 5 + length;
    if (needed === Number.POSITIVE_INFINITY && total >= 4) {
      const head = Buffer.concat(parts);
      if (head[0] !== type) return invalid(`the first handshake message is not a ${what}`);
      needed = 4 + head.readUIntBE(1, 3);
      if (needed > MAX_PEEK_BYTES) return invalid(`${what} too large`);
    }
  }
  // Bytes after a ClientHello in its own record would be read by the server as the next
  // handshake message, one no later check sees.
  if (alone && total > needed)
    return invalid(`the ${what}'s last TLS record carries more than the ${what}`);
  return { message: Buffer.concat(parts).subarray(0, needed), end: offset };
}

/** A ClientHello read whole: its SNI host name, and the bytes of the records it took. */
export type ClientHello =
  | Incomplete
  | { readonly status: 'done'; readonly name: string | undefined; readonly end: number }
  | Invalid;

/** Reads a TLS ClientHello and its SNI host name (RFC 8446 4.1.2, RFC 6066 3). */
export function readClientHello(data: Buffer): ClientHello {
  const first = firstHandshakeMessage(data, 0x01, 'ClientHello', true);
  if ('status' in first) return first;
  const hello = first.message;
  const end = hello.length;
  const done = (name: string | undefined): ClientHello => ({
    status: 'done',
    name,
    end: first.end,
  });
  // type(1) length(3) version(2) random(32)
  let i = 4 + 2 + 32;
  const need = (n: number) => i + n <= end;
  if (!need(1)) return invalid('ClientHello truncated');
  i += 1 + hello[i]!; // session id
  if (!need(2)) return invalid('ClientHello truncated');
  i += 2 + hello.readUInt16BE(i); // cipher suites
  if (!need(1)) return invalid('ClientHello truncated');
  i += 1 + hello[i]!; // compression methods
  if (i === end) return done(undefined); // no extensions at all
  if (!need(2)) return invalid('ClientHello truncated');
  const extensionsEnd = i + 2 + hello.readUInt16BE(i);
  if (extensionsEnd > end) return invalid('ClientHello extensions run past its end');
  i += 2;
  let name: string | undefined;
  while (i + 4 <= extensionsEnd) {
    const type = hello.readUInt16BE(i);
    const length = hello.readUInt16BE(i + 2);
    const body = i + 4;
    if (body + length > extensionsEnd) return invalid('a ClientHello extension runs past its end');
    if (type === 0) {
      if (name !== undefined) return invalid('two server_name extensions');
      if (length < 5) return invalid('server_name extension too short');
      const listEnd = body + 2 + hello.readUInt16BE(body);
      if (listEnd > body + length) return invalid('server_name list runs past its extension');
      let j = body + 2;
      while (j + 3 <= listEnd) {
        const nameType = hello[j]!;
        const nameLength = hello.readUInt16BE(j + 1);
        if (j + 3 + nameLength > listEnd) return invalid('server name runs past its list');
        if (nameType === 0) {
          if (name !== undefined) return invalid('two host names in server_name');
          name = hello.toString('latin1', j + 3, j + 3 + nameLength);
        }
        j += 3 + nameLength;
      }
    }
    i = body + length;
  }
  return done(name);
}

/** Reads the SNI host name of a TLS ClientHello. */
export function peekTlsServerName(data: Buffer): Peek {
  const hello = readClientHello(data);
  return hello.status === 'done' ? { status: 'done', name: hello.name } : hello;
}

/** The random of a ServerHello that is a HelloRetryRequest (RFC 8446 4.1.3). */
const HELLO_RETRY_RANDOM = Buffer.from(
  'cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c',
  'hex',
);

/**
 * Whether a server's first bytes are a HelloRetryRequest, after which the client sends a second
 * ClientHello; 'other' for any other answer (or none that parses), 'incomplete' until it shows.
 */
export function readServerHello(data: Buffer): 'incomplete' | 'retry' | 'other' {
  const first = firstHandshakeMessage(data, 0x02, 'ServerHello', false);
  if ('status' in first) return first.status === 'incomplete' ? 'incomplete' : 'other';
  // type(1) length(3) version(2) random(32)
  const random = first.message.subarray(6, 38);
  return random.equals(HELLO_RETRY_RANDOM) ? 'retry' : 'other';
}

const TOKEN_BYTE = /[!#$%&'*+\-.^_`|~0-9A-Za-z]/;
const isTokenByte = (byte: number) => TOKEN_BYTE.test(String.fromCharCode(byte));

/**
 * Whether a client's first bytes are an HTTP/1.x request, whatever the port: a first line that
 * starts with a method and a space (empty lines before it, which servers skip, included) and
 * ends with an HTTP version. 'wait' until its first line is whole, but no longer than `limit`
 * bytes: a start like a request that runs on past that counts as one (the head limit refuses
 * it). Other protocols' first bytes (binary ones, SSH's banner, RESP, SMTP's EHLO) are not.
 */
export function startsLikeHttp(data: Buffer, limit: number): boolean | 'wait' {
  let i = 0;
  while (i < data.length && (data[i] === 0x0d || data[i] === 0x0a)) i++;
  const method = i;
  while (i < data.length && isTokenByte(data[i]!)) i++;
  if (i === data.length) return data.length > limit || 'wait';
  if (i === method || data[i] !== 0x20) return method > 0;
  const lineEnd = data.indexOf(0x0a, i);
  if (lineEnd < 0) return data.length > limit || 'wait';
  const line = data.toString('latin1', i, lineEnd).replace(/\r$/, '');
  return / HTTP\/\d+\.\d+$/.test(line);
}

/**
 * Reads the Host header of a plain HTTP/1.x request head (exactly one Host allowed). `scanned`:
 * how many bytes an earlier call saw without finding the head's end (they are not searched again).
 */
export function peekHttpHost(data: Buffer, scanned = 0): Peek {
  const headEnd = data.indexOf('\r\n\r\n', Math.max(0, scanned - 3));
  if (headEnd < 0)
    return data.length > MAX_PEEK_BYTES ? invalid('HTTP request head too large') : INCOMPLETE;
  const lines = data.toString('latin1', 0, headEnd).split('\r\n');
  if (!/^[A-Z]+ \S+ HTTP\/1\.[01]$/.test(lines[0] ?? ''))
    return invalid('not an HTTP/1.x request line');
  const hosts = lines.slice(1).filter((line) => /^host:/i.test(line));
  if (hosts.length > 1) return invalid('more than one Host header');
  if (hosts.length === 0) return { status: 'done', name: undefined };
  return { status: 'done', name: hosts[0]!.slice(5).trim() };
}

/** Peeks whichever protocol the first byte says this is (`scanned` as for peekHttpHost). */
export const peekName = (data: Buffer, scanned = 0): Peek =>
  data.length === 0
    ? INCOMPLETE
    : looksLikeTls(data[0]!)
      ? peekTlsServerName(data)
      : peekHttpHost(data, scanned);
