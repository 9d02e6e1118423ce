/**
 * The token issuer as a verifier meets it: every token checked with `jose` (a standard JOSE
 * library, not our code) against the JWKS Moat publishes, on a clock the test moves.
 */
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLocalJWKSet, decodeProtectedHeader, jwtVerify } from 'jose';
import { afterEach, describe, expect, it } from 'vitest';
import {
  IdentityIssuer,
  JWKS_MAX_AGE_S,
  KEY_FOLDER,
  KEY_RECHECK_MS,
  PUBLISH_AHEAD_MS,
  REUSE_MARGIN_MS,
  RETIRED_KEY_KEPT_MS,
  rotateKey,
  TOKEN_LIFETIME_S,
} from '../../src/identity/index.js';

const ISSUER = 'https://moat.example.com';
const START = Date.UTC(2026, 11, 7, 12, 0, 0);
const folders: string[] = [];

afterEach(() => {
  for (const folder of folders.splice(0)) rmSync(folder, { recursive: true, force: true });
});

function issuerAt(clock: { now: number }, dataDir?: string) {
  const dir = dataDir ?? mkdtempSync(path.join(os.tmpdir(), 'moat-identity-'));
  if (dataDir === undefined) folders.push(dir);
  const issuer = new IdentityIssuer({
    issuer: ISSUER,
    trustDomain: 'moat.example.com',
    team: 'acme',
    dataDir: dir,
    now: () => clock.now,
  });
  return { issuer, dir };
}

const subject =
  (sandboxID = 'isb1', audience = 'sts.amazonaws.com') =>
  async () => ({
    sandboxID,
    templateID: 'base',
    audience,
  });

async function verify(issuer: IdentityIssuer, token: string, at: number, audience: string) {
  const keys = createLocalJWKSet({ keys: [...(await issuer.jwks()).keys] });
  return jwtVerify(token, keys, {
    issuer: ISSUER,
    audience,
    algorithms: ['ES256'],
    currentDate: new Date(at),
  });
}

describe('identity tokens', () => {
  it('are JWT-SVIDs a standard library verifies against the published JWKS', async () => {
    const clock = { now: START };
    const { issuer } = issuerAt(clock);
    const token = (await issuer.token('isb1', 'aws', subject()))!;
    const { payload, protectedHeader } = await verify(
      issuer,
      token,
      clock.now,
      'sts.amazonaws.com',
    );
    expect(protectedHeader).toEqual({ alg: 'ES256', typ: 'JWT', kid: expect.any(String) });
    expect(payload).toEqual({
      iss: ISSUER,
      sub: 'spiffe://moat.example.com/sandbox/isb1',
      aud: 'sts.amazonaws.com',
      iat: START / 1000,
      exp: START / 1000 + TOKEN_LIFETIME_S,
      jti: expect.stringMatching(/^[0-9a-f-]{36}$/),
      sandbox_id: 'isb1',
      template_id: 'base',
      team: 'acme',
    });
    expect(TOKEN_LIFETIME_S).toBeLessThanOrEqual(300);
    const jwks = await issuer.jwks();
    expect(jwks.keys).toEqual([
      {
        kty: 'EC',
        crv: 'P-256',
        x: expect.any(String),
        y: expect.any(String),
        kid: protectedHeader.kid,
        use: 'sig',
        alg: 'ES256',
      },
    ]);
    // The JWKS holds no private part.
    expect(JSON.stringify(jwks)).not.toMatch(/"d"/);
  });

  it('are refused by a verifier for another audience, after expiry and when altered', async () => {
    const clock = { now: START };
    const { issuer } = issuerAt(clock);
    const token = (await issuer.token('isb1', 'aws', subject()))!;
    await expect(verify(issuer, token, clock.now, 'api://AzureADTokenExchange')).rejects.toThrow(
      /aud/,
    );
    await expect(
      verify(issuer, token, START + TOKEN_LIFETIME_S * 1000 + 1000, 'sts.amazonaws.com'),
    ).rejects.toThrow(/exp/);
    const [head, body, signature] = token.split('.') as [string, string, string];
    const claims = JSON.parse(Buffer.from(body, 'base64url').toString()) as Record<string, unknown>;
    const forged = Buffer.from(
      JSON.stringify({ ...claims, sub: 'spiffe://moat.example.com/sandbox/other' }),
    ).toString('base64url');
    await expect(
      verify(issuer, `${head}.${forged}.${signature}`, clock.now, 'sts.amazonaws.com'),
    ).rejects.toThrow(/signature/);
  });

  it('are reused per (sandbox, name) until a minute before expiry, then made anew', async () => {
    const clock = { now: START };
    const { issuer } = issuerAt(clock);
    let lookups = 0;
    const counted = async () => {
      lookups++;
      return subject()();
    };
    const first = await issuer.token('isb1', 'aws', counted);
    clock.now = START + TOKEN_LIFETIME_S * 1000 - REUSE_MARGIN_MS - 1;
    expect(await issuer.token('isb1', 'aws', counted)).toBe(first);
    expect(lookups).toBe(1);
    // Another sandbox or another name never gets that token.
    expect(await issuer.token('isb2', 'aws', subject('isb2'))).not.toBe(first);
    expect(await issuer.token('isb1', 'gcp', subject('isb1', 'gcp'))).not.toBe(first);
    clock.now = START + TOKEN_LIFETIME_S * 1000 - REUSE_MARGIN_MS;
    const second = await issuer.token('isb1', 'aws', counted);
    expect(second).not.toBe(first);
    expect(lookups).toBe(2);
    // A sandbox that is gone has its tokens dropped.
    issuer.forget('isb1');
    expect(await issuer.token('isb1', 'aws', counted)).not.toBe(second);
  });

  it('are not made for a name the sandbox does not define', async () => {
    const { issuer } = issuerAt({ now: START });
    expect(await issuer.token('isb1', 'nope', async () => undefined)).toBeUndefined();
  });

  it('keep their key in the data folder, private to Moat', async () => {
    const clock = { now: START };
    const { issuer, dir } = issuerAt(clock);
    await Promise.all([1, 2, 3].map(() => issuer.token('isb1', 'aws', subject())));
    const folder = path.join(dir, KEY_FOLDER);
    const files = readdirSync(folder);
    // Three first requests at once generate one key, not three.
    expect(files).toHaveLength(1);
    expect(statSync(folder).mode & 0o777).toBe(0o700);
    expect(statSync(path.join(folder, files[0]!)).mode & 0o777).toBe(0o600);
    // Another issuer on the same folder (a restart) signs with the same key.
    const again = issuerAt(clock, dir).issuer;
    const token = (await again.token('isb1', 'aws', subject()))!;
    await verify(issuer, token, clock.now, 'sts.amazonaws.com');
  });

  it('refuses to start from a key file that is not a key', async () => {
    const { issuer, dir } = issuerAt({ now: START });
    const folder = path.join(dir, KEY_FOLDER);
    await issuer.jwks();
    writeFileSync(path.join(folder, 'bad.json'), '{"created": 1, "privateKey": "nope"}');
    const fresh = issuerAt({ now: START }, dir).issuer;
    await expect(fresh.jwks()).rejects.toThrow(/bad\.json/);
  });
});

