/**
 * The one comparison for every secret Moat checks (API keys, sandbox credentials, signed URLs,
 * agent tokens): by digest, so the time taken says nothing about where two secrets differ.
 */
export { matchesDigest, sameSecret, secretDigest } from './same-secret.js';
