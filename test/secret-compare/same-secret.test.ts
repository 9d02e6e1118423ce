import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { matchesDigest, sameSecret, secretDigest } from '../../src/secret-compare/index.js';

describe('sameSecret', () => {
  it.each([
    ['abc', 'abc', true],
    ['abc', 'abd', false],
    ['abc', 'abcd', false],
    ['', '', true],
    ['', 'x', false],
    ['é', Buffer.from('é'), true],
  ] as const)('%j against %j is %s', (given, expected, same) => {
    expect(sameSecret(given, expected)).toBe(same);
  });

  it('is true exactly when the two strings are equal, whatever their lengths', () => {
    fc.assert(
      fc.property(fc.string(), fc.string(), (a, b) => {
        expect(sameSecret(a, b)).toBe(a === b);
        expect(sameSecret(a, Buffer.from(a))).toBe(true);
        expect(matchesDigest(a, secretDigest(b))).toBe(a === b);
      }),
    );
  });
});
