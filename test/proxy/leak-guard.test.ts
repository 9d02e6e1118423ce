/**
 * The leak guard's search: a stored value or placeholder found however a request carries it
 * (any ASCII case, percent-encoded a bounded number of times, split across fields), the same
 * answer as a plain substring search where nothing is encoded, and a bound secret let through.
 * Assertions are on names and booleans: no value is printed.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { RequestHead } from '../../src/proxy/http1.js';
import { carriedSecret } from '../../src/proxy/leak-guard.js';

const VALUE = 'sk-Leak-0123456789abcdef';
const SECRETS = new Map([
  ['other', 'unrelated-value-xyz'],
  ['key', VALUE],
]);
const NONE = new Set<string>();

const head = (fields: [string, string][], target = '/'): RequestHead => ({
  method: 'GET',
  target,
  minor: 1,
  fields: fields.map(([name, value]) => ({ name, lower: name.toLowerCase(), value })),
});
const percent = (text: string) =>
  [...Buffer.from(text)].map((b) => `%${b.toString(16).padStart(2, '0')}`).join('');
const encoded = (text: string, times: number) =>
  Array.from({ length: times }).reduce<string>((t) => percent(t), text);

describe('carriedSecret', () => {
  it.each([
    ['as stored', head([['X-A', VALUE]])],
    ['lower case', head([['X-A', VALUE.toLowerCase()]])],
    ['upper case', head([['X-A', `pre${VALUE.toUpperCase()}post`]])],
    ['in a field name', head([[`X-${VALUE}`, '1']])],
    ['in the target', head([], `/q?k=${VALUE}`)],
    [
      'split across two fields',
      head([
        ['X-A', VALUE.slice(0, 7)],
        ['X-B', VALUE.slice(7)],
      ]),
    ],
    [
      'split across a repeated field',
      head([
        ['X-A', VALUE.slice(0, 9)],
        ['X-Z', 'between'],
        ['X-A', VALUE.slice(9)],
      ]),
    ],
    ['percent-encoded once', head([], `/q?k=${encoded(VALUE, 1)}`)],
    ['percent-encoded four times', head([['X-A', encoded(VALUE, 4)]])],
    ['its placeholder, any case', head([['X-A', '${E2B.Secrets.KEY}']])],
    ['its placeholder, encoded', head([], `/q?k=${encoded('${e2b.secrets.key}', 2)}`)],
  ])('finds a value or placeholder carried %s', (_, request) => {
    expect(carriedSecret(SECRETS, NONE, request)?.name).toBe('key');
  });

  it('stops decoding after a bound number of rounds', () => {
    expect(carriedSecret(SECRETS, NONE, head([['X-A', encoded(VALUE, 6)]]))).toBeUndefined();
    expect(carriedSecret(SECRETS, NONE, head([['X-A', VALUE.slice(1)]]))).toBeUndefined();
  });

  it('finds the placeholder of a name no secret has as it finds a stored one (no oracle)', () => {
    expect(carriedSecret(SECRETS, NONE, head([['X-A', '${e2b.secrets.key}']]))).toEqual({
      name: 'key',
      by: 'placeholder',
    });
    expect(carriedSecret(SECRETS, NONE, head([['X-A', '${E2B.secrets.Nope}']]))).toEqual({
      name: 'nope',
      by: 'placeholder',
    });
    expect(carriedSecret(new Map(), NONE, head([['X-A', '${e2b.secrets.nope}']]))?.name).toBe(
      'nope',
    );
    const bound = new Set(['nope']);
    expect(carriedSecret(SECRETS, bound, head([['X-A', '${e2b.secrets.nope}']]))).toBeUndefined();
    // Not placeholder-shaped: no rule could name it.
    expect(carriedSecret(SECRETS, NONE, head([['X-A', '${e2b.secrets.a b}']]))).toBeUndefined();
  });

  it('lets a bound secret through, but not another one beside it', () => {
    const both = head([
      ['Authorization', VALUE],
      ['X-B', 'unrelated-value-xyz'],
    ]);
    expect(carriedSecret(SECRETS, new Set(['key']), head([['X-A', VALUE]]))).toBeUndefined();
    expect(carriedSecret(SECRETS, new Set(['key']), both)).toEqual({ name: 'other', by: 'value' });
  });

  it('answers as a substring search does, for values that overlap and repeat', () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.stringMatching(/^[ab]{1,5}$/), { minLength: 1, maxLength: 4 }),
        fc.stringMatching(/^[ab]{0,40}$/),
        (values, text) => {
          const secrets = new Map(values.map((value, i) => [`s${i}`, value]));
          const expected = values.findIndex((value) => text.includes(value));
          const found = carriedSecret(secrets, NONE, head([['X', text]]))?.name;
          expect(found).toBe(expected < 0 ? undefined : `s${expected}`);
        },
      ),
      { numRuns: 500 },
    );
  });
});
