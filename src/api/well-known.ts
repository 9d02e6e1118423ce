/**
 * Workload identity's public documents on the API listener, without the API key: identity
 * providers (AWS IAM, GCP, Azure) fetch them anonymously to verify the tokens Moat mints.
 * Only these two paths are open, and only when the operator enabled identity.
 */
import type { FastifyInstance } from 'fastify';

/** What the identity issuer publishes; undefined in the options: identity is off (404). */
export interface IdentityDocuments {
  /** The OpenID Provider metadata. */
  discovery(): Record<string, unknown>;
  /** The JWK Set of the keys whose tokens may still be alive. */
  jwks(): Promise<object>;
  /** How long verifiers may cache both (a new key is published that long before it signs). */
  readonly maxAgeSeconds: number;
}

export function registerWellKnown(app: FastifyInstance, documents: IdentityDocuments): void {
  const CACHE_CONTROL = `public, max-age=${documents.maxAgeSeconds}`;
  app.get('/.well-known/openid-configuration', async (_request, reply) => {
    reply.header('cache-control', CACHE_CONTROL);
    return documents.discovery();
  });
  app.get('/.well-known/jwks.json', async (_request, reply) => {
    reply.header('cache-control', CACHE_CONTROL);
    reply.type('application/jwk-set+json');
    return JSON.stringify(await documents.jwks());
  });
}
