/**
 * The guard on plain-HTTP tunnels: every request's Host and absolute-form target must name the
 * tunnel's host, whatever the bodies in between carry and however the bytes are cut.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { RequestStreamGuard } from '../../src/proxy/host-guard.js';
import { cutStream } from '../support/cuts.js';

const HOST = 'site.test';
/** The check the proxy passes in, reduced to its rule: the same host name, any port. */
const mismatch = (authority: string | undefined) =>
  authority !== undefined && authority.toLowerCase().replace(/:\d+$/, '') === HOST
    ? undefined
    : `not ${HOST}: ${authority}`;

const bytes = (text: string) => Buffer.from(text, 'latin1');
/** Feeds the chunks; the problem found, or undefined, and every byte let through. */
function run(guard: RequestStreamGuard, chunks: readonly string[]) {
  let passed = '';
  for (const chunk of chunks) {
    const checked = guard.fromClient(bytes(chunk));
    if ('problem' in checked) return { problem: checked.problem, passed };
    passed += checked.pass.toString('latin1');
  }
  return { problem: undefined, passed };
}
const guardOver = (...chunks: string[]) => run(new RequestStreamGuard(mismatch), chunks).problem;
// The handshake of RFC 6455 1.3, whose accept value the RFC gives for its key.
const UPGRADE =
  'GET /ws HTTP/1.1\r\nHost: site.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
  'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n';
const SWITCHED =
  'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
  'Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n';
/** Shows the guard an upstream chunk; the client bytes it lets go on, or its problem. */
function answer(guard: RequestStreamGuard, text: string) {
  const checked = guard.fromUpstream(bytes(text));
  return 'pass' in checked ? checked.pass.toString('latin1') : { problem: checked.problem };
}

