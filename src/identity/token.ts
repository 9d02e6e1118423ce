/**
 * One JWT-SVID (SPIFFE's JWT form of a workload identity document): a compact JWS signed ES256
 * with node:crypto (`ieee-p1363`: r and s as two 32-byte integers, as RFC 7518 section 3.4 asks).
 */
import { randomUUID, sign } from 'node:crypto';
import { type SigningKey, TOKEN_LIFETIME_S } from './keys.js';

/** Who a token is for: one sandbox, one audience. */
export interface TokenSubject {
  readonly sandboxID: string;
  readonly templateID: string;
  readonly audience: string;
}

/** What every token of one Moat says about its issuer. */
export interface TokenIssuer {
  readonly issuer: string;
  readonly trustDomain: string;
  /** The `team` claim; absent: not sent. */
  readonly team?: string;
}

export interface MintedToken {
  readonly token: string;
  /** Its `exp`, in milliseconds since the epoch. */
  readonly expiresAt: number;
  readonly kid: string;
}

const part = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url');

/** The SPIFFE ID of a sandbox: `spiffe://<trust domain>/sandbox/<sandboxID>`. */
export const spiffeID = (trustDomain: string, sandboxID: string): string =>
  `spiffe://${trustDomain}/sandbox/${sandboxID}`;

export function mintToken(
  issuer: TokenIssuer,
  subject: TokenSubject,
  key: SigningKey,
  now: number,
): MintedToken {
  const iat = Math.floor(now / 1000);
  const exp = iat + TOKEN_LIFETIME_S;
  const header = { alg: 'ES256', kid: key.kid, typ: 'JWT' };
  const claims = {
    iss: issuer.issuer,
    sub: spiffeID(issuer.trustDomain, subject.sandboxID),
    aud: subject.audience,
    iat,
    exp,
    jti: randomUUID(),
    sandbox_id: subject.sandboxID,
    template_id: subject.templateID,
    ...(issuer.team === undefined ? {} : { team: issuer.team }),
  };
  const signed = `${part(header)}.${part(claims)}`;
  const signature = sign('sha256', Buffer.from(signed), {
    key: key.privateKey,
    dsaEncoding: 'ieee-p1363',
  });
  return {
    token: `${signed}.${signature.toString('base64url')}`,
    expiresAt: exp * 1000,
    kid: key.kid,
  };
}
