/**
 * The forward proxy's HTTP/1.1 reading (src/proxy/http1.ts): heads, framing and the body
 * scanners, pinned by tables and by properties against a plain reference encoder.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  bodyScanner,
  endToEndFields,
  type Framing,
  framingFields,
  headEnd,
  parseRequestHead,
  parseResponseHead,
  type RequestHead,
  requestFraming,
  responseFraming,
} from '../../src/proxy/http1.js';

const bytes = (text: string) => Buffer.from(text, 'latin1');

function request(text: string): RequestHead {
  const parsed = parseRequestHead(bytes(text));
  if (!parsed.ok) throw new Error(parsed.message);
  return parsed.value;
}

describe('headEnd', () => {
  it('finds the blank line, waits for more, and refuses bare LF and oversized heads', () => {
    expect(headEnd(bytes('GET / HTTP/1.1\r\nHost: a\r\n\r\nrest'), 100)).toBe(27);
    expect(headEnd(bytes('GET / HTTP/1.1\r\nHost: a\r\n'), 100)).toBe('incomplete');
    expect(headEnd(bytes('GET / HTTP/1.1\nHost: a\r\n\r\n'), 100)).toMatchObject({ status: 400 });
    expect(headEnd(bytes('GET / HTTP/1.1\r\nHost: a\n\n'), 100)).toMatchObject({ status: 400 });
    expect(headEnd(bytes('\n'), 100)).toMatchObject({ status: 400 });
    expect(headEnd(Buffer.alloc(101, 0x61), 100)).toMatchObject({ status: 431 });
    expect(headEnd(bytes(`GET / HTTP/1.1\r\nX: ${'a'.repeat(100)}\r\n\r\n`), 100)).toMatchObject({
      status: 431,
    });
    // A bare LF after the head belongs to the body, which is not the head's business.
    expect(headEnd(bytes('GET / HTTP/1.1\r\n\r\n\n'), 100)).toBe(18);
  });
});

describe('parseRequestHead', () => {
  it('reads method, target, version and fields as sent', () => {
    expect(
      request(
        'GET http://a.test/x?y=1 HTTP/1.1\r\nHost: a.test\r\nX-Long:  spaced value \t\r\n\r\n',
      ),
    ).toEqual({
      method: 'GET',
      target: 'http://a.test/x?y=1',
      minor: 1,
      fields: [
        { name: 'Host', lower: 'host', value: 'a.test' },
        { name: 'X-Long', lower: 'x-long', value: 'spaced value' },
      ],
    });
    expect(request('CONNECT a.test:443 HTTP/1.0\r\n\r\n')).toMatchObject({ minor: 0 });
    expect(request('GET / HTTP/1.1\r\nEmpty:\r\n\r\n').fields[0]!.value).toBe('');
    expect(request('GET / HTTP/1.1\r\nBlank: \t \r\n\r\n').fields[0]!.value).toBe('');
    // Only spaces and tabs are optional whitespace: obs-text (a no-break space) stays.
    expect(request('GET / HTTP/1.1\r\nX: \xa0a \xa0\t\r\n\r\n').fields[0]!.value).toBe(
      '\xa0a \xa0',
    );
  });

  it.each([
    ['a lower-case version', 'GET / http/1.1\r\n\r\n', 400],
    ['HTTP/2', 'GET / HTTP/2.0\r\n\r\n', 400],
    ['two spaces', 'GET  / HTTP/1.1\r\n\r\n', 400],
    ['a space in the target', 'GET /a b HTTP/1.1\r\n\r\n', 400],
    ['a control byte in the target', 'GET /\x01 HTTP/1.1\r\n\r\n', 400],
    ['no version', 'GET /\r\n\r\n', 400],
    ['a method that is not a token', 'G(T / HTTP/1.1\r\n\r\n', 400],
    ['obs-fold', 'GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n', 400],
    ['a tab-folded line', 'GET / HTTP/1.1\r\nX: a\r\n\tb\r\n\r\n', 400],
    ['space before the colon', 'GET / HTTP/1.1\r\nHost : a\r\n\r\n', 400],
    ['no colon', 'GET / HTTP/1.1\r\nHost\r\n\r\n', 400],
    ['an empty name', 'GET / HTTP/1.1\r\n: a\r\n\r\n', 400],
    ['NUL in a value', 'GET / HTTP/1.1\r\nX: a\0b\r\n\r\n', 400],
    ['a bare CR in a value', 'GET / HTTP/1.1\r\nX: a\rb\r\n\r\n', 400],
    ['DEL in a value', 'GET / HTTP/1.1\r\nX: a\x7fb\r\n\r\n', 400],
    [
      '101 fields',
      `GET / HTTP/1.1\r\n${Array.from({ length: 101 }, (_, i) => `X${i}: v\r\n`).join('')}\r\n`,
      431,
    ],
  ])('refuses %s', (_, text, status) => {
    expect(parseRequestHead(bytes(text))).toMatchObject({ ok: false, status });
  });

  it('refuses Transfer-Encoding in HTTP/1.0 (it has no transfer codings)', () => {
    const head = request('POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n');
    expect(requestFraming(head)).toMatchObject({ ok: false, status: 400 });
  });

  it.each([
    'Transfer_Encoding',
    'content_length',
    'Keep_Alive',
    'Proxy_Authorization',
    'Connection_',
  ])(
    'refuses %s: a server folding "_" into "-" would read a framing or hop-by-hop field',
    (name) => {
      for (const parse of [parseRequestHead, parseResponseHead]) {
        const start = parse === parseRequestHead ? 'POST / HTTP/1.1' : 'HTTP/1.1 200 OK';
        const parsed = parse(bytes(`${start}\r\nContent-Length: 4\r\n${name}: chunked\r\n\r\n`));
        expect(parsed.ok, name).toBe(name === 'Connection_');
      }
    },
  );

  it('keeps other names with "_" (they fold to nothing that frames or ends at a hop)', () => {
    expect(request('GET / HTTP/1.1\r\nX_Api_Key: k\r\nUser_Agent: u\r\n\r\n').fields).toHaveLength(
      2,
    );
  });

  it('finds a head that grows, looking only at the new bytes', () => {
    const data = bytes('GET / HTTP/1.1\r\nHost: a\r\n\r\n');
    for (let cut = 0; cut < data.length; cut++) {
      const first = headEnd(data.subarray(0, cut), 100);
      expect(first === 'incomplete' || first === data.length).toBe(true);
      expect(headEnd(data, 100, cut)).toBe(data.length);
    }
    expect(headEnd(bytes('GET / HTTP/1.1\r\nA: b\n\r\n'), 100, 20)).toMatchObject({ status: 400 });
  });

  it('accepts 100 fields and obs-text in values', () => {
    const text = `GET / HTTP/1.1\r\n${Array.from({ length: 100 }, (_, i) => `X${i}: v\r\n`).join('')}\r\n`;
    expect(parseRequestHead(bytes(text)).ok).toBe(true);
    expect(request('GET / HTTP/1.1\r\nX: caf\xe9\r\n\r\n').fields[0]!.value).toBe('caf\xe9');
  });
});

describe('requestFraming', () => {
  const framing = (fields: string) => requestFraming(request(`POST / HTTP/1.1\r\n${fields}\r\n`));
  it.each([
    ['', { ok: true, value: { kind: 'none' } }],
    ['Content-Length: 0\r\n', { ok: true, value: { kind: 'none' } }],
    ['Content-Length: 12\r\n', { ok: true, value: { kind: 'length', bytes: 12 } }],
    ['Transfer-Encoding: chunked\r\n', { ok: true, value: { kind: 'chunked' } }],
    ['Transfer-Encoding: Chunked \r\n', { ok: true, value: { kind: 'chunked' } }],
    ['Content-Length: 5\r\nTransfer-Encoding: chunked\r\n', { ok: false, status: 400 }],
    ['Transfer-Encoding: chunked\r\nContent-Length: 5\r\n', { ok: false, status: 400 }],
    ['Content-Length: 5\r\nContent-Length: 5\r\n', { ok: false, status: 400 }],
    ['Content-Length: 5, 5\r\n', { ok: false, status: 400 }],
    ['Content-Length: +5\r\n', { ok: false, status: 400 }],
    ['Content-Length: 0x10\r\n', { ok: false, status: 400 }],
    ['Content-Length: 1234567890123456\r\n', { ok: false, status: 400 }],
    ['Transfer-Encoding: gzip\r\n', { ok: false, status: 501 }],
    ['Transfer-Encoding: gzip, chunked\r\n', { ok: false, status: 501 }],
    ['Transfer-Encoding: chunked, chunked\r\n', { ok: false, status: 501 }],
    ['Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n', { ok: false, status: 501 }],
    ['Transfer-Encoding:\r\n', { ok: false, status: 501 }],
  ])('%j', (fields, expected) => {
    expect(framing(fields)).toMatchObject(expected);
  });
});

describe('responseFraming', () => {
  const framing = (method: string, text: string) => {
    const head = parseResponseHead(bytes(`${text}\r\n`));
    if (!head.ok) throw new Error(head.message);
    return responseFraming(method, head.value);
  };
  it.each([
    ['GET', 'HTTP/1.1 200 OK\r\nContent-Length: 3\r\n', { kind: 'length', bytes: 3 }, true],
    ['HEAD', 'HTTP/1.1 200 OK\r\nContent-Length: 3\r\n', { kind: 'none' }, true],
    // 204 and 304 never have a body; one that announces a body leaves the connection unpooled.
    ['GET', 'HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n', { kind: 'none' }, false],
    ['GET', 'HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n', { kind: 'none' }, true],
    ['GET', 'HTTP/1.1 204 No Content\r\n', { kind: 'none' }, true],
    ['GET', 'HTTP/1.1 304 Not Modified\r\n', { kind: 'none' }, true],
    ['GET', 'HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n', { kind: 'none' }, false],
    ['GET', 'HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n', { kind: 'none' }, false],
    ['HEAD', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n', { kind: 'none' }, true],
    ['GET', 'HTTP/1.1 100 Continue\r\n', { kind: 'none' }, true],
    ['GET', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n', { kind: 'chunked' }, true],
    ['GET', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n', { kind: 'chunked' }, true],
    ['GET', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n', { kind: 'close' }, false],
    [
      'GET',
      'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n',
      { kind: 'chunked' },
      false,
    ],
    ['GET', 'HTTP/1.1 200 OK\r\n', { kind: 'close' }, false],
    [
      'GET',
      'HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n',
      { kind: 'length', bytes: 3 },
      false,
    ],
    ['GET', 'HTTP/1.0 200 OK\r\nContent-Length: 3\r\n', { kind: 'length', bytes: 3 }, false],
    ['GET', 'HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n', { kind: 'length', bytes: 3 }, true],
    ['GET', 'HTTP/1.1 200 OK\r\nContent-Length: 0\r\n', { kind: 'none' }, true],
  ])('%s %j', (method, text, expected, reusable) => {
    expect(framing(method, text)).toEqual({ ok: true, value: { framing: expected, reusable } });
  });

  it('refuses lengths that disagree or are not numbers (502: the origin is at fault)', () => {
    expect(
      framing('GET', 'HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n'),
    ).toMatchObject({
      ok: false,
      status: 502,
    });
    expect(framing('GET', 'HTTP/1.1 200 OK\r\nContent-Length: -1\r\n')).toMatchObject({
      ok: false,
      status: 502,
    });
  });

  it('refuses status lines that are not HTTP/1.x', () => {
    for (const line of [
      'HTTP/2 200 OK',
      'HTTP/1.1 20 OK',
      'HTTP/1.1 099 X',
      'ICY 200 OK',
      'HTTP/1.1 200 O\x01K',
    ])
      expect(parseResponseHead(bytes(`${line}\r\n\r\n`))).toMatchObject({ ok: false, status: 502 });
    expect(parseResponseHead(bytes('HTTP/1.1 200\r\n\r\n'))).toMatchObject({
      ok: true,
      value: { status: 200, reason: '' },
    });
  });
});

describe('endToEndFields and framingFields', () => {
  it('drops hop-by-hop fields, those Connection names, framing fields and the ones asked for', () => {
    const head = request(
      'GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\n' +
        'Proxy-Authorization: Basic x\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\n' +
        'Upgrade: h2c\r\nTransfer-Encoding: chunked\r\nProxy-Anything: x\r\nX-Kept: yes\r\n\r\n',
    );
    expect(endToEndFields(head.fields, new Set(['host']))).toBe('X-Kept: yes\r\n');
  });

  it('writes framing from what was checked, which no Connection option can hide', () => {
    const fields = request(
      'POST / HTTP/1.1\r\nConnection: content-length, transfer-encoding\r\n' +
        'Content-Length: 007\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n',
    ).fields;
    expect(framingFields(fields, { kind: 'length', bytes: 7 })).toBe('Content-Length: 7\r\n');
    expect(framingFields(fields, { kind: 'chunked' })).toBe('Transfer-Encoding: gzip, chunked\r\n');
    expect(framingFields(fields, { kind: 'close' })).toBe('Transfer-Encoding: gzip, chunked\r\n');
    expect(framingFields([], { kind: 'close' })).toBe('');
    // No body (HEAD, 304): what the origin said is information, passed on as it was.
    expect(framingFields(fields, { kind: 'none' })).toBe(
      'Content-Length: 007\r\nTransfer-Encoding: gzip, Chunked\r\n',
    );
  });
});

/** The reference: what a chunked body with these chunks and trailers looks like on the wire. */
function encodeChunked(
  chunks: readonly Buffer[],
  extensions: readonly string[],
  trailers: readonly string[],
) {
  const parts: Buffer[] = [];
  chunks.forEach((chunk, i) => {
    parts.push(bytes(`${chunk.length.toString(16)}${extensions[i % extensions.length] ?? ''}\r\n`));
    parts.push(chunk, bytes('\r\n'));
  });
  parts.push(bytes(`0\r\n${trailers.map((t) => `${t}\r\n`).join('')}\r\n`));
  return Buffer.concat(parts);
}

