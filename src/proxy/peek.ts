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

const INCOMPLETE: Peek = { status: 'incomplete' };
const invalid = (reason: string): Peek => ({ status: 'invalid', reason });

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

/** Joins the handshake fragments carried by consecutive TLS handshake records. */
function handshakeBytes(data: Buffer): Buffer | Peek {
  const parts: Buffer[] = [];
  let total = 0;
  let offset = 0;
  let needed = Number.POSITIVE_INFINITY;
  while (total < needed) {
    if (parts.length >= MAX_HELLO_RECORDS)
      return invalid(`the ClientHello is split over more than ${MAX_HELLO_RECORDS} TLS records`);
    if (offset + 5 > data.length) return INCOMPLETE;
    if (data[offset] !== 0x16)
      return invalid('a TLS record other than handshake arrived before the ClientHello ended');
    if (data[offset + 1] !== 0x03) return invalid('not a TLS record (bad version byte)');
    const length = data.readUInt16BE(offset + 3);
    if (length === 0 || length > 16384 + 2048) return invalid('TLS record length out of range');
    if (offset + 5 + length > data.length) return INCOMPLETE;
    parts.push(data.subarray(offset + 5, offset + 5 + length));
    total += length;
    offset += 5 + length;
    if (needed === Number.POSITIVE_INFINITY && total >= 4) {
      const head = Buffer.concat(parts);
      if (head[0] !== 0x01) return invalid('the first handshake message is not a ClientHello');
      needed = 4 + head.readUIntBE(1, 3);
      if (needed > MAX_PEEK_BYTES) return invalid('ClientHello too large');
    }
  }
  return Buffer.concat(parts).subarray(0, needed);
}

/** Reads the SNI host name of a TLS ClientHello (RFC 8446 4.1.2, RFC 6066 3). */
export function peekTlsServerName(data: Buffer): Peek {
  const hello = handshakeBytes(data);
  if (!Buffer.isBuffer(hello)) return hello;
  const end = hello.length;
  // type(1) length(3) version(2) random(32)
  let i = 4 + 2 + 32;
  const need = (n: number) => i + n <= end;
  if (!need(1)) return invalid('ClientHello truncated');
  i += 1 + hello[i]!; // session id
  if (!need(2)) return invalid('ClientHello truncated');
  i += 2 + hello.readUInt16BE(i); // cipher suites
  if (!need(1)) return invalid('ClientHello truncated');
  i += 1 + hello[i]!; // compression methods
  if (i === end) return { status: 'done', name: undefined }; // no extensions at all
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
  return { status: 'done', name };
}

/** Reads the Host header of a plain HTTP/1.x request head (exactly one Host allowed). */
export function peekHttpHost(data: Buffer): Peek {
  const headEnd = data.indexOf('\r\n\r\n');
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

/** Peeks whichever protocol the first byte says this is. */
export const peekName = (data: Buffer): Peek =>
  data.length === 0
    ? INCOMPLETE
    : looksLikeTls(data[0]!)
      ? peekTlsServerName(data)
      : peekHttpHost(data);
