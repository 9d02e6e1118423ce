/**
 * The response redactor: the same result however the stream is cut, the leftmost-longest
 * occurrence replaced, no value left in what the sandbox reads, and a bounded look-behind.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { type Redaction, SecretRedaction } from '../../src/proxy/redact.js';

/** The obvious reading: at each byte, the longest value starting there, else the byte. */
function reference(text: string, redactions: readonly Redaction[]): string {
  const values = [...redactions].filter((r) => r.value !== '');
  values.sort((a, b) => b.value.length - a.value.length);
  let out = '';
  for (let i = 0; i < text.length;) {
    const hit = values.find((r) => text.startsWith(r.value, i));
    if (hit === undefined) out += text[i++];
    else {
      out += hit.placeholder;
      i += hit.value.length;
    }
  }
  return out;
}

/** Values over a two-letter alphabet (so they overlap and nest), placeholders without it. */
const redactionsArb = fc
  .uniqueArray(fc.stringMatching(/^[ab]{1,6}$/), { minLength: 1, maxLength: 4 })
  .map((values) => values.map((value, i) => ({ value, placeholder: `[${i}]` })));

function streamed(text: Buffer, cuts: number[], redactions: readonly Redaction[]) {
  const redactor = new SecretRedaction(redactions).stream();
  const out: Buffer[] = [];
  let from = 0;
  for (const cut of [...new Set(cuts)].sort((a, b) => a - b)) {
    out.push(...redactor.push(text.subarray(from, cut)));
    from = cut;
  }
  out.push(...redactor.push(text.subarray(from), true));
  return Buffer.concat(out).toString('latin1');
}

describe('the response redactor', () => {
  it('gives the reference result however the stream is cut, and leaves no value', () => {
    fc.assert(
      fc.property(
        redactionsArb,
        fc.stringMatching(/^[abc]{0,80}$/),
        fc.array(fc.nat(80)),
        (redactions, text, cuts) => {
          const bytes = Buffer.from(text, 'latin1');
          const expected = reference(text, redactions);
          const got = streamed(
            bytes,
            cuts.map((c) => Math.min(c, bytes.length)),
            redactions,
          );
          expect(got).toBe(expected);
          expect(new SecretRedaction(redactions).text(text)).toBe(expected);
          for (const { value } of redactions) expect(got).not.toContain(value);
        },
      ),
      { numRuns: 3000 },
    );
  });

  it.each([
    [
      'an echoed header',
      'Authorization: Bearer sk-1',
      [['sk-1', '${e2b.secrets.t}']],
      'Authorization: Bearer ${e2b.secrets.t}',
    ],
    [
      'the longer of two values at one byte',
      'xsk-12y',
      [
        ['sk-1', 'A'],
        ['sk-12', 'B'],
      ],
      'xBy',
    ],
    [
      'the leftmost of overlapping values',
      'abcd',
      [
        ['bcd', 'B'],
        ['ab', 'A'],
      ],
      'Acd',
    ],
    ['every occurrence', 'k k k', [['k', '<>']], '<> <> <>'],
    ['nothing when no value occurs', 'plain body', [['sk-1', 'X']], 'plain body'],
    ['nothing for an empty value', 'abc', [['', 'X']], 'abc'],
  ] as const)('replaces %s', (_what, text, pairs, expected) => {
    const redactions = pairs.map(([value, placeholder]) => ({ value, placeholder }));
    expect(new SecretRedaction(redactions).text(text)).toBe(expected);
  });

  it('replaces a multi-byte UTF-8 value cut inside a character', () => {
    const value = 'clé-☃-secret';
    const bytes = Buffer.from(`{"echo":"${value}"}`, 'utf8');
    const snow = bytes.indexOf(Buffer.from('☃'));
    const got = streamed(bytes, [snow + 1, snow + 2], [{ value, placeholder: '${e2b.secrets.k}' }]);
    expect(got).toBe('{"echo":"${e2b.secrets.k}"}');
  });

  it('holds back less than the longest value between pushes', () => {
    const value = 'x'.repeat(64);
    const redactor = new SecretRedaction([{ value, placeholder: 'P' }]).stream();
    let released = 0;
    for (let i = 0; i < 100; i++)
      released += Buffer.concat(redactor.push(Buffer.alloc(1000, 'y'))).length;
    expect(100 * 1000 - released).toBe(value.length - 1);
  });

  it('finds a value in a header name in any case, and nothing in a name without one', () => {
    const redaction = new SecretRedaction([{ value: 'tok-Abc123', placeholder: 'P' }]);
    expect(redaction.inName('X-Bearer-TOK-ABC123')).toBe(true);
    expect(redaction.inName('x-bearer-tok-abc123-2')).toBe(true);
    expect(redaction.inName('X-Bearer-tok-abc12')).toBe(false);
  });
});
