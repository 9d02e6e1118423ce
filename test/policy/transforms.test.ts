/**
 * `network.rules` in the policy engine: parsing (every refusal, and that no message ever quotes
 * a header value, which may be a credential) and the lookup a request's host goes through
 * (exact beats wildcard, the longest wildcard wins, never a wildcard's apex, canonical names).
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  canonicalName,
  type CanonicalName,
  canonicalRuleKeys,
  decide,
  destinationRulesFor,
  MAX_SECRETS_PER_RULE,
  parseNetworkConfig,
  type Policy,
} from '../../src/policy/index.js';
import { policyOf } from './helpers.js';

const header = (name: string, value: string) => [{ transform: { headers: { [name]: value } } }];
const withRules = (rules: unknown) => ({ rules });

function name(text: string): CanonicalName {
  const parsed = canonicalName(text);
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.value;
}

/** The rule key that applies to `host`, or undefined. */
const keyFor = (policy: Policy, host: string) => destinationRulesFor(policy, name(host))?.ruleKey;

/** The messages of a configuration that must not parse. */
function problems(config: unknown): string {
  const parsed = parseNetworkConfig(config);
  if (parsed.ok) throw new Error(`expected ${JSON.stringify(config)} to be refused`);
  return parsed.errors.map((e) => e.message).join('; ');
}

describe('destinationRulesFor', () => {
  const policy = policyOf(
    withRules({
      'api.example.com': header('Authorization', 'exact'),
      '*.example.com': header('Authorization', 'wild'),
      '*.deep.example.com': header('Authorization', 'deeper'),
      '*.other.test': header('X-Key', 'other'),
    }),
  );

  it.each([
    ['api.example.com', 'api.example.com'],
    ['API.Example.COM.', 'api.example.com'],
    ['www.example.com', '*.example.com'],
    ['a.b.c.example.com', '*.example.com'],
    ['x.deep.example.com', '*.deep.example.com'],
    ['a.x.deep.example.com', '*.deep.example.com'],
    // The apex of a wildcard is never matched by it: deep.example.com is one below example.com.
    ['deep.example.com', '*.example.com'],
    ['example.com', undefined],
    ['other.test', undefined],
    ['a.other.test', '*.other.test'],
    ['notexample.com', undefined],
    ['example.com.evil.test', undefined],
    ['api.example.com.evil.test', undefined],
  ])('%s -> %s', (host, key) => {
    expect(keyFor(policy, host)).toBe(key);
  });

  it('matches IDN keys and names through the one normaliser', () => {
    const idn = policyOf(withRules({ 'BÜCHER.example': header('X-A', 'v'), '*.Straße.test': [] }));
    expect(keyFor(idn, 'bücher.example')).toBe('xn--bcher-kva.example');
    expect(keyFor(idn, 'xn--bcher-kva.example')).toBe('xn--bcher-kva.example');
    expect(keyFor(idn, 'a.STRASSE.test')).toBe(undefined);
    expect(keyFor(idn, 'a.straße.test')).toBe(`*.${name('straße.test')}`);
  });

  it('does not merge rule sets: the exact key alone applies', () => {
    const transform = destinationRulesFor(policy, name('api.example.com'))!;
    expect(transform.headers).toEqual([{ name: 'Authorization', value: [{ literal: 'exact' }] }]);
  });

  it('grants nothing: allowOut still decides', () => {
    const denied = policyOf({
      allowOut: ['allowed.test'],
      denyOut: ['0.0.0.0/0'],
      rules: { 'secret.test': header('Authorization', 'x') },
    });
    expect(keyFor(denied, 'secret.test')).toBe('secret.test');
    expect(decide(denied, { host: name('secret.test'), port: 443 }).verdict).toBe('deny');
  });

  it('agrees with a reference model on random names (exact, then longest wildcard, never apex)', () => {
    const label = fc.constantFrom('a', 'b', 'c');
    const host = fc.array(label, { minLength: 1, maxLength: 5 }).map((l) => l.join('.'));
    const key = fc.tuple(fc.boolean(), host).map(([wild, h]) => (wild ? `*.${h}` : h));
    fc.assert(
      fc.property(fc.uniqueArray(key, { maxLength: 8 }), host, (keys, target) => {
        const compiled = policyOf(withRules(Object.fromEntries(keys.map((k) => [k, []]))));
        const exact = keys.find((k) => k === target);
        const wild = keys
          .filter((k) => k.startsWith('*.') && target.endsWith(`.${k.slice(2)}`))
          .sort((a, b) => b.length - a.length)[0];
        expect(keyFor(compiled, target)).toBe(exact ?? wild);
      }),
      { numRuns: 500 },
    );
  });
});

