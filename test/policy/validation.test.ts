/**
 * Validation of a network configuration: wire-compat.md "Egress validation messages" and the
 * entry rules of design.md. Messages begin with the reference service's text, written out here.
 */
import { describe, expect, test } from 'vitest';
import {
  DEFAULT_MAX_ENTRIES,
  type PolicyProblem,
  parseNetworkConfig,
} from '../../src/policy/index.js';
import { decideText, denyBy, policyOf } from './helpers.js';

/** wire-compat.md, verbatim. */
const ALL_TRAFFIC_TEXT =
  "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.";

function errorsOf(config: unknown): PolicyProblem[] {
  const parsed = parseNetworkConfig(config);
  if (parsed.ok) throw new Error(`expected ${JSON.stringify(config)} to be rejected`);
  return parsed.errors;
}

/** True when `message` is `expected`, optionally followed by more detail after a space. */
const begins = (message: string, expected: string) =>
  message === expected || message.startsWith(`${expected} `);

describe('denyOut: `invalid denied CIDR <entry>`', () => {
  test.each([
    ['"*"', '*'],
    ['a bad name', 'a..example.com'],
    ['a wildcard inside a name', 'a.*.example.com'],
    ['the unspecified IPv4 address', '0.0.0.0'],
    ['the unspecified IPv4 address as /32', '0.0.0.0/32'],
    ['0.0.0.0/8', '0.0.0.0/8'],
    ['0.0.0.0/1', '0.0.0.0/1'],
    ['the unspecified IPv6 address', '::'],
    ['the unspecified IPv6 address as /128', '::/128'],
    ['::/64', '::/64'],
    ['::/1', '::/1'],
    ['long unspecified IPv6', '0:0:0:0:0:0:0:0'],
    ['mapped unspecified address', '::ffff:0.0.0.0'],
    ['prefix too long (IPv4)', '8.8.8.8/33'],
    ['prefix too long (IPv6)', '2606::/129'],
    ['prefix with a leading zero', '8.8.8.0/024'],
    ['0.0.0.0/00', '0.0.0.0/00'],
    ['negative prefix', '8.8.8.8/-1'],
    ['empty prefix', '8.8.8.8/'],
    ['two prefixes', '8.8.8.8/24/24'],
    ['octet out of range', '256.1.1.1'],
    ['octal octet', '010.0.0.1'],
    ['three octets', '8.8.8'],
    ['five octets', '8.8.8.8.8'],
    ['decimal integer IPv4', '134744072'],
    ['hex IPv4', '0x08080808'],
    ['short IPv4', '8.8'],
    ['zone ID', 'fe80::1%eth0'],
    ['zone ID with prefix', 'fe80::1%eth0/64'],
    ['brackets', '[2606:4700::1]'],
    ['two "::"', '2606::4700::1'],
    ['nine groups', '1:2:3:4:5:6:7:8:9'],
    ['white space', ' 8.8.8.8'],
    ['empty string', ''],
  ])('%s (%j)', (_, entry) => {
    const errors = errorsOf({ denyOut: ['1.1.1.1', entry] });
    expect(errors).toHaveLength(1);
    expect(errors[0]!.at).toBe('denyOut[1]');
    expect(begins(errors[0]!.message, `invalid denied CIDR ${entry}`), errors[0]!.message).toBe(
      true,
    );
  });

  test.each([
    '0.0.0.0/0',
    '::/0',
    '8.8.8.8',
    '8.8.8.0/24',
    '2606:4700::/32',
    '2606:4700::1111',
    '::ffff:8.8.8.8',
  ])('accepts %j', (entry) => {
    expect(parseNetworkConfig({ denyOut: [entry] }).ok).toBe(true);
  });

  test('ALL_TRAFFIC written as a word is the entry 0.0.0.0/0 (the SDK constant), IPv6 too', () => {
    const policy = policyOf({ denyOut: ['ALL_TRAFFIC'] });
    expect(policy.rules.denyAll).toBe(true);
    expect(policy.rules.denyOut[0]!.entry).toBe('0.0.0.0/0');
    expect(decideText(policy, { ip: '2606:4700::1111' }).verdict).toBe('deny');
    // Allowing it is allowing the unspecified network: refused as 0.0.0.0/0 is.
    const [problem] = errorsOf({ allowOut: ['ALL_TRAFFIC'] });
    expect(begins(problem!.message, 'invalid allowed address ALL_TRAFFIC')).toBe(true);
  });

  test('0.0.0.0/0 is ALL_TRAFFIC; ::/0 is not', () => {
    expect(policyOf({ denyOut: ['0.0.0.0/0'] }).rules.denyAll).toBe(true);
    expect(policyOf({ denyOut: ['::/0'] }).rules.denyAll).toBe(false);
  });

  test.each(['::ffff:0.0.0.0/96', '::ffff:0:0/96', '0:0:0:0:0:ffff:0:0/96'])(
    'an IPv4-mapped spelling of 0.0.0.0/0 (%j) is rejected, or is ALL_TRAFFIC with IPv6 denied',
    (entry) => {
      // wire-compat.md: an unspecified address other than 0.0.0.0/0 is `invalid denied CIDR`.
      // Accepting it as "all IPv4 but not IPv6" would reopen the IPv6 escape ALL_TRAFFIC closes.
      const parsed = parseNetworkConfig({ denyOut: [entry] });
      if (!parsed.ok) {
        expect(begins(parsed.errors[0]!.message, `invalid denied CIDR ${entry}`)).toBe(true);
        return;
      }
      expect(parsed.value.denyAll).toBe(true);
      expect(decideText(policyOf({ denyOut: [entry] }), { ip: '2606:4700::1111' }).verdict).toBe(
        'deny',
      );
    },
  );
});

