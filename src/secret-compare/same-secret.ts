import { createHash, timingSafeEqual } from 'node:crypto';

/**
 * The digest a secret is compared by; a secret checked on every request (a sandbox's egress
 * credential) keeps its digest, so each check hashes only what it was given.
 */
export const secretDigest = (secret: string | Buffer): Buffer =>
  createHash('sha256').update(secret).digest();

/** Whether `given` is the secret whose digest is `expected` (compared as sameSecret does). */
export function matchesDigest(given: string | Buffer, expected: Buffer): boolean {
  return timingSafeEqual(secretDigest(given), expected);
}

/**
 * Whether `given` is `expected`. Both are hashed first, so the time taken says nothing about
 * where they differ or how long either is. The one comparison for every secret Moat checks.
 */
export function sameSecret(given: string | Buffer, expected: string | Buffer): boolean {
  return matchesDigest(given, secretDigest(expected));
}
