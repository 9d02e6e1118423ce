import { createHash, timingSafeEqual } from 'node:crypto';

const digest = (secret: string | Buffer) => createHash('sha256').update(secret).digest();

/**
 * Whether `given` is `expected`. Both are hashed first, so the time taken says nothing about
 * where they differ or how long either is. The one comparison for every secret Moat checks.
 */
export function sameSecret(given: string | Buffer, expected: string | Buffer): boolean {
  return timingSafeEqual(digest(given), digest(expected));
}
