/**
 * Workload identity for sandboxes: the tokens Moat's egress proxy puts in place of
 * `${e2b.identity.tokens.NAME}`, cached per (sandbox, name), and the two public documents an
 * identity provider (AWS IAM, GCP, Azure) federates with: the OpenID discovery document and the
 * JWKS. Tokens are credentials: nothing here logs or returns one except `token`.
 */
import { IdentityKeys, JWKS_MAX_AGE_S, type PublicJwk } from './keys.js';
import { type MintedToken, mintToken, type TokenIssuer, type TokenSubject } from './token.js';

/** A cached token is handed out until this long before it expires, then a new one is made. */
export const REUSE_MARGIN_MS = 60_000;
/**
 * Cached tokens beyond which expired ones are swept (a sandbox's are dropped when it goes); the
 * next sweep waits until the cache has doubled, so each costs at most one pass per token added.
 */
const CACHE_SWEEP_SIZE = 10_000;

export const DISCOVERY_PATH = '/.well-known/openid-configuration';
export const JWKS_PATH = '/.well-known/jwks.json';

export interface IdentityIssuerOptions extends TokenIssuer {
  readonly dataDir: string;
  readonly now?: () => number;
}

export class IdentityIssuer {
  private readonly keys: IdentityKeys;
  private readonly now: () => number;
  private readonly cache = new Map<string, MintedToken>();
  private sweepAt = CACHE_SWEEP_SIZE;

  constructor(private readonly options: IdentityIssuerOptions) {
    this.now = options.now ?? Date.now;
    this.keys = new IdentityKeys(options.dataDir, this.now);
  }

  get issuer(): string {
    return this.options.issuer;
  }

  /**
   * The token `name` of sandbox `sandboxID`: the cached one while it has more than
   * REUSE_MARGIN_MS to live and its key is still the current one, else a new one for the
   * subject `subjectOf` gives (undefined: the sandbox has no such token; so is the answer).
   */
  async token(
    sandboxID: string,
    name: string,
    subjectOf: () => Promise<TokenSubject | undefined>,
  ): Promise<string | undefined> {
    const key = await this.keys.current();
    const cacheKey = `${sandboxID}\u0000${name}`;
    const cached = this.cache.get(cacheKey);
    const now = this.now();
    if (cached !== undefined && cached.kid === key.kid && now < cached.expiresAt - REUSE_MARGIN_MS)
      return cached.token;
    const subject = await subjectOf();
    if (subject === undefined) return undefined;
    const minted = mintToken(this.options, subject, key, now);
    if (this.cache.size >= this.sweepAt) this.sweep(now);
    this.cache.set(cacheKey, minted);
    return minted.token;
  }

  /** Drops the cached tokens of a sandbox that is gone (or whose tokens may have changed). */
  forget(sandboxID: string): void {
    const prefix = `${sandboxID}\u0000`;
    for (const key of this.cache.keys()) if (key.startsWith(prefix)) this.cache.delete(key);
  }

  /** The OpenID Provider metadata (OpenID Connect Discovery 1.0) a federation reads. */
  /** How long verifiers may cache the documents (a new key is published that long ahead). */
  readonly maxAgeSeconds = JWKS_MAX_AGE_S;

  discovery(): Record<string, unknown> {
    const { issuer } = this.options;
    return {
      issuer,
      jwks_uri: `${issuer}${JWKS_PATH}`,
      response_types_supported: ['id_token'],
      subject_types_supported: ['public'],
      id_token_signing_alg_values_supported: ['ES256'],
      claims_supported: [
        'iss',
        'sub',
        'aud',
        'iat',
        'exp',
        'jti',
        'sandbox_id',
        'template_id',
        'team',
      ],
    };
  }

  /** The JWK Set of every key whose tokens may still be alive. */
  async jwks(): Promise<{ readonly keys: readonly PublicJwk[] }> {
    return { keys: await this.keys.published() };
  }

  private sweep(now: number): void {
    for (const [key, minted] of this.cache) if (minted.expiresAt <= now) this.cache.delete(key);
    this.sweepAt = Math.max(CACHE_SWEEP_SIZE, 2 * this.cache.size);
  }
}