describe('parsing network.rules', () => {
  it('splits values into literals and secrets, names lower-cased', () => {
    const parsed = parseNetworkConfig(
      withRules({
        'api.test': [
          {
            transform: {
              headers: {
                Authorization: 'Bearer ${e2b.secrets.Token}',
                'X-Two': '${e2b.secrets.a}-${e2b.secrets.b_2}',
              },
            },
          },
          { transform: {} },
        ],
      }),
    );
    expect(parsed.ok).toBe(true);
    if (!parsed.ok) return;
    expect(parsed.value.transforms.map(({ ruleKey, headers }) => ({ ruleKey, headers }))).toEqual([
      {
        ruleKey: 'api.test',
        headers: [
          { name: 'Authorization', value: [{ literal: 'Bearer ' }, { secret: 'token' }] },
          { name: 'X-Two', value: [{ secret: 'a' }, { literal: '-' }, { secret: 'b_2' }] },
        ],
      },
    ]);
  });

  it('stores keys canonical and values as written', () => {
    expect(
      canonicalRuleKeys({ 'API.Test.': header('A', '${e2b.secrets.X}'), '*.B.test': [] }),
    ).toEqual({ 'api.test': header('A', '${e2b.secrets.X}'), '*.b.test': [] });
  });

  it.each([
    ['bare *', { '*': [] }, /bare "\*" is not a key/],
    ['* inside', { 'a.*.test': [] }, /"\*" may only be the whole first label/],
    ['two wildcards', { '*.*.test': [] }, /"\*" may only be the whole first label/],
    ['empty wildcard', { '*.': [] }, /invalid rule key/],
    ['apex only', { '*.': [] }, /is empty|empty label/],
    ['IP literal', { '1.2.3.4': [] }, /ends in a number/],
    ['IPv6 literal', { '::1': [] }, /not a letter/],
    ['URL', { 'https://a.test/': [] }, /not a letter/],
    ['same key twice', { 'A.test': [], 'a.test.': [] }, /both name a\.test/],
    ['not an array', { 'a.test': {} }, /takes an array of rules/],
    ['rule not an object', { 'a.test': ['x'] }, /rule 0 must be an object/],
    ['unknown rule field', { 'a.test': [{ allow: true }] }, /unknown field "allow"/],
    [
      'unknown transform field',
      { 'a.test': [{ transform: { body: 'x' } }] },
      /unknown field "body"/,
    ],
    [
      'header name with a space',
      { 'a.test': header('X Key', 'v') },
      /"X Key" is not an HTTP header name/,
    ],
    ['header name with a colon', { 'a.test': header('X:Key', 'v') }, /not an HTTP header name/],
    ['empty header name', { 'a.test': header('', 'v') }, /not an HTTP header name/],
    ['Host', { 'a.test': header('Host', 'evil.test') }, /names its destination/],
    ['Content-Length', { 'a.test': header('content-length', '0') }, /frames the request/],
    [
      'Transfer-Encoding',
      { 'a.test': header('Transfer-Encoding', 'chunked') },
      /frames the request/,
    ],
    ['non-string value', { 'a.test': [{ transform: { headers: { A: 1 } } }] }, /string value/],
    ['CR LF', { 'a.test': header('A', 'x\r\nInjected: 1') }, /control character/],
    ['NUL', { 'a.test': header('A', 'x\u0000') }, /control character/],
    ['long value', { 'a.test': header('A', 'x'.repeat(9000)) }, /longer than 8192/],
    [
      'unclosed placeholder',
      { 'a.test': header('A', 'Bearer ${e2b.secrets.x') },
      /character 8 .* does not begin a placeholder/,
    ],
    ['unknown namespace', { 'a.test': header('A', '${env.HOME}') }, /does not begin a placeholder/],
    [
      'bad secret name',
      { 'a.test': header('A', '${e2b.secrets.a.b}') },
      /does not begin a placeholder/,
    ],
    [
      'empty secret name',
      { 'a.test': header('A', '${e2b.secrets.}') },
      /does not begin a placeholder/,
    ],
    [
      'empty identity token name',
      { 'a.test': header('A', '${e2b.identity.tokens.}') },
      /character 1 of the value names no identity token/,
    ],
    [
      'identity token name that opens another placeholder',
      { 'a.test': header('A', 'x${e2b.identity.tokens.a${e2b.secrets.b}') },
      /character 2 of the value names no identity token/,
    ],
    [
      'unclosed identity placeholder',
      { 'a.test': header('A', '${e2b.identity.tokens.aws') },
      /does not begin a placeholder/,
    ],
    ['rules not an object', [], /rules must be an object/],
  ])('refuses %s', (_what, rules, message) => {
    const text = problems(withRules(rules));
    expect(text).toMatch(message);
  });

  it('reads identity token placeholders as their own parts, names kept as written', () => {
    const policy = policyOf(
      withRules({
        'sts.test': header('Authorization', 'Bearer ${e2b.identity.tokens.AWS-prod.1}!'),
      }),
    );
    expect(destinationRulesFor(policy, name('sts.test'))!.headers).toEqual([
      {
        name: 'Authorization',
        value: [{ literal: 'Bearer ' }, { identity: 'AWS-prod.1' }, { literal: '!' }],
      },
    ]);
  });

  it('names the rule key and header in every refusal of a value', () => {
    expect(problems(withRules({ 'api.test': header('Authorization', 'a\nb') }))).toMatch(
      /api\.test .*header "Authorization"/,
    );
  });

  it(`allows ${MAX_SECRETS_PER_RULE} distinct secrets per key, not one more`, () => {
    const headers = (n: number) =>
      Object.fromEntries(
        Array.from({ length: n }, (_, i) => [
          `X-${i}`,
          `\${e2b.secrets.s${i}}\${e2b.secrets.s${i}}`,
        ]),
      );
    expect(
      parseNetworkConfig(withRules({ 'a.test': [{ transform: { headers: headers(32) } }] })).ok,
    ).toBe(true);
    expect(problems(withRules({ 'a.test': [{ transform: { headers: headers(33) } }] }))).toMatch(
      /name 33 secrets; the limit is 32/,
    );
  });

  it('never quotes a value in any message (random secret-looking values)', () => {
    const secretLike = fc
      .tuple(
        fc.constantFrom('sk-live-', 'ghp_', 'AKIA', 'xoxb-', ''),
        fc.stringMatching(/^[A-Za-z0-9]{12,40}$/),
      )
      .map(([prefix, body]) => prefix + body);
    // Each breaks one rule: a control character, a malformed placeholder, or the length.
    const breaker = fc.constantFrom(
      '\r\n',
      '\u0000',
      '${',
      '${e2b.secrets.',
      '${x}',
      'x'.repeat(8200),
    );
    fc.assert(
      fc.property(secretLike, breaker, fc.boolean(), (secret, bad, before) => {
        const value = before ? `${bad}${secret}` : `Bearer ${secret}${bad}`;
        const text = problems(withRules({ 'api.test': header('Authorization', value) }));
        expect(text).toMatch(/api\.test/);
        expect(text).not.toContain(secret);
        expect(text).not.toContain(secret.slice(0, 8));
      }),
      { numRuns: 300 },
    );
  });
});