describe('allowOut addresses: `invalid allowed address <entry>`', () => {
  test.each([
    ['0.0.0.0'],
    ['0.0.0.0/32'],
    ['0.0.0.0/8'],
    ['0.0.0.0/0'],
    ['::'],
    ['::/0'],
    ['::/128'],
    ['::/96'],
    ['0:0:0:0:0:0:0:0'],
    ['::ffff:0.0.0.0'],
    ['::ffff:0:0/96'],
  ])('unspecified: %j', (entry) => {
    const errors = errorsOf({ allowOut: [entry] });
    expect(errors).toHaveLength(1);
    expect(errors[0]!.at).toBe('allowOut[0]');
    expect(begins(errors[0]!.message, `invalid allowed address ${entry}`), errors[0]!.message).toBe(
      true,
    );
  });

  test.each([
    '8.8.8.8/33',
    '2606::/129',
    '8.8.8.0/024',
    '256.1.1.1',
    '010.0.0.1',
    '8.8.8',
    '134744072',
    '8.8.8.8.8',
    'fe80::1%eth0',
    '2606::4700::1',
    '[2606:4700::1]',
    '8.8.8.8/',
  ])('malformed address %j is rejected at its index', (entry) => {
    const errors = errorsOf({ allowOut: ['1.1.1.1', entry] });
    expect(errors.map((e) => e.at)).toEqual(['allowOut[1]']);
    expect(errors[0]!.message).toContain(entry);
  });

  test.each([
    '8.8.8.8',
    '8.8.8.0/24',
    '1.2.3.4/8',
    '2606:4700::/32',
    '::1',
    '::ffff:8.8.8.8',
    '0.0.0.1',
  ])('accepts %j (without ALL_TRAFFIC: addresses need no deny-all)', (entry) => {
    expect(parseNetworkConfig({ allowOut: [entry] }).ok).toBe(true);
  });
});

describe('a domain in allowOut needs ALL_TRAFFIC', () => {
  test.each<[string, unknown]>([
    ['no denyOut', { allowOut: ['example.com'] }],
    ['denyOut without 0.0.0.0/0', { allowOut: ['example.com'], denyOut: ['8.8.8.8'] }],
    ['::/0 is not ALL_TRAFFIC', { allowOut: ['example.com'], denyOut: ['::/0'] }],
    ['allow_internet_access true', { allowOut: ['example.com'], allow_internet_access: true }],
    ['a wildcard', { allowOut: ['8.8.8.8', '*.example.com'] }],
  ])('%s', (_, config) => {
    const errors = errorsOf(config);
    expect(errors).toHaveLength(1);
    expect(begins(errors[0]!.message, ALL_TRAFFIC_TEXT), errors[0]!.message).toBe(true);
  });

  test('the message names the first domain entry', () => {
    const errors = errorsOf({ allowOut: ['8.8.8.8', 'a.example.com', 'b.example.com'] });
    expect(errors).toHaveLength(1);
    expect(errors[0]!.at).toBe('allowOut[1]');
  });

  test.each<[string, unknown]>([
    ['0.0.0.0/0', { allowOut: ['example.com'], denyOut: ['0.0.0.0/0'] }],
    [
      '0.0.0.0/0 among others',
      { allowOut: ['*.example.com'], denyOut: ['8.8.8.8', '0.0.0.0/0', '::/0'] },
    ],
    ['allow_internet_access false', { allowOut: ['example.com'], allow_internet_access: false }],
  ])('accepted with %s', (_, config) => {
    expect(parseNetworkConfig(config).ok).toBe(true);
  });
});

