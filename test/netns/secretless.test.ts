/**
 * Secretless egress in namespace mode, with the real `e2b` SDK: each sandbox in its own network
 * namespace (made by a Moat in this process), a "world" namespace whose HTTPS origin on 443
 * presents a leaf of a test CA that Moat trusts through --upstream-ca. `curl https://name/`
 * from inside reaches the origin with the rule's headers added, both through the proxy
 * variables (CONNECT) and with `--noproxy '*'`, where the kernel redirects the sandbox's TCP 443
 * to Moat's transparent listener. The sandbox verifies Moat's leaf through its own trust store
 * (no -k) and never holds the secret. A second sandbox's rule names a workload identity token
 * instead: each way out, the origin gets a JWT-SVID that verifies against Moat's JWKS.
 */
import { Secret, type Sandbox } from 'e2b';
import { createLocalJWKSet, type JSONWebKeySet, jwtVerify } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World } from '../../bench/lib/world.js';
import type { ZoneEntry } from '../support/fake-dns.js';
import { namespaceSkipReason } from '../support/netns.js';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';
import { curlIn, expectSecretsNowhere } from '../support/secretless.js';
import { TestCa } from '../support/test-ca.js';

const skip = namespaceSkipReason('test/netns/secretless');

const PREFIX = '198.18.25';
const ORIGIN_IP = `${PREFIX}.2`;
const POOL = '10.225.25.0/24';
const TOKEN = `ghp_${'n4m3sp4c3'.repeat(4)}`;
const PLACEHOLDER = '${e2b.secrets.gh}';
const ISSUER = 'https://moat.example.com';

/** Both ways out of a sandbox; `%{http_connect}` (after the body) is 200 only for CONNECT. */
const WAYS = [
  { way: 'through the proxy (CONNECT)', flags: '', connect: '200' },
  { way: "with --noproxy '*' (the transparent listener)", flags: "--noproxy '*'", connect: '000' },
] as const;

/** The origin's JSON echo of the request headers, and how curl got there. */
function parsed(seen: { stdout: string; stderr: string }) {
  const cut = seen.stdout.lastIndexOf('\n');
  expect(cut, seen.stderr).toBeGreaterThanOrEqual(0);
  return {
    headers: JSON.parse(seen.stdout.slice(0, cut)) as Record<string, string | undefined>,
    connect: seen.stdout.slice(cut + 1),
  };
}