describe('RequestStreamGuard', () => {
  it.each([
    ['one request', ['GET / HTTP/1.1\r\nHost: site.test\r\n\r\n'], undefined],
    ['a port and another case', ['GET / HTTP/1.1\r\nHost: SITE.test:80\r\n\r\n'], undefined],
    [
      'a second request to another host',
      ['GET / HTTP/1.1\r\nHost: site.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: other.test\r\n\r\n'],
      /other\.test/,
    ],
    [
      'an absolute-form target to another host',
      ['GET http://other.test/x HTTP/1.1\r\nHost: site.test\r\n\r\n'],
      /other\.test/,
    ],
    [
      'an absolute-form target to this host',
      ['GET http://site.test/x HTTP/1.1\r\nHost: site.test\r\n\r\n'],
      undefined,
    ],
    ['no Host', ['GET / HTTP/1.0\r\n\r\n'], /not site\.test/],
    ['two Hosts', ['GET / HTTP/1.1\r\nHost: site.test\r\nHost: other.test\r\n\r\n'], /two Host/],
    ['a WebSocket upgrade', [`${UPGRADE}`], undefined],
    [
      'an upgrade to h2c',
      ['GET / HTTP/1.1\r\nHost: site.test\r\nUpgrade: h2c\r\n\r\n'],
      /switch protocols to "h2c": only websocket/,
    ],
    [
      'an upgrade to WebSocket and something else',
      ['GET / HTTP/1.1\r\nHost: site.test\r\nUpgrade: websocket, h2c\r\n\r\n'],
      /only websocket/,
    ],
    [
      'a WebSocket upgrade without Sec-WebSocket-Key',
      ['GET /ws HTTP/1.1\r\nHost: site.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'],
      /one Sec-WebSocket-Key/,
    ],
    [
      'a WebSocket upgrade without Connection: Upgrade',
      [UPGRADE.replace('Connection: Upgrade', 'Connection: keep-alive')],
      /Connection: Upgrade/,
    ],
    [
      'a WebSocket upgrade after another request',
      ['GET / HTTP/1.1\r\nHost: site.test\r\n\r\n', UPGRADE],
      /only the first may/,
    ],
    [
      'a WebSocket upgrade to another host',
      ['GET /ws HTTP/1.1\r\nHost: other.test\r\nUpgrade: websocket\r\n\r\n'],
      /other\.test/,
    ],
    [
      'CONNECT',
      ['CONNECT site.test:80 HTTP/1.1\r\nHost: site.test\r\n\r\n'],
      /is not a path|switch/,
    ],
    ['a head with a bare LF', ['GET / HTTP/1.1\nHost: site.test\r\n\r\n'], /bare LF/],
    [
      'a request head inside a body by length',
      [
        'POST / HTTP/1.1\r\nHost: site.test\r\nContent-Length: 38\r\n\r\n',
        'GET / HTTP/1.1\r\nHost: other.test\r\n\r\n\r\n',
        'GET /after HTTP/1.1\r\nHost: site.test\r\n\r\n',
      ],
      undefined,
    ],
    [
      'a request head inside a chunked body',
      [
        'POST / HTTP/1.1\r\nHost: site.test\r\nTransfer-Encoding: chunked\r\n\r\n',
        '24\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n\r\n0\r\n\r\n',
        'GET /after HTTP/1.1\r\nHost: site.test\r\n\r\n',
      ],
      undefined,
    ],
    [
      'a smuggling attempt (length and chunked)',
      [
        'POST / HTTP/1.1\r\nHost: site.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n',
      ],
      /request head/,
    ],
    [
      'a head cut anywhere',
      ['GET / HT', 'TP/1.1\r\nHo', 'st: other.te', 'st\r\n\r', '\n'],
      /other/,
    ],
  ])('%s', (_, chunks, expected) => {
    const problem = guardOver(...chunks);
    if (expected === undefined) expect(problem).toBeUndefined();
    else expect(problem).toMatch(expected);
  });

  it('keeps refusing once it has refused', () => {
    const guard = new RequestStreamGuard(mismatch);
    expect(run(guard, ['GET / HTTP/1.1\r\nHost: other.test\r\n\r\n']).problem).toBeDefined();
    expect(run(guard, ['GET / HTTP/1.1\r\nHost: site.test\r\n\r\n']).problem).toBeDefined();
  });

  it('holds a head back until it is whole and checked, and lets bodies through as they come', () => {
    const guard = new RequestStreamGuard(mismatch);
    expect(run(guard, ['POST / HTTP/1.1\r\nHost: site.test\r\n']).passed).toBe('');
    expect(run(guard, ['Content-Length: 10\r\n\r\nhello']).passed).toBe(
      'POST / HTTP/1.1\r\nHost: site.test\r\nContent-Length: 10\r\n\r\nhello',
    );
    expect(run(guard, ['world']).passed).toBe('world');
    // A head ended by bare CRs (read as line ends by some servers) never completes: held.
    expect(run(guard, ['GET / HTTP/1.1\rHost: other.test\r\r']).passed).toBe('');
  });

  it('lets nothing through of bytes that are not HTTP, and refuses them past 16 KiB', () => {
    const guard = new RequestStreamGuard(mismatch);
    const noise = 'x'.repeat(8 * 1024);
    expect(run(guard, [noise])).toEqual({ problem: undefined, passed: '' });
    expect(run(guard, [noise, noise]).problem).toMatch(/longer than/);
  });

  // A reference: requests generated with known hosts and bodies; the stream is bad from the end
  // of the first request head whose Host or absolute target names another host.
  const request = fc.record({
    host: fc.constantFrom(
      'site.test',
      'SITE.TEST',
      'site.test:8080',
      'other.test',
      'site.test.evil',
    ),
    target: fc.constantFrom('/', '/a?b=c', '*', 'http://site.test/x', 'http://other.test/x'),
    body: fc.oneof(
      fc.constant(undefined),
      fc.record({
        chunked: fc.boolean(),
        text: fc.constantFrom(
          '',
          'hello',
          'GET / HTTP/1.1\r\nHost: other.test\r\n\r\n',
          '0\r\n\r\n',
        ),
      }),
    ),
  });

  it('finds exactly the first bad request, however the stream is cut', () => {
    fc.assert(
      fc.property(
        fc.array(request, { minLength: 1, maxLength: 5 }),
        fc.array(fc.nat(), { maxLength: 8 }),
        (requests, cuts) => {
          let stream = '';
          let badEnd: number | undefined;
          let badStart: number | undefined;
          for (const r of requests) {
            const method = r.body === undefined ? 'GET' : 'POST';
            let head = `${method} ${r.target} HTTP/1.1\r\nHost: ${r.host}\r\n`;
            let body = '';
            if (r.body !== undefined && r.body.chunked) {
              head += 'Transfer-Encoding: chunked\r\n';
              body =
                (r.body.text.length > 0
                  ? `${r.body.text.length.toString(16)}\r\n${r.body.text}\r\n`
                  : '') + '0\r\n\r\n';
            } else if (r.body !== undefined) {
              head += `Content-Length: ${r.body.text.length}\r\n`;
              body = r.body.text;
            }
            head += '\r\n';
            const authority = /^http:\/\/([^/]*)/.exec(r.target)?.[1];
            const bad =
              mismatch(r.host) !== undefined ||
              (authority !== undefined && mismatch(authority) !== undefined);
            if (bad && badEnd === undefined) badStart = stream.length;
            stream += head;
            if (bad && badEnd === undefined) badEnd = stream.length;
            stream += body;
          }
          const { positions, bounds } = cutStream(stream.length, cuts);
          const pieces = bounds.map(([from, to]) => stream.slice(from, to));
          const guard = new RequestStreamGuard(mismatch);
          let fed = 0;
          let problemAt: number | undefined;
          let passed = '';
          for (const piece of pieces) {
            fed += piece.length;
            const checked = guard.fromClient(bytes(piece));
            if ('pass' in checked) passed += checked.pass.toString('latin1');
            else problemAt ??= fed;
            if (problemAt !== undefined) break;
          }
          if (badEnd === undefined) {
            expect(problemAt).toBeUndefined();
            expect(passed).toBe(stream);
          } else {
            // Found in the piece that completed the bad head, never before it...
            expect(problemAt).toBeDefined();
            expect(problemAt!).toBeGreaterThanOrEqual(badEnd);
            expect(positions.filter((p) => p >= badEnd! && p < problemAt!)).toEqual([]);
            // ...and not one byte of that head went through.
            expect(stream.startsWith(passed)).toBe(true);
            expect(passed.length).toBeLessThanOrEqual(badStart!);
          }
        },
      ),
      { numRuns: 1000 },
    );
  });
});

