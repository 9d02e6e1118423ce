/**
 * The guard on TLS tunnels: every ClientHello the server acts on must name the tunnel's host,
 * the second one after a HelloRetryRequest included, however the bytes are cut and whenever the
 * server's answer arrives.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { TlsHelloGuard } from '../../src/proxy/tls-guard.js';
import { cutStream } from '../support/cuts.js';
import { clientHello, inRecords, record, serverHello } from '../support/tls-records.js';

const HOST = 'site.test';
const problem = (name: string | undefined) => (name === HOST ? undefined : `not ${HOST}: ${name}`);
const hello = (name: string) => inRecords(clientHello(name));
const RETRY = inRecords(serverHello(true));
const ORDINARY = inRecords(serverHello(false));

type Step = { client: Buffer } | { server: Buffer };
/** Runs the steps; the bytes let through to the server, and the problem if one was found. */
function run(steps: readonly Step[]) {
  const guard = new TlsHelloGuard(problem);
  const passed: Buffer[] = [];
  for (const step of steps) {
    const checked =
      'client' in step ? guard.fromClient(step.client) : guard.fromUpstream(step.server);
    if ('problem' in checked) return { passed: Buffer.concat(passed), problem: checked.problem };
    passed.push(checked.pass);
  }
  return { passed: Buffer.concat(passed), problem: undefined };
}

describe('TlsHelloGuard', () => {
  it('passes a ClientHello that names the host, and everything after an ordinary answer', () => {
    const later = inRecords(Buffer.from([16, 0, 0, 1, 9])); // a handshake message, any
    const result = run([{ client: hello(HOST) }, { server: ORDINARY }, { client: later }]);
    expect(result).toEqual({ passed: Buffer.concat([hello(HOST), later]), problem: undefined });
  });

  it('refuses a first ClientHello that names another host, passing none of it', () => {
    expect(run([{ client: hello('other.test') }])).toEqual({
      passed: Buffer.alloc(0),
      problem: 'not site.test: other.test',
    });
  });

  it('checks the second ClientHello after a HelloRetryRequest', () => {
    const second = Buffer.concat([record('ccs'), hello(HOST)]);
    expect(run([{ client: hello(HOST) }, { server: RETRY }, { client: second }])).toEqual({
      passed: Buffer.concat([hello(HOST), second]),
      problem: undefined,
    });
    const fronted = run([
      { client: hello(HOST) },
      { server: RETRY },
      { client: Buffer.concat([record('ccs'), hello('other.test')]) },
    ]);
    expect(fronted.problem).toBe('not site.test: other.test');
    // Nothing of the chunk that carried the second hello went on.
    expect(fronted.passed).toEqual(hello(HOST));
  });

  it('holds a second ClientHello sent before the server answered, until the answer shows', () => {
    const early = run([{ client: Buffer.concat([hello(HOST), hello('other.test')]) }]);
    expect(early).toEqual({ passed: hello(HOST), problem: undefined });
    expect(
      run([{ client: hello(HOST) }, { client: hello('other.test') }, { server: RETRY }]).problem,
    ).toBe('not site.test: other.test');
    // After an ordinary answer the held bytes go on: that server reads no second hello.
    expect(
      run([{ client: hello(HOST) }, { client: hello('other.test') }, { server: ORDINARY }]),
    ).toEqual({ passed: Buffer.concat([hello(HOST), hello('other.test')]), problem: undefined });
  });

  it('lets early data and change_cipher_spec through while the server has not answered', () => {
    const early = Buffer.concat([record('ccs'), record('data', Buffer.alloc(300, 1))]);
    expect(run([{ client: Buffer.concat([hello(HOST), early]) }])).toEqual({
      passed: Buffer.concat([hello(HOST), early]),
      problem: undefined,
    });
  });

  it('lets an alert after a HelloRetryRequest through, and still checks a hello after it', () => {
    const alert = record('alert');
    expect(run([{ client: hello(HOST) }, { server: RETRY }, { client: alert }])).toEqual({
      passed: Buffer.concat([hello(HOST), alert]),
      problem: undefined,
    });
    // A warning alert does not stop a lenient server from reading a ClientHello after it.
    const after = run([
      { client: hello(HOST) },
      { server: RETRY },
      { client: Buffer.concat([alert, hello('other.test')]) },
    ]);
    expect(after.problem).toBe('not site.test: other.test');
  });

  it('refuses bytes after the ClientHello inside its last record', () => {
    const message = clientHello(HOST);
    const withTail = inRecords(Buffer.concat([message, clientHello('other.test')]));
    expect(run([{ client: withTail }]).problem).toContain('carries more than the ClientHello');
  });

  it('bounds what waits for the server: 64 KiB', () => {
    const waiting = Buffer.concat([hello(HOST), inRecords(Buffer.alloc(70_000, 1), 16_000)]);
    expect(run([{ client: waiting }]).problem).toContain('before the server answered');
  });

  it('holds every cut of the stream exactly as the whole stream (property)', () => {
    fc.assert(
      fc.property(
        fc.boolean(), // the server retries
        fc.constantFrom(HOST, 'other.test'), // the second hello's name
        fc.nat({ max: 3 }), // records of early data after the first hello
        fc.boolean(), // change_cipher_spec before the second hello
        fc.array(fc.nat(), { maxLength: 8 }), // where the client's bytes are cut
        fc.nat(), // when the server answers
        (retry, secondName, earlyRecords, ccs, cuts, answerAt) => {
          const first = hello(HOST);
          const early = Buffer.concat(
            Array.from({ length: earlyRecords }, (_, i) => record('data', Buffer.alloc(10 + i, i))),
          );
          const second = Buffer.concat([ccs ? record('ccs') : Buffer.alloc(0), hello(secondName)]);
          const stream = Buffer.concat([first, early, second]);
          const pieces = cutStream(stream.length, cuts).bounds.map(([from, to]) =>
            stream.subarray(from, to),
          );
          // The server answers once it has the first hello: after some piece that completes it.
          const firstDone = pieces.findIndex(
            (_, i) => Buffer.concat(pieces.slice(0, i + 1)).length >= first.length,
          );
          const answerAfter = firstDone + (answerAt % (pieces.length - firstDone));
          const steps: Step[] = [];
          pieces.forEach((piece, i) => {
            steps.push({ client: piece });
            if (i === answerAfter) steps.push({ server: retry ? RETRY : ORDINARY });
          });
          const result = run(steps);
          // Reference: without a retry, or with an honest second hello, everything passes;
          // a fronted second hello is refused with nothing of it passed.
          const fronted = retry && secondName !== HOST;
          expect(result.problem !== undefined).toBe(fronted);
          const ccsLength = ccs ? record('ccs').length : 0;
          const expected = fronted
            ? stream.subarray(0, first.length + early.length + ccsLength)
            : stream;
          if (fronted) expect(expected.subarray(0, result.passed.length)).toEqual(result.passed);
          else expect(result.passed).toEqual(expected);
        },
      ),
      { numRuns: 1000 },
    );
  });
});
