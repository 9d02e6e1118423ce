/**
 * Workload identity on the platform API, as a hostile or careless client would try it: every
 * bad `iam` body, rules naming tokens the sandbox does not define (prototype names among them),
 * identity asked of a Moat whose operator did not enable it, and the two public documents
 * (served without the API key, and nothing else opened with them).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ApiMoat, expectError, expectNoContent, startApiMoat } from '../support/api-client.js';

const ISSUER = 'https://moat.example.com/identity';
const aws = { audience: 'sts.amazonaws.com', tokenType: 'JWT-SVID' };
const bearer = (name: string) => ({
  'sts.example.com': [
    { transform: { headers: { Authorization: `Bearer \${e2b.identity.tokens.${name}}` } } },
  ],
});
const create = (body: object) => ({ templateID: 'base', timeout: 300, secure: false, ...body });

describe('identity enabled (--identity-issuer)', () => {
  let harness: ApiMoat;

  beforeAll(async () => {
    harness = await startApiMoat(new Map(), { 'identity-issuer': `${ISSUER}/` });
  }, 60_000);
  afterAll(() => harness?.stop());

  it.each([
    [
      'a token type other than JWT-SVID',
      { aws: { ...aws, tokenType: 'OIDC' } },
      /tokenType "OIDC" is not supported: Moat mints "JWT-SVID"/,
    ],
    [
      'a lower-case token type',
      { aws: { ...aws, tokenType: 'jwt-svid' } },
      /tokenType "jwt-svid" is not supported/,
    ],
    ['no audience', { aws: { tokenType: 'JWT-SVID' } }, /audience/],
    ['no token type', { aws: { audience: 'x' } }, /tokenType/],
    [
      'an empty audience',
      { aws: { ...aws, audience: '' } },
      /iam\.tokens\["aws"\]\.audience must be 1 to 512/,
    ],
    ['a blank audience', { aws: { ...aws, audience: '   ' } }, /audience must be 1 to 512/],
    ['an audience too long', { aws: { ...aws, audience: 'a'.repeat(513) } }, /audience/],
    [
      'an audience with a line break',
      { aws: { ...aws, audience: 'a\r\nb' } },
      /audience must be .* without control/,
    ],
    ['an audience that is no string', { aws: { ...aws, audience: ['a'] } }, /audience/],
    ['an unknown field', { aws: { ...aws, claims: { admin: true } } }, /claims/],
    ['a token that is no object', { aws: 'JWT-SVID' }, /aws/],
    ['an empty name', { '': aws }, /iam\.tokens\[""\]: a token name is 1 to 128/],
    ['a name with a brace', { 'a}b': aws }, /iam\.tokens\["a}b"\]: a token name/],
    ['a name with a control character', { 'a\tb': aws }, /a token name/],
    [
      'six tokens (E2B takes five)',
      Object.fromEntries(Array.from({ length: 6 }, (_, i) => [`t${i}`, aws])),
      /more than 5 properties/,
    ],
  ])('refuses %s', async (_what, tokens, message) => {
    const reply = await harness.api.post('/v2/sandboxes', create({ iam: { tokens } }));
    expectError(reply, 400, message);
  });

  it('refuses an iam that is not {tokens}', async () => {
    for (const iam of [[], 'aws', { tokens: [] }, { tokens: aws, extra: 1 }])
      expectError(await harness.api.post('/sandboxes', create({ iam })), 400);
  });

  it.each([
    [
      'a name iam does not define',
      { aws },
      'gcp',
      /names the identity token "gcp", which the sandbox's iam\.tokens does not define \(it defines "aws"\)/,
    ],
    ['any name without iam', undefined, 'aws', /names the identity token "aws".*it defines none/],
    ['a prototype name', { aws }, 'constructor', /identity token "constructor"/],
    ['__proto__', { aws }, '__proto__', /identity token "__proto__"/],
    ['a name in another case', { aws }, 'AWS', /identity token "AWS"/],
  ])(
    'refuses a rule naming %s, naming key, header and token',
    async (_what, tokens, name, message) => {
      const reply = await harness.api.post(
        '/v2/sandboxes',
        create({
          ...(tokens === undefined ? {} : { iam: { tokens } }),
          network: { allowOut: ['sts.example.com'], denyOut: ['0.0.0.0/0'], rules: bearer(name) },
        }),
      );
      expectError(reply, 400, message);
      expect((reply.body as { message: string }).message).toMatch(
        /network\.rules\["sts\.example\.com"\] header "Authorization"/,
      );
    },
  );

  it('stores iam with the sandbox: PUT network may name its tokens, no others', async () => {
    const sandbox = await harness.api.sandbox({
      iam: {
        tokens: { aws, 'gcp-prod': { audience: '//iam.googleapis.com/x', tokenType: 'JWT-SVID' } },
      },
      network: { allowOut: ['sts.example.com'], denyOut: ['0.0.0.0/0'], rules: bearer('aws') },
    });
    const at = `/sandboxes/${sandbox.sandboxID}/network`;
    expectNoContent(await harness.api.put(at, { rules: bearer('gcp-prod') }));
    expectError(
      await harness.api.put(at, { rules: bearer('azure') }),
      400,
      /identity token "azure".*defines "aws", "gcp-prod"/,
    );
    // As E2B's, the detail shows the rules (placeholders as written), never an iam field.
    const detail = await harness.api.detail(sandbox.sandboxID);
    expect(JSON.stringify(detail)).toContain('${e2b.identity.tokens.gcp-prod}');
    expect(detail).not.toHaveProperty('iam');
    // Forks keep the tokens: their rules still name a defined one.
    const forked = await harness.api.post(`/sandboxes/${sandbox.sandboxID}/fork`, { count: 1 });
    expect(forked.status, forked.text).toBe(201);
    const child = (forked.body as Array<{ sandbox?: { sandboxID: string } }>)[0]!.sandbox!;
    expectNoContent(
      await harness.api.put(`/sandboxes/${child.sandboxID}/network`, { rules: bearer('aws') }),
    );
  });

  it('takes an empty token map as no identity', async () => {
    await harness.api.sandbox({ iam: { tokens: {} } });
    await harness.api.sandbox({ iam: {} });
  });

  it('serves the discovery document and the JWKS without the API key', async () => {
    const discovery = await harness.api.get('/.well-known/openid-configuration', { key: null });
    expect(discovery.status, discovery.text).toBe(200);
    expect(discovery.body).toMatchObject({
      issuer: ISSUER,
      jwks_uri: `${ISSUER}/.well-known/jwks.json`,
      id_token_signing_alg_values_supported: ['ES256'],
      subject_types_supported: ['public'],
      response_types_supported: ['id_token'],
    });
    const jwks = await harness.api.get('/.well-known/jwks.json', { key: 'wrong-key' });
    expect(jwks.status, jwks.text).toBe(200);
    expect(jwks.headers.get('content-type')).toMatch(/^application\/jwk-set\+json/);
    const { keys } = JSON.parse(jwks.text) as { keys: Array<Record<string, string>> };
    expect(keys).toHaveLength(1);
    expect(keys[0]).toMatchObject({ kty: 'EC', crv: 'P-256', use: 'sig', alg: 'ES256' });
    expect(Object.keys(keys[0]!).sort()).toEqual(['alg', 'crv', 'kid', 'kty', 'use', 'x', 'y']);
    // Only those two: their neighbours and every other route still want the key.
    for (const path of ['/.well-known/jwks', '/.well-known/', '/sandboxes', '/secrets', '/flows']) {
      const reply = await harness.api.get(path, { key: null });
      expect([401, 404], `${path}: ${reply.status}`).toContain(reply.status);
      expect(reply.text).not.toContain('"keys"');
    }
    expectError(await harness.api.get('/sandboxes', { key: null }), 401);
    // No other method on them.
    expect((await harness.api.post('/.well-known/jwks.json', {}, { key: null })).status).toBe(404);
  });
});

describe('identity not enabled', () => {
  let harness: ApiMoat;

  beforeAll(async () => {
    harness = await startApiMoat();
  }, 60_000);
  afterAll(() => harness?.stop());

  it('refuses iam.tokens and identity placeholders, naming the setting the operator must set', async () => {
    expectError(
      await harness.api.post('/v2/sandboxes', create({ iam: { tokens: { aws } } })),
      400,
      /iam\.tokens asks for workload identity tokens, which this Moat does not mint: the operator must set --identity-issuer URL/,
    );
    expectError(
      await harness.api.post('/v2/sandboxes', create({ network: { rules: bearer('aws') } })),
      400,
      /network\.rules\["sts\.example\.com"\] header "Authorization" asks for workload identity tokens.*--identity-issuer/,
    );
    const sandbox = await harness.api.sandbox();
    expectError(
      await harness.api.put(`/sandboxes/${sandbox.sandboxID}/network`, { rules: bearer('aws') }),
      400,
      /--identity-issuer/,
    );
  });

  it('serves no discovery documents', async () => {
    for (const path of ['/.well-known/openid-configuration', '/.well-known/jwks.json'])
      expect((await harness.api.get(path, { key: null })).status).toBe(404);
  });
});
