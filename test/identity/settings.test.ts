/**
 * The identity settings as an operator writes them: the issuer URL every token's `iss` and the
 * discovery document carry (so one spelling only), and the trust domain of `sub`.
 */
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.js';

const load = (flags: Record<string, string>) => loadConfig({ flags, env: {} });

describe('--identity-issuer', () => {
  it.each([
    ['off', undefined],
    ['https://moat.example.com', 'https://moat.example.com'],
    ['https://moat.example.com/', 'https://moat.example.com'],
    ['https://Moat.Example.COM/identity/', 'https://moat.example.com/identity'],
    ['https://moat.example.com:8443', 'https://moat.example.com:8443'],
    ['http://127.0.0.1:3000', 'http://127.0.0.1:3000'],
  ])('takes %s as %s', (text, issuer) => {
    const config = load({ 'identity-issuer': text });
    expect(config.ok && config.value.identityIssuer).toBe(issuer);
  });

  it.each([
    'moat.example.com',
    '',
    'ftp://moat.example.com',
    'file:///etc/passwd',
    'https://user:pass@moat.example.com',
    'https://moat.example.com/?tenant=a',
    'https://moat.example.com/?',
    'https://moat.example.com/#x',
    'javascript:alert(1)',
  ])('refuses %j, naming what it expects', (text) => {
    const config = load({ 'identity-issuer': text });
    expect(config.ok).toBe(false);
    if (!config.ok) expect(config.error).toMatch(/identity-issuer.*expected an https:\/\/ URL/s);
  });
});

describe('--identity-trust-domain', () => {
  it('defaults to the issuer, and takes a lower-case name', () => {
    const none = load({});
    expect(none.ok && [none.value.identityIssuer, none.value.identityTrustDomain]).toEqual([
      undefined,
      undefined,
    ]);
    const named = load({ 'identity-trust-domain': 'prod.example.org' });
    expect(named.ok && named.value.identityTrustDomain).toBe('prod.example.org');
  });

  it.each(['Example.org', 'a/b', 'spiffe://example.org', '', 'a b'])('refuses %j', (text) => {
    const config = load({ 'identity-trust-domain': text });
    expect(config.ok).toBe(false);
  });
});