describe('RequestStreamGuard, with an inspector (the leak guard)', () => {
  it('shows it every head, however cut, and ends the tunnel at the first it refuses', () => {
    const inspected: string[] = [];
    const guard = new RequestStreamGuard(mismatch, (head) => {
      inspected.push(head.target);
      return head.fields.some((f) => f.lower === 'x-leak') ? 'carries a secret' : undefined;
    });
    const first = 'GET /1 HTTP/1.1\r\nHost: site.test\r\n\r\n';
    const second = 'GET /2 HTTP/1.1\r\nHost: site.test\r\nX-Leak: 1\r\n\r\n';
    const { problem, passed } = run(guard, [first.slice(0, 9), first.slice(9), second]);
    expect(problem).toBe('carries a secret');
    expect(passed).toBe(first);
    expect(inspected).toEqual(['/1', '/2']);
  });
});

describe('RequestStreamGuard, with an admission (the fair share)', () => {
  it('asks it for every request after the first, before reading the head, and ends at a refusal', () => {
    let asked = 0;
    const guard = new RequestStreamGuard(mismatch, undefined, () =>
      ++asked === 2 ? 'over its rate' : undefined,
    );
    const request = (n: number) => `GET /${n} HTTP/1.1\r\nHost: site.test\r\n\r\n`;
    // The third head is no request: refused for the rate, not parsed.
    const { problem, passed } = run(guard, [request(1) + request(2), 'junk\r\n\r\n', request(4)]);
    expect(problem).toBe('over its rate');
    expect(passed).toBe(request(1) + request(2));
    expect(asked).toBe(2);
  });
});

