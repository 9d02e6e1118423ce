/**
 * Signed /files URLs (`downloadUrl`/`uploadUrl` of secure sandboxes): `v1_` + unpadded base64 of
 * SHA-256 over `<path>:<read|write>:<user>:<token>[:<expiration>]`.
 */
import { createHash } from 'node:crypto';
import { sameSecret } from '../secret-compare/index.js';

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
 * sandbox listener's router finds the sandbox of a signed URL that names none.
 * signatureRefusal checks the rest.
 */
export function signatureMatches(url: URL, token: string): boolean {
  return signatureValid(url, token, 'read') || signatureValid(url, token, 'write');
}

/**
 * Why a signed request is refused (its signature is wrong for this operation, or expired), in
 * the reference daemon's words, which clients match; undefined when it carries no signature
 * (the access token is then required) or a valid one.
 */
export function signatureRefusal(
  token: string | null,
  url: URL,
  operation: 'read' | 'write',
): string | undefined {
  if (token === null || !url.searchParams.has('signature')) return undefined;
  const expiration = url.searchParams.get('signature_expiration');
  if (expiration !== null && !/^[0-9]{1,12}$/.test(expiration)) {
    return 'signature_expiration must be a time in unix seconds';
  }
  if (!signatureValid(url, token, operation)) return 'invalid signature';
  if (expiration !== null && Number(expiration) < Math.floor(Date.now() / 1000)) {
    return 'signature is already expired';
  }
  return undefined;
}
