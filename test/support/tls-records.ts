/** TLS records built byte by byte, for tests of what Moat reads from handshakes. */

export function u16(value: number): Buffer {
  return Buffer.from([value >> 8, value & 255]);
}

/** A minimal ClientHello handshake message (one cipher suite, no compression) with `name` as its SNI. */
export function clientHello(name: string): Buffer {
  const host = Buffer.from(name, 'latin1');
  const serverNameList = Buffer.concat([
    Buffer.from([0, host.length >> 8, host.length & 255]),
    host,
  ]);
  const sni = Buffer.concat([
    Buffer.from([0, 0]), // extension type server_name
    u16(serverNameList.length + 2),
    u16(serverNameList.length),
    serverNameList,
  ]);
  const body = Buffer.concat([
    Buffer.from([3, 3]), // legacy version
    Buffer.alloc(32, 7), // random
    Buffer.from([0]), // session id
    u16(2),
    Buffer.from([0x13, 0x01]), // TLS_AES_128_GCM_SHA256
    Buffer.from([1, 0]), // compression: null
    u16(sni.length),
    sni,
  ]);
  return Buffer.concat([Buffer.from([1, 0, body.length >> 8, body.length & 255]), body]);
}

/** The random that marks a ServerHello as a HelloRetryRequest (RFC 8446 4.1.3). */
const RETRY_RANDOM = Buffer.from(
  'cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c',
  'hex',
);

/** A ServerHello handshake message: a HelloRetryRequest, or an ordinary one. */
export function serverHello(retry: boolean): Buffer {
  const body = Buffer.concat([
    Buffer.from([3, 3]),
    retry ? RETRY_RANDOM : Buffer.alloc(32, 9),
    Buffer.from([0]), // session id
    Buffer.from([0x13, 0x01]),
    Buffer.from([0]), // compression
    u16(6),
    Buffer.from([0, 43, 0, 2, 3, 4]), // supported_versions: TLS 1.3
  ]);
  return Buffer.concat([Buffer.from([2, 0, body.length >> 8, body.length & 255]), body]);
}

/** Handshake bytes in TLS handshake records of at most `size` bytes each. */
export function inRecords(handshake: Buffer, size = 16384): Buffer {
  const records: Buffer[] = [];
  for (let at = 0; at < handshake.length; at += size) {
    const fragment = handshake.subarray(at, at + size);
    records.push(Buffer.from([0x16, 3, 1, fragment.length >> 8, fragment.length & 255]), fragment);
  }
  return Buffer.concat(records);
}

/** One TLS record of another content type: change_cipher_spec, alert or application data. */
export function record(type: 'ccs' | 'alert' | 'data', body?: Buffer): Buffer {
  const code = { ccs: 0x14, alert: 0x15, data: 0x17 }[type];
  const payload = body ?? (type === 'ccs' ? Buffer.from([1]) : Buffer.from([1, 0]));
  return Buffer.concat([Buffer.from([code, 3, 3]), u16(payload.length), payload]);
}