describe('RequestStreamGuard, a switch to WebSocket', () => {
  // Bytes that are not HTTP: a masked WebSocket frame, as a client sends them.
  const FRAME = '\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58';

  it('watches nothing upstream until a tunnel asks to switch', () => {
    const guard = new RequestStreamGuard(mismatch);
    expect(guard.watchesUpstream).toBe(false);
    expect(run(guard, ['GET / HTTP/1.1\r\nHost: site.test\r\n\r\n']).problem).toBeUndefined();
    expect(guard.watchesUpstream).toBe(false);
    expect(answer(guard, 'HTTP/1.1 101 Switching Protocols\r\n\r\n')).toBe('');
    expect(guard.done).toBe(false);
  });

  it('holds what follows the upgrade request until the origin answers 101, then steps aside', () => {
    const guard = new RequestStreamGuard(mismatch);
    expect(run(guard, [UPGRADE + FRAME])).toEqual({ problem: undefined, passed: UPGRADE });
    expect(guard.watchesUpstream).toBe(true);
    expect(run(guard, [FRAME]).passed).toBe('');
    expect(answer(guard, SWITCHED + 'server bytes')).toBe(FRAME + FRAME);
    expect(guard.done).toBe(true);
    expect(guard.watchesUpstream).toBe(false);
    // Frames now, and whatever they hold (here a request to another host) is theirs.
    const inFrame = 'GET / HTTP/1.1\r\nHost: other.test\r\n\r\n';
    expect(run(guard, [inFrame])).toEqual({ problem: undefined, passed: inFrame });
  });

  it('finds the 101 after interim answers, however the answer is cut', () => {
    const stream =
      'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n' + SWITCHED;
    fc.assert(
      fc.property(fc.array(fc.nat(), { maxLength: 8 }), (cuts) => {
        const guard = new RequestStreamGuard(mismatch);
        run(guard, [UPGRADE + FRAME]);
        let released = '';
        for (const [from, to] of cutStream(stream.length, cuts).bounds) {
          released += answer(guard, stream.slice(from, to)) as string;
          // Switched once the 101's head is whole, not before.
          expect(guard.done).toBe(to === stream.length);
        }
        expect(guard.done).toBe(true);
        expect(released).toBe(FRAME);
      }),
      { numRuns: 300 },
    );
  });

  it.each([
    ['a refusal', 'HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n'],
    ['a 101 without Sec-WebSocket-Accept', 'HTTP/1.1 101 OK\r\n\r\n'],
    [
      'a 101 for another key',
      SWITCHED.replace('s3pPLMBiTxaQ9kYGzzhZRbK+xOo=', 'AAAAAAAAAAAAAAAAAAAAAAAAAAA='),
    ],
    ['a plain answer', 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'],
    ['an answer that is not HTTP', 'SSH-2.0-OpenSSH_9.6\r\n\r\n'],
  ])('after %s the tunnel stays HTTP: held bytes are checked as requests', (_, refusal) => {
    const good = 'GET /next HTTP/1.1\r\nHost: site.test\r\n\r\n';
    const guard = new RequestStreamGuard(mismatch);
    run(guard, [UPGRADE + good]);
    expect(answer(guard, refusal)).toBe(good);
    expect(guard.done).toBe(false);
    expect(guard.watchesUpstream).toBe(false);
    expect(run(guard, ['GET / HTTP/1.1\r\nHost: other.test\r\n\r\n']).problem).toMatch(/other/);

    const fronted = new RequestStreamGuard(mismatch);
    run(fronted, [UPGRADE + 'GET / HTTP/1.1\r\nHost: other.test\r\n\r\n']);
    expect(answer(fronted, refusal)).toEqual({ problem: expect.stringMatching(/other/) });
    // A second upgrade on the tunnel is not its first request.
    const again = new RequestStreamGuard(mismatch);
    run(again, [UPGRADE]);
    answer(again, refusal);
    expect(run(again, [UPGRADE]).problem).toMatch(/only the first may/);
  });

  it('keeps no reference to an upstream buffer that its caller reuses', () => {
    const guard = new RequestStreamGuard(mismatch);
    run(guard, [UPGRADE]);
    const read = Buffer.from(SWITCHED.slice(0, -2), 'latin1');
    guard.fromUpstream(read);
    // A pooled read buffer, overwritten by another tunnel's read before the answer is whole.
    read.fill('x');
    guard.fromUpstream(Buffer.from('\r\n', 'latin1'));
    expect(guard.done).toBe(true);
  });

  it("passes an upgrade request's body before holding, and holds at most 64 KiB", () => {
    const guard = new RequestStreamGuard(mismatch);
    const withBody = UPGRADE.replace('\r\n\r\n', '\r\nContent-Length: 4\r\n\r\n') + 'body';
    expect(run(guard, [withBody + FRAME]).passed).toBe(withBody);
    expect(run(guard, ['x'.repeat(64 * 1024 - FRAME.length)]).problem).toBeUndefined();
    expect(run(guard, ['x']).problem).toMatch(/over 64 KiB before the origin answered/);
    expect(answer(guard, SWITCHED)).toEqual({ problem: expect.stringMatching(/64 KiB/) });
  });
});
