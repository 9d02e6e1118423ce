/**
 * Workload identity end to end with the real `e2b` SDK, as issue 34 asks: a sandbox created with
 * `iam.tokens.aws` (Secret.iamToken) and a rule whose transform callback writes
 * `Bearer ${iam.tokens.aws}`; `curl https://...` inside the (confined) sandbox reaches an origin
 * that verifies each token with `jose` against the JWKS it finds through Moat's discovery
 * document, as a cloud's federation does. The token is nowhere the sandbox can look, in no log
 * line and no flow record; an echoing origin hands back the placeholder only. A key rotation
 * (the real `moat identity rotate-key`, a child process) publishes a new key at once while the
 * old one goes on signing, and the old token still verifies.
 */
import https from 'node:https';
import net, { type AddressInfo } from 'node:net';
import { Secret } from 'e2b';
import { createRemoteJWKSet, jwtVerify } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';
import { curlIn, expectSecretsNowhere } from '../support/secretless.js';
import { TestCa } from '../support/test-ca.js';
import { runMoat } from '../support/moat.js';
import { skipReason } from '../confinement/runtime-harness.js';

const skip = skipReason('sdk/identity');
const ORIGIN_IP = '127.0.0.43';
const AUDIENCE = 'sts.amazonaws.com';
const PLACEHOLDER = '${e2b.identity.tokens.aws}';

/** A free loopback port, for the API listener the issuer URL must name before Moat starts. */
async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** What the origin found: the token's claims as `jose` verified them, or why it refused it. */
type Seen =
  | { ok: true; claims: Record<string, unknown>; kid: string; echoed: string }
  | { ok: false; error: string; echoed: string };

