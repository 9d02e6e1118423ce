/** Workload identity: JWT-SVIDs for sandboxes, their signing keys, the discovery documents. */
export {
  DISCOVERY_PATH,
  IdentityIssuer,
  type IdentityIssuerOptions,
  JWKS_PATH,
  REUSE_MARGIN_MS,
} from './issuer.js';
export {
  JWKS_MAX_AGE_S,
  KEY_FOLDER,
  KEY_RECHECK_MS,
  PUBLISH_AHEAD_MS,
  type PublicJwk,
  RETIRED_KEY_KEPT_MS,
  rotateKey,
  TOKEN_LIFETIME_S,
} from './keys.js';
export { spiffeID, type TokenSubject } from './token.js';
