import { randomBytes, randomInt } from 'node:crypto';

const ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';

/** Random `[a-z0-9]` text from the CSPRNG (no modulo bias: randomInt draws uniformly). */
export function randomName(length: number): string {
  let out = '';
  for (let i = 0; i < length; i++) out += ALPHABET[randomInt(ALPHABET.length)];
  return out;
}

/** A new sandbox ID, of the shape SANDBOX_ID (src/e2b-wire/sandbox-id.ts) checks. */
export const newSandboxID = () => `i${randomName(20)}`;
export { SANDBOX_ID } from '../e2b-wire/index.js';

/** Tokens and egress secrets: 256 bits, URL-safe. */
export const newSecret = () => randomBytes(32).toString('base64url');

/** Snapshot aliases and tags: lower-case words, as the reference service accepts them. */
export const NAME_PART = /^[a-z0-9][a-z0-9._-]{0,62}$/;