describe.skipIf(skip !== undefined)('workload identity through the SDK', () => {
  let harness: SdkMoat;
  let origin: https.Server;
  let port: number;
  let issuer: string;
  const logs: string[] = [];
  /** Every token the origin was sent, in order. */
  const received: string[] = [];
  const originCa = new TestCa('Identity origin test CA');

  /** Verifies as a federation does: the discovery document names the JWKS. */
  async function federationVerify(token: string) {
    const discovery = (await (
      await fetch(`${issuer}/.well-known/openid-configuration`)
    ).json()) as { issuer: string; jwks_uri: string };
    const keys = createRemoteJWKSet(new URL(discovery.jwks_uri), { cacheMaxAge: 0 });
    return jwtVerify(token, keys, {
      issuer: discovery.issuer,
      audience: AUDIENCE,
      algorithms: ['ES256'],
    });
  }

  beforeAll(async () => {
    const leaf = originCa.issue(['sts.identity.test']);
    origin = https.createServer({ key: leaf.key, cert: leaf.cert }, (request, response) => {
      const authorization = request.headers.authorization ?? '';
      const token = authorization.replace(/^Bearer /, '');
      received.push(token);
      federationVerify(token)
        .then(
          ({ payload, protectedHeader }): Seen => ({
            ok: true,
            claims: payload,
            kid: protectedHeader.kid ?? '',
            echoed: authorization,
          }),
          (error: Error): Seen => ({ ok: false, error: error.message, echoed: authorization }),
        )
        .then((seen) => {
          // An echoing origin: the request's credential comes back in the answer.
          response.setHeader('content-type', 'application/json');
          response.setHeader('x-echo', authorization);
          response.end(JSON.stringify(seen));
        });
    });
    await new Promise<void>((resolve) => origin.listen(0, ORIGIN_IP, resolve));
    port = (origin.address() as AddressInfo).port;
    const apiPort = await freePort();
    issuer = `http://127.0.0.1:${apiPort}`;
    harness = await startSdkMoat({
      logs,
      zone: new Map([['sts.identity.test', { A: [ORIGIN_IP] }]]),
      flags: {
        'api-listen': `127.0.0.1:${apiPort}`,
        enforcement: 'proxy',
        'internal-deny': '169.254.0.0/16',
        'allow-host-ports': String(port),
        'upstream-ca': originCa.certFile(),
        'redact-secrets-in-responses': 'true',
        'identity-issuer': issuer,
      },
    });
  }, 60_000);

  afterAll(async () => {
    await harness?.stop();
    origin?.close();
    originCa.remove();
  });

  it('mints a token per request that the origin verifies against the JWKS; the sandbox never holds it', async () => {
    const sandbox = await harness.sandbox({
      iam: { tokens: { aws: Secret.iamToken({ audience: AUDIENCE, tokenType: 'JWT-SVID' }) } },
      network: {
        allowOut: ['sts.identity.test'],
        denyOut: ['0.0.0.0/0'],
        rules: {
          'sts.identity.test': [
            {
              transform: ({ iam }) => ({
                headers: { Authorization: `Bearer ${iam.tokens.aws}` },
              }),
            },
          ],
        },
      },
    });
    const url = `https://sts.identity.test:${port}/`;
    const first = await curlIn(sandbox, url, '-D /dev/stderr');
    const seen = JSON.parse(first.stdout) as Seen;
    expect(seen, first.stderr).toMatchObject({ ok: true });
    if (!seen.ok) return;
    const { claims } = seen;
    expect(claims).toMatchObject({
      iss: issuer,
      aud: AUDIENCE,
      sub: `spiffe://127.0.0.1/sandbox/${sandbox.sandboxId}`,
      sandbox_id: sandbox.sandboxId,
      template_id: 'base',
      team: 'moat',
    });
    const now = Date.now() / 1000;
    expect(claims.exp as number).toBeGreaterThan(now);
    expect((claims.exp as number) - (claims.iat as number)).toBeLessThanOrEqual(300);
    expect(claims.exp as number).toBeLessThanOrEqual(now + 301);
    // The echo comes back as the placeholder, in the body and in the header.
    expect(seen.echoed).toBe(`Bearer ${PLACEHOLDER}`);
    expect(first.stderr).toContain(`x-echo: Bearer ${PLACEHOLDER}`);

    // The next request reuses the cached token; a token the sandbox sends itself is replaced.
    const second = JSON.parse(
      (await curlIn(sandbox, url, "-H 'Authorization: Bearer forged'")).stdout,
    ) as Seen;
    expect(second.ok).toBe(true);
    expect(received[1]).toBe(received[0]);

    // Rotation: the real command, on Moat's data folder, while Moat runs.
    const rotated = await runMoat([
      'identity',
      'rotate-key',
      '--data-dir',
      harness.moat.config.dataDir,
    ]);
    expect(rotated.code, rotated.stderr).toBe(0);
    const newKid = /identity key (\S+) is published and signs from /.exec(rotated.stdout)?.[1];
    expect(newKid, rotated.stdout).toBeDefined();
    await new Promise((resolve) => setTimeout(resolve, 1100));
    // Published at once, beside the key that signs; it signs only once every verifier's cached
    // JWKS holds it (test/identity/issuer.test.ts moves the clock there).
    const jwks = (await (await fetch(`${issuer}/.well-known/jwks.json`)).json()) as {
      keys: Array<{ kid: string }>;
    };
    expect(jwks.keys.map((key) => key.kid).sort()).toEqual([newKid, seen.kid].sort());
    const third = JSON.parse((await curlIn(sandbox, url)).stdout) as Seen;
    expect(third.ok).toBe(true);
    if (!third.ok) return;
    expect(third.kid).toBe(seen.kid);
    // The token signed before the rotation verifies, through the discovery document.
    await expect(federationVerify(received[0]!)).resolves.toMatchObject({
      protectedHeader: { kid: seen.kid },
    });

    // Nowhere the sandbox, an API client, Moat's logs or its flow records hold a token.
    const tokens = [...new Set(received)];
    expect(tokens).toHaveLength(1);
    expect(logs.join('')).toContain('secret headers injected');
    await expectSecretsNowhere(harness, sandbox, {
      values: tokens,
      placeholder: PLACEHOLDER,
      logs,
    });
    const flows = await harness.api.get(`/flows?sandboxID=${sandbox.sandboxId}&limit=100`);
    expect(flows.status, flows.text).toBe(200);
    expect(flows.text).toContain('sts.identity.test');
    for (const token of tokens) {
      expect(flows.text).not.toContain(token);
      // Not even its signature alone.
      expect(logs.join('')).not.toContain(token.split('.')[2]);
    }
  });

  it('refuses on create a rule naming a token iam does not define, as the SDK checks it too', async () => {
    await expect(
      harness.sandbox({
        iam: { tokens: { aws: Secret.iamToken({ audience: AUDIENCE, tokenType: 'JWT-SVID' }) } },
        network: {
          allowOut: ['sts.identity.test'],
          denyOut: ['0.0.0.0/0'],
          rules: {
            'sts.identity.test': [
              { transform: { headers: { Authorization: 'Bearer ${e2b.identity.tokens.gcp}' } } },
            ],
          },
        },
      }),
    ).rejects.toThrow(/identity token "gcp", which the sandbox's iam\.tokens does not define/);
    await expect(
      harness.sandbox({
        iam: { tokens: { aws: Secret.iamToken({ audience: AUDIENCE, tokenType: 'OIDC' }) } },
      }),
    ).rejects.toThrow(/tokenType "OIDC" is not supported/);
  });
});