describe('allowOut domains: canonical form only (design.md)', () => {
  const withAll = (entry: string) => ({ allowOut: [entry], denyOut: ['0.0.0.0/0'] });
  test.each([
    ['empty label', 'a..example.com'],
    ['leading dot', '.example.com'],
    ['two trailing dots', 'example.com..'],
    ['only a dot', '.'],
    ['label over 63', `${'a'.repeat(64)}.com`],
    ['name over 253', `${'abcdefghi.'.repeat(25)}comx`],
    ['space', 'exa mple.com'],
    ['slash', 'example.com/path'],
    ['backslash', 'example.com\\'],
    ['at sign', 'user@example.com'],
    ['empty port', 'example.com:'],
    ['percent', 'ex%61mple.com'],
    ['NUL', 'example.com\u0000'],
    ['leading hyphen', '-example.com'],
    ['trailing hyphen', 'example-.com'],
    ['"*" inside a label', 'a*.example.com'],
    ['"*" not the first label', 'a.*.example.com'],
    ['two wildcards', '*.*.example.com'],
    ['"**"', '**.example.com'],
    ['"*" glued to a label', '*example.com'],
    ['wildcard with nothing after', '*.'],
    ['wildcard with an empty label', '*..example.com'],
    ['numeric last label (IPv4 spelling)', '127.1'],
    ['hex last label', '0x7f.1'],
    ['decimal IPv4', '2130706433'],
    ['scheme', 'https://example.com'],
  ])('%s (%j)', (_, entry) => {
    const errors = errorsOf(withAll(entry));
    expect(errors.map((e) => e.at)).toEqual(['allowOut[0]']);
    expect(errors[0]!.message).toContain(entry);
  });

  test.each([
    ['a 63-character label', `${'a'.repeat(63)}.com`],
    ['a 253-character name', `${'abcdefghi.'.repeat(24)}abcdefghi.com`],
    ['a 253-character name with a trailing dot', `${'abcdefghi.'.repeat(24)}abcdefghi.com.`],
    ['underscore', '_dmarc.example.com'],
    ['digits and hyphens', 'a-1.b2.example.com'],
    ['IDN', 'bücher.example'],
    ['A-label', 'xn--bcher-kva.example'],
    ['upper case', 'EXAMPLE.COM'],
    ['one trailing dot', 'example.com.'],
    ['a wildcard on a TLD', '*.com'],
  ])('accepts %s', (_, entry) => {
    expect(entry.replace(/\.$/, '').length).toBeLessThanOrEqual(253);
    expect(parseNetworkConfig(withAll(entry)).ok).toBe(true);
  });
});

describe('configuration shape', () => {
  test('{} clears every rule', () => {
    const policy = policyOf({});
    expect(policy.rules.allowOut).toEqual([]);
    expect(policy.rules.denyOut).toEqual([]);
    expect(policy.rules.denyAll).toBe(false);
  });

  test.each<[string, unknown, string[]]>([
    ['not an object', 'allowOut', ['config']],
    ['an array', [], ['config']],
    ['null', null, ['config']],
    ['allowOut not an array', { allowOut: 'example.com' }, ['allowOut']],
    ['denyOut not an array', { denyOut: '0.0.0.0/0' }, ['denyOut']],
    ['non-string entry', { denyOut: ['8.8.8.8', 8] }, ['denyOut[1]']],
    [
      'allow_internet_access a string',
      { allow_internet_access: 'false' },
      ['allow_internet_access'],
    ],
    ['unknown field', { allowout: ['8.8.8.8'] }, ['allowout']],
  ])('%s', (_, config, at) => {
    expect(errorsOf(config).map((e) => e.at)).toEqual(at);
  });

  test('every problem is reported, each at its entry', () => {
    const errors = errorsOf({
      allowOut: ['0.0.0.0', 'example.com', 'a..b'],
      denyOut: ['example..org', '8.8.8.8'],
    });
    const byPlace = new Map(errors.map((e) => [e.at, e.message]));
    expect(begins(byPlace.get('allowOut[0]') ?? '', 'invalid allowed address 0.0.0.0')).toBe(true);
    expect(byPlace.get('allowOut[2]')).toContain('a..b');
    expect(begins(byPlace.get('denyOut[0]') ?? '', 'invalid denied CIDR example..org')).toBe(true);
    expect(begins(byPlace.get('allowOut[1]') ?? '', ALL_TRAFFIC_TEXT)).toBe(true);
    expect(byPlace.has('denyOut[1]')).toBe(false);
  });

  test('a list cap is stated and enforced', () => {
    const entries = (n: number) =>
      Array.from({ length: n }, (_, i) => `8.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`);
    expect(parseNetworkConfig({ denyOut: entries(3) }, { maxEntries: 3 }).ok).toBe(true);
    const errors = parseNetworkConfig({ denyOut: entries(4) }, { maxEntries: 3 });
    expect(errors.ok).toBe(false);
    if (!errors.ok) {
      expect(errors.errors[0]!.at).toBe('denyOut');
      expect(errors.errors[0]!.message).toMatch(/\b3\b/);
    }
    // The stated default cap is the one enforced.
    expect(DEFAULT_MAX_ENTRIES).toBeGreaterThanOrEqual(1000);
    expect(parseNetworkConfig({ denyOut: entries(DEFAULT_MAX_ENTRIES) }).ok).toBe(true);
    expect(parseNetworkConfig({ denyOut: entries(DEFAULT_MAX_ENTRIES + 1) }).ok).toBe(false);
  });

  test('canonical rules keep each entry as written', () => {
    const policy = policyOf({ allowOut: ['EXAMPLE.com.', '8.8.8.8/24'], denyOut: ['0.0.0.0/0'] });
    expect(policy.rules.allowOut.map((r) => r.entry)).toEqual(['EXAMPLE.com.', '8.8.8.8/24']);
    expect(decideText(policy, { host: 'other.example' })).toEqual(denyBy('0.0.0.0/0'));
  });
});
