/** ArrivingBytes against the obvious reference: every piece concatenated onto all before it. */
import fc from 'fast-check';
import { expect, it } from 'vitest';
import { ArrivingBytes } from '../../src/net/index.js';

type Step = { kind: 'append'; piece: Uint8Array } | { kind: 'restart'; keep: number };

const step: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('append' as const),
      piece: fc.uint8Array({ maxLength: 3000 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('restart' as const), keep: fc.nat() }) },
);

it('holds exactly what was appended since the last restart, and never changes a run it handed out', () => {
  fc.assert(
    fc.property(fc.array(step, { maxLength: 60 }), (steps) => {
      const arriving = new ArrivingBytes();
      let reference = Buffer.alloc(0);
      const handedOut: Array<{ run: Buffer; copy: Buffer }> = [];
      for (const s of steps) {
        let run: Buffer;
        if (s.kind === 'append') {
          run = arriving.append(Buffer.from(s.piece));
          reference = Buffer.concat([reference, s.piece]);
        } else {
          // Keeps the tail after the front was used, as the guards do.
          const rest = arriving.bytes.subarray(Math.min(s.keep, arriving.bytes.length));
          run = arriving.restart(rest);
          reference = Buffer.from(rest);
        }
        expect(run.equals(reference)).toBe(true);
        expect(arriving.bytes.equals(reference)).toBe(true);
        handedOut.push({ run, copy: Buffer.from(run) });
      }
      for (const { run, copy } of handedOut) expect(run.equals(copy)).toBe(true);
    }),
  );
});

it('hands out a lone piece as it is, without copying it', () => {
  const piece = Buffer.from('GET / HTTP/1.1\r\n');
  expect(new ArrivingBytes().append(piece)).toBe(piece);
});