describe.skipIf(skip !== undefined)('secretless egress in namespace mode', () => {
  let world: World;
  let harness: SdkMoat;
  let sandbox: Sandbox;
  const logs: string[] = [];
  const originCa = new TestCa('Namespaced secretless origin test CA');
  const zone = new Map<string, ZoneEntry>([
    ['api.secret.test', { A: [ORIGIN_IP], ttl: 300 }],
    ['plain.secret.test', { A: [ORIGIN_IP], ttl: 300 }],
    ['sts.secret.test', { A: [ORIGIN_IP], ttl: 300 }],
  ]);

  beforeAll(async () => {
    world = await World.create(
      'secret',
      PREFIX,
      originCa.issue(['api.secret.test', 'plain.secret.test', 'sts.secret.test']),
    );
    harness = await startSdkMoat({
      zone,
      logs,
      flags: {
        enforcement: 'namespace',
        'namespace-pool': POOL,
        // The world's addresses are special-use ones; only link-local stays internal here.
        'internal-deny': '169.254.0.0/16',
        'upstream-ca': originCa.certFile(),
        'identity-issuer': ISSUER,
      },
    });
    await Secret.create('gh', TOKEN);
    sandbox = await harness.sandbox({
      network: {
        allowOut: ['api.secret.test', 'plain.secret.test'],
        denyOut: ['0.0.0.0/0'],
        rules: {
          'api.secret.test': [
            {
              transform: { headers: { Authorization: `Bearer ${PLACEHOLDER}`, 'X-Team': 'moat' } },
            },
          ],
        },
      } as never,
    });
  }, 60_000);

  afterAll(async () => {
    await harness?.stop();
    await world?.close();
    originCa.remove();
  });

  it('is namespace-enforced, with the proxy variables set by Moat', async () => {
    const detail = await harness.api.detail(sandbox.sandboxId);
    expect(detail.egress.enforcement).toBe('namespace');
    const proxy = await sandbox.commands.run('printf %s "$HTTPS_PROXY"');
    // The sandbox's proxy identity, then the gateway (its first pool address).
    expect(/@([\d.]+):\d+$/.exec(proxy.stdout)?.[1]).toBe('10.225.25.1');
  });

  for (const { way, flags, connect } of WAYS) {
    it(`adds the rule's headers at the gateway, ${way}`, async () => {
      const before = world.seen('https').length;
      const seen = parsed(
        await curlIn(
          sandbox,
          'https://api.secret.test/headers',
          `${flags} -w '\\n%{http_connect}'`,
        ),
      );
      expect(seen.connect).toBe(connect);
      expect(seen.headers).toMatchObject({
        authorization: `Bearer ${TOKEN}`,
        'x-team': 'moat',
        host: 'api.secret.test',
      });
      // Moat's own TLS connection to the origin, by the rule's name.
      expect(world.seen('https').slice(before)).toEqual([
        expect.objectContaining({ sni: 'api.secret.test', host: 'api.secret.test' }),
      ]);
      // A header the sandbox sends itself is replaced, not doubled.
      const replaced = parsed(
        await curlIn(
          sandbox,
          'https://api.secret.test/headers',
          `${flags} -H 'Authorization: Bearer mine' -H 'X-Team: theirs' -w '\\n%{http_connect}'`,
        ),
      );
      expect(replaced.headers).toMatchObject({
        authorization: `Bearer ${TOKEN}`,
        'x-team': 'moat',
      });
    });

    it(`leaves a name without a rule an opaque tunnel, ${way}`, async () => {
      // The origin's own certificate, from a CA the sandbox does not trust.
      const opaque = await curlIn(sandbox, 'https://plain.secret.test/headers', flags);
      expect(opaque.stderr).toMatch(/certificate/i);
      const unverified = parsed(
        await curlIn(
          sandbox,
          'https://plain.secret.test/headers',
          `${flags} -k -w '\\n%{http_connect}'`,
        ),
      );
      expect(unverified.connect).toBe(connect);
      expect(unverified.headers.host).toBe('plain.secret.test');
      expect(unverified.headers.authorization).toBeUndefined();
      expect(unverified.headers['x-team']).toBeUndefined();
    });

    it(`gives plain HTTP to the rule's name no credentials, ${way}`, async () => {
      const before = world.seen('http').length;
      const plain = await curlIn(sandbox, 'http://api.secret.test/headers', flags);
      expect(plain.stdout, plain.stderr).toContain('added over HTTPS only');
      expect(world.seen('http').slice(before)).toEqual([]);
    });
  }

  // Issue 33: sent directly (the transparent listener's port 80), this was not refused.
  for (const { way, flags } of WAYS) {
    it(`refuses plain HTTP carrying a secret's placeholder to a name without its rule, ${way}`, async () => {
      const before = world.seen('http').length;
      const leak = await curlIn(
        sandbox,
        `-H 'X-T: ${PLACEHOLDER}' http://plain.secret.test/headers`,
        flags,
      );
      expect(leak.stdout, leak.stderr).toContain('carries a secret placeholder');
      expect(world.seen('http').slice(before)).toEqual([]);
    });
  }

  it('mints an identity token the origin can verify against the JWKS, both ways out', async () => {
    const identified = await harness.sandbox({
      iam: {
        tokens: { aws: Secret.iamToken({ audience: 'sts.amazonaws.com', tokenType: 'JWT-SVID' }) },
      },
      network: {
        allowOut: ['sts.secret.test'],
        denyOut: ['0.0.0.0/0'],
        rules: {
          'sts.secret.test': [
            {
              transform: ({ iam }) => ({ headers: { Authorization: `Bearer ${iam.tokens.aws}` } }),
            },
          ],
        },
      },
    });
    const jwks = await harness.api.get('/.well-known/jwks.json', { key: null });
    expect(jwks.status, jwks.text).toBe(200);
    const keys = createLocalJWKSet(JSON.parse(jwks.text) as JSONWebKeySet);
    for (const { flags, connect } of WAYS) {
      const seen = parsed(
        await curlIn(
          identified,
          'https://sts.secret.test/headers',
          `${flags} -w '\\n%{http_connect}'`,
        ),
      );
      expect(seen.connect).toBe(connect);
      const token = seen.headers.authorization!.replace(/^Bearer /, '');
      const { payload } = await jwtVerify(token, keys, {
        issuer: ISSUER,
        audience: 'sts.amazonaws.com',
        algorithms: ['ES256'],
      });
      expect(payload.sub).toBe(`spiffe://moat.example.com/sandbox/${identified.sandboxId}`);
    }
  });

  it('never gives the sandbox, the API or the logs the secret', async () => {
    // The injections above were logged (by header names): the log check below looks at real lines.
    const injected = logs.filter((line) => line.includes('secret headers injected'));
    expect(injected.length).toBeGreaterThanOrEqual(4);
    expect(injected[0]).toContain('"headers":["Authorization","X-Team"]');
    await expectSecretsNowhere(harness, sandbox, {
      values: [TOKEN],
      placeholder: PLACEHOLDER,
      logs,
    });
  });
});
