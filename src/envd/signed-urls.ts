/**
 * Signed /files URLs (`downloadUrl`/`uploadUrl` of secure sandboxes): `v1_` + unpadded base64 of
 * SHA-256 over `<path>:<read|write>:<user>:<token>[:<expiration>]`.
 */
import { createHash } from 'node:crypto';
import type { CallContext } from './context.js';
import { unauthenticated } from './file-errors.js';
import { sameSecret } from '../same-secret.js';

const digest = (text: string) => createHash('sha256').update(text).digest();

function signatureValid(url: URL, token: string, operation: 'read' | 'write'): boolean {
  const given = url.searchParams.get('signature');
  if (given === null) return false;
  const expiration = url.searchParams.get('signature_expiration');
  const signed = [
    url.searchParams.get('path') ?? '',
    operation,
    url.searchParams.get('username') ?? '',
    token,
    ...(expiration !== null ? [expiration] : []),
  ].join(':');
  const expected = `v1_${digest(signed).toString('base64').replace(/=+$/, '')}`;
  return sameSecret(given, expected);
}

/**
 * Whether `token` signed this /files URL (for either operation, expired or not): how the
 * sandbox listener's router finds the sandbox of a signed URL that names none. checkSignature
 * checks the rest.
 */
export function signatureMatches(url: URL, token: string): boolean {
  return signatureValid(url, token, 'read') || signatureValid(url, token, 'write');
}

/** A signed request must carry a valid, unexpired signature for its operation. */
export function checkSignature(context: CallContext, url: URL, operation: 'read' | 'write'): void {
  const token = context.sandbox.accessToken;
  if (token === null || !url.searchParams.has('signature')) return;
  const expiration = url.searchParams.get('signature_expiration');
  if (expiration !== null && !/^[0-9]{1,12}$/.test(expiration)) {
    throw unauthenticated('signature_expiration must be a time in unix seconds');
  }
  if (!signatureValid(url, token, operation)) {
    throw unauthenticated(`invalid signature for ${operation} access`);
  }
  if (expiration !== null && Number(expiration) < Math.floor(Date.now() / 1000)) {
    // The reference daemon's words, which clients match.
    throw unauthenticated('signature is already expired');
  }
}