describe('key rotation', () => {
  it('publishes a new key before it signs: a verifier holding the JWKS for its max-age verifies every token', async () => {
    const clock = { now: START };
    const { issuer, dir } = issuerAt(clock);
    await issuer.token('isb1', 'aws', subject());
    // What a federation fetched just before the rotation, and may keep for max-age.
    const cached = createLocalJWKSet({ keys: [...(await issuer.jwks()).keys] });
    await rotateKey(dir, clock.now);
    for (const after of [KEY_RECHECK_MS, 30_000, JWKS_MAX_AGE_S * 1000 - 1]) {
      clock.now = START + after;
      const token = (await issuer.token(`isb-${after}`, 'aws', subject(`isb-${after}`)))!;
      await expect(
        jwtVerify(token, cached, { issuer: ISSUER, currentDate: new Date(clock.now) }),
        `a token minted ${after} ms after the rotation`,
      ).resolves.toBeDefined();
    }
  });

  it('signs new tokens with the new key; old tokens verify until they expire', async () => {
    const clock = { now: START };
    const { issuer, dir } = issuerAt(clock);
    const old = (await issuer.token('isb1', 'aws', subject()))!;
    const oldKid = decodeProtectedHeader(old).kid;
    const rotated = await rotateKey(dir, clock.now);
    expect(rotated.kid).not.toBe(oldKid);
    expect(rotated.signsFrom).toBeGreaterThanOrEqual(START + PUBLISH_AHEAD_MS);
    // A running issuer publishes the new key within KEY_RECHECK_MS; the old one still signs.
    clock.now += KEY_RECHECK_MS;
    const kids = (await issuer.jwks()).keys.map((k) => k.kid);
    expect(kids).toEqual([rotated.kid, oldKid]);
    expect(decodeProtectedHeader((await issuer.token('isb2', 'aws', subject()))!).kid).toBe(oldKid);
    // From signsFrom on, new tokens carry the new key (the cached one is dropped).
    clock.now = rotated.signsFrom;
    const fresh = (await issuer.token('isb1', 'aws', subject()))!;
    expect(decodeProtectedHeader(fresh).kid).toBe(rotated.kid);
    // The old token still verifies against the JWKS as published now, to its last second.
    await verify(issuer, old, START + TOKEN_LIFETIME_S * 1000 - 1, 'sts.amazonaws.com');
    await verify(issuer, fresh, clock.now, 'sts.amazonaws.com');
    // Once every token it signed has expired, the old key leaves the JWKS...
    clock.now = START + RETIRED_KEY_KEPT_MS + KEY_RECHECK_MS;
    const later = (await issuer.jwks()).keys.map((k) => k.kid);
    expect(later).toEqual([rotated.kid]);
    // ...and the next rotation removes its file.
    const next = await rotateKey(dir, clock.now);
    expect(next.removed).toBe(1);
    expect(readdirSync(path.join(dir, KEY_FOLDER)).sort()).toEqual(
      [`${next.kid}.json`, `${rotated.kid}.json`].sort(),
    );
  });
});
