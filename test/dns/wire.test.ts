/**
 * Which upstream replies count as answering our question: the name may come back in another
 * letter case (0x20 randomisation), nothing else may differ.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { answersQuestion, encodeUpstreamQuery } from '../../src/dns/wire.js';

const HEADER = 12;
const QR = 0x80;

/** A reply as an upstream would send it: our query's header and question, QR set. */
function replyTo(query: Buffer, change?: (reply: Buffer, questionEnd: number) => void): Buffer {
  const nameEnd = query.indexOf(0, HEADER) + 1;
  const reply = Buffer.from(query.subarray(0, nameEnd + 4));
  reply[2] = reply[2]! | QR;
  reply.writeUInt16BE(0, 10);
  change?.(reply, nameEnd + 4);
  return reply;
}

const query = encodeUpstreamQuery(7, 'api.example.test', 1);

describe('answersQuestion', () => {
  it.each([
    ['the same question', (_: Buffer) => {}, true],
    [
      'the name with its letters in another case',
      (reply: Buffer) => reply.write('APi', HEADER + 1, 'latin1'),
      true,
    ],
    [
      'type SRV (0x21) for our A (0x01)',
      (reply: Buffer, end: number) => reply.writeUInt16BE(0x21, end - 4),
      false,
    ],
    [
      'class 0x21 for our IN',
      (reply: Buffer, end: number) => reply.writeUInt16BE(0x21, end - 2),
      false,
    ],
    [
      'type AAAA for our A',
      (reply: Buffer, end: number) => reply.writeUInt16BE(28, end - 4),
      false,
    ],
    [
      'a label length differing in bit 0x20',
      (reply: Buffer) => (reply[HEADER] = reply[HEADER]! | 0x20),
      false,
    ],
    ['another name', (reply: Buffer) => reply.write('apx', HEADER + 1, 'latin1'), false],
  ] as const)('%s', (what, change, expected) => {
    expect(answersQuestion(replyTo(query, change), query), what).toBe(expected);
  });

  it('does not take DEL for "_" (they differ in bit 0x20 only, as letters do)', () => {
    const underscored = encodeUpstreamQuery(7, '_a.example.test', 1);
    const reply = replyTo(underscored, (r) => (r[HEADER + 1] = 0x7f));
    expect(answersQuestion(reply, underscored)).toBe(false);
  });

  it('takes any case of the letters and refuses any other single-byte change', () => {
    const label = fc.stringMatching(/^[a-z0-9_-]{1,20}$/);
    fc.assert(
      fc.property(
        fc.array(label, { minLength: 1, maxLength: 4 }),
        fc.integer({ min: 0, max: 65535 }),
        fc.array(fc.boolean(), { minLength: 100, maxLength: 100 }),
        fc.nat(),
        fc.integer({ min: 1, max: 255 }),
        (labels, type, upper, at, flip) => {
          const ours = encodeUpstreamQuery(1, labels.join('.'), type);
          const recased = replyTo(ours, (reply, end) => {
            for (let i = HEADER; i < end - 4; i++)
              if (upper[i % 100] && reply[i]! >= 0x61 && reply[i]! <= 0x7a)
                reply[i] = reply[i]! - 32;
          });
          expect(answersQuestion(recased, ours)).toBe(true);
          const changed = replyTo(ours, (reply, end) => {
            const i = HEADER + (at % (end - HEADER));
            reply[i] = reply[i]! ^ flip;
          });
          const i = HEADER + (at % (changed.length - HEADER));
          const before = ours[i]!;
          const after = changed[i]!;
          const isLetter = (b: number) => (b | 0x20) >= 0x61 && (b | 0x20) <= 0x7a;
          const caseOnly =
            flip === 0x20 &&
            isLetter(before) &&
            isLetter(after) &&
            // a name byte, not a label length that happens to be a letter's code
            isNameByteAt(ours, i);
          expect(answersQuestion(changed, ours)).toBe(caseOnly);
        },
      ),
      { numRuns: 2000 },
    );
  });
});

/** True when offset `i` of an encoded query is inside a label (not a length, type or class). */
function isNameByteAt(message: Buffer, i: number): boolean {
  let at = HEADER;
  while (message[at] !== 0) {
    const end = at + 1 + message[at]!;
    if (i > at && i < end) return true;
    at = end;
  }
  return false;
}