/**
 * Feeds `data` to a scanner in pieces cut at `cuts`; returns where the body ended, or why not.
 * The body's content, as the scanner hands it over, is gathered in `content`.
 */
function scanInPieces(
  framing: Framing,
  data: Buffer,
  cuts: readonly number[],
  content: Buffer[] = [],
): number | string {
  const scanner = bodyScanner(framing);
  const points = [...new Set(cuts.map((c) => c % (data.length + 1)))].sort((a, b) => a - b);
  let offset = 0;
  for (const end of [...points, data.length]) {
    if (end <= offset) continue;
    const piece = data.subarray(offset, end);
    const used = scanner.scan(piece, (bytes) => content.push(Buffer.from(bytes)));
    if (typeof used === 'string') return used;
    if (scanner.done) return offset + used;
    if (used !== piece.length) return 'stopped early without being done';
    offset = end;
  }
  return scanner.done ? offset : 'incomplete';
}

describe('body scanners', () => {
  const chunk = fc.uint8Array({ minLength: 1, maxLength: 300 }).map((a) => Buffer.from(a));
  const extension = fc.constantFrom('', ';a=b', ';name="quoted"', ' ;x', '\t;y');
  const trailer = fc.constantFrom('X-Sum: 1', 'Expires: never', 'A:b');

  it('finds exactly where a chunked body ends, however it is cut, and leaves what follows', () => {
    fc.assert(
      fc.property(
        fc.array(chunk, { maxLength: 8 }),
        fc.array(extension, { minLength: 1, maxLength: 3 }),
        fc.array(trailer, { maxLength: 3 }),
        fc.array(fc.nat(), { maxLength: 12 }),
        (chunks, extensions, trailers, cuts) => {
          const body = encodeChunked(chunks, extensions, trailers);
          const next = bytes('GET /next HTTP/1.1\r\n\r\n');
          const content: Buffer[] = [];
          expect(
            scanInPieces({ kind: 'chunked' }, Buffer.concat([body, next]), cuts, content),
          ).toBe(body.length);
          // The content handed over is the chunks' data alone, in order.
          expect(Buffer.concat(content).equals(Buffer.concat(chunks))).toBe(true);
        },
      ),
      { numRuns: 500 },
    );
  });

  it('finds exactly where a length-delimited body ends', () => {
    fc.assert(
      fc.property(
        fc.nat(5000),
        fc.nat(100),
        fc.array(fc.nat(), { maxLength: 8 }),
        (length, extra, cuts) => {
          const data = Buffer.alloc(length + extra, 0x61);
          const framing: Framing =
            length === 0 ? { kind: 'none' } : { kind: 'length', bytes: length };
          const content: Buffer[] = [];
          expect(scanInPieces(framing, data, cuts, content)).toBe(length);
          expect(Buffer.concat(content).length).toBe(length);
        },
      ),
      { numRuns: 300 },
    );
  });

  it('never throws on mutated chunked bodies, and never claims bytes past a body it accepted', () => {
    fc.assert(
      fc.property(
        fc.array(chunk, { maxLength: 4 }),
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), {
          minLength: 1,
          maxLength: 4,
        }),
        fc.array(fc.nat(), { maxLength: 6 }),
        (chunks, flips, cuts) => {
          const data = Buffer.from(encodeChunked(chunks, [''], []));
          for (const [at, value] of flips) data[at % data.length] = value;
          const result = scanInPieces({ kind: 'chunked' }, data, cuts);
          if (typeof result === 'number') expect(result).toBeLessThanOrEqual(data.length);
        },
      ),
      { numRuns: 1000 },
    );
  });

  it.each([
    ['a size that is not hex', 'zz\r\n'],
    ['an empty size', '\r\n'],
    ['a size line ending in bare LF', '5\n'],
    ['data longer than its size', '1\r\nab\r\n'],
    ['a huge size', `${'f'.repeat(13)}\r\n`],
    ['a trailer starting with space', '0\r\n x: y\r\n\r\n'],
    ['NUL in an extension', '1;\0\r\n'],
  ])('refuses %s', (_, text) => {
    expect(typeof bodyScanner({ kind: 'chunked' }).scan(bytes(text))).toBe('string');
  });

  it('refuses endless extensions and trailers instead of buffering them', () => {
    const scanner = bodyScanner({ kind: 'chunked' });
    expect(scanner.scan(bytes(`1;${'a'.repeat(5000)}`))).toMatch(/too long/);
    const trailers = bodyScanner({ kind: 'chunked' });
    expect(trailers.scan(bytes(`0\r\nX: ${'a'.repeat(17000)}`))).toMatch(/too long/);
  });
});
