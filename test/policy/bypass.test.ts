/**
 * Bypass classes: spellings that make two parsers disagree about a destination. For each class
 * the engine must either refuse the text or decide exactly what a client would dial.
 */
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import {
  decide,
  parseAuthority,
  parseDestination,
  parseIP,
  parseNetworkConfig,
  parsePort,
} from '../../src/policy/index.js';
import {
  ALLOW_DEFAULT,
  allowBy,
  DENY_INVALID,
  decideText,
  denyBy,
  destinationOf,
  internalBy,
  outcome,
  policyOf,
} from './helpers.js';
import { refKey } from './reference.js';

const denyAllWith = (...allowOut: string[]) => policyOf({ allowOut, denyOut: ['0.0.0.0/0'] });

/** The text must be refused, or be exactly the address `ip` (never a host name). */
function refusedOrAddress(text: string, ip: string): void {
  const parsed = parseDestination(text);
  if (!parsed.ok) return;
  expect(parsed.value.host, `${text} parsed as a host name`).toBeUndefined();
  expect(parsed.value.ip, `${text} has no address`).toBeDefined();
  expect(refKey(parsed.value.ip!.text)).toBe(refKey(ip));
}

/** The text must be refused, or be exactly the host name `name`. */
function refusedOrName(text: string, name: string): void {
  const parsed = parseDestination(text);
  if (!parsed.ok) return;
  expect(parsed.value.ip).toBeUndefined();
  expect(parsed.value.host).toBe(name);
}

const refused = (text: string) => {
  const parsed = parseDestination(text);
  expect(parsed.ok, `${text} -> ${JSON.stringify(parsed)}`).toBe(false);
};

describe('alternate IPv4 spellings are never host names (127.0.0.1)', () => {
  const spellings = [
    '2130706433',
    '0x7f000001',
    '0X7F000001',
    '0x7f.1',
    '0x7F.0.0.1',
    '0x7f.0x0.0x0.0x1',
    '0177.0.0.1',
    '0177.1',
    '017700000001',
    '127.1',
    '127.0.1',
    '127.000.000.001',
    '127.0.0.01',
    '127.0.0.0x1',
    '127.0.0.1.',
    '１２７.０.０.１',
    '１２７．０．０．１',
    '127。0。0。1',
    '127｡0｡0｡1',
    '０x7f.1',
    '0x7f.１',
  ];
  test.each(spellings)('%s', (text) => {
    for (const form of [text, `${text}:80`, `http://${text}/`, `https://${text}:8443/x`]) {
      refusedOrAddress(form, '127.0.0.1');
    }
  });

  test.each(spellings)('%s is refused as an allowOut or denyOut entry', (text) => {
    expect(parseNetworkConfig({ allowOut: [text], denyOut: ['0.0.0.0/0'] }).ok).toBe(false);
    expect(parseNetworkConfig({ denyOut: [text] }).ok).toBe(false);
  });

  test('a wildcard cannot be made to cover a numeric spelling', () => {
    // A wildcard over a numeric last label would cover IPv4 spellings such as 127.1.
    for (const entry of ['*.1', '*.0.0.1', '*.0x1']) {
      expect(parseNetworkConfig({ allowOut: [entry], denyOut: ['0.0.0.0/0'] }).ok).toBe(false);
    }
  });

  test('numeric labels that are not last are ordinary names', () => {
    const policy = denyAllWith('*.example.com');
    expect(decideText(policy, { host: '127.1.example.com' })).toEqual(allowBy('*.example.com'));
    expect(decideText(policy, { host: '0x7f.example.com' })).toEqual(allowBy('*.example.com'));
  });

  test('the dotted quad itself is an address, and internal', () => {
    expect(decideText(policyOf({}), { ip: '127.0.0.1' })).toEqual(internalBy('127.0.0.0/8'));
  });
});

describe('IPv4-mapped and IPv4-compatible IPv6', () => {
  test.each([
    '::ffff:127.0.0.1',
    '::FFFF:127.0.0.1',
    '::ffff:7f00:1',
    '0:0:0:0:0:ffff:7f00:1',
    '0000:0000:0000:0000:0000:ffff:7f00:0001',
    '0:0:0:0:0:FFFF:127.0.0.1',
    '::0:ffff:7f00:1',
  ])('%s is looked up as IPv4 127.0.0.1', (text) => {
    const ip = parseIP(text);
    expect(ip.ok).toBe(true);
    if (ip.ok) {
      expect(ip.value.version).toBe(4);
      expect(ip.value.text).toBe('127.0.0.1');
    }
    const policy = policyOf({});
    expect(decideText(policy, { ip: text })).toEqual(internalBy('127.0.0.0/8'));
    expect(decideText(policy, { ip: `[${text}]:443` })).toEqual(internalBy('127.0.0.0/8'));
    expect(outcome(decide(policy, destinationOf({ ip: `[${text}]` })))).toEqual(
      internalBy('127.0.0.0/8'),
    );
  });

  test('mapped metadata address is internal', () => {
    expect(decideText(policyOf({}), { ip: '[::ffff:169.254.169.254]:80' })).toEqual(
      internalBy('169.254.0.0/16'),
    );
    expect(decideText(policyOf({}), { ip: '::ffff:a9fe:a9fe' })).toEqual(
      internalBy('169.254.0.0/16'),
    );
  });

  test('IPv4 rules apply to mapped destinations', () => {
    const allow = denyAllWith('8.8.8.8');
    expect(decideText(allow, { ip: '::ffff:8.8.8.8' })).toEqual(allowBy('8.8.8.8'));
    expect(decideText(allow, { ip: '::ffff:808:808' })).toEqual(allowBy('8.8.8.8'));
    expect(decideText(allow, { ip: '::ffff:8.8.8.9' })).toEqual(denyBy('0.0.0.0/0'));
    const deny = policyOf({ denyOut: ['8.8.8.0/24'] });
    expect(decideText(deny, { ip: '::ffff:8.8.8.8' })).toEqual(denyBy('8.8.8.0/24'));
    expect(decideText(deny, { ip: '[::ffff:808:8ff]' })).toEqual(denyBy('8.8.8.0/24'));
  });

  test('mapped rules are IPv4 rules', () => {
    const deny = policyOf({ denyOut: ['::ffff:8.8.8.0/120'] });
    expect(decideText(deny, { ip: '8.8.8.8' })).toEqual(denyBy('::ffff:8.8.8.0/120'));
    expect(decideText(deny, { ip: '8.8.9.8' })).toEqual(ALLOW_DEFAULT);
  });

  test.each(['::127.0.0.1', '::7f00:1', '0:0:0:0:0:0:127.0.0.1', '::169.254.169.254', '::8.8.8.8'])(
    'IPv4-compatible %s is IPv6, and internal',
    (text) => {
      const ip = parseIP(text);
      expect(ip.ok).toBe(true);
      if (ip.ok) expect(ip.value.version).toBe(6);
      const policy = denyAllWith('8.8.8.8', '127.0.0.0/8', 'example.com');
      const result = decideText(policy, { ip: text });
      expect(result.verdict).toBe('deny');
      expect(result.list).toBe('internal');
      expect(decideText(policy, { host: 'example.com', ip: text }).list).toBe('internal');
    },
  );

  test('NAT64 and 6to4 embeddings of internal IPv4 addresses are internal', () => {
    for (const text of [
      '64:ff9b::127.0.0.1',
      '64:ff9b::a9fe:a9fe',
      '2002:7f00:1::',
      '2002:a9fe:a9fe::1',
    ]) {
      expect(decideText(policyOf({}), { ip: text }).list).toBe('internal');
    }
  });

  test.each([
    '::ffff:127.0.0.01',
    '::ffff:127.1',
    '::ffff:0x7f.0.0.1',
    '::ffff:2130706433',
    '::ffff:127.0.0.1.',
    '::ffff:１２７.0.0.1',
    '::ffff:127.0.0.1:80',
    '::ffff:256.0.0.1',
    '::ffff:127.0.0',
    '1.2.3.4::',
    '::ffff:1.2.3.4:5:6',
    '[::ffff:127.0.0.1',
    '::ffff:127.0.0.1]',
  ])('malformed %s is refused', (text) => {
    expect(parseIP(text).ok).toBe(false);
    refused(text);
    refused(`[${text}]:443`);
  });
});

describe('trailing dot', () => {
  const policy = denyAllWith('example.com', '*.example.org');
  test.each<[string, ReturnType<typeof outcome>]>([
    ['example.com.', allowBy('example.com')],
    ['a.example.org.', allowBy('*.example.org')],
    ['example.org.', denyBy('0.0.0.0/0')],
    ['notexample.com.', denyBy('0.0.0.0/0')],
  ])('%s', (host, expected) => {
    expect(decideText(policy, { host })).toEqual(expected);
    expect(decideText(policy, { host: `${host}:443` })).toEqual(expected);
  });

  test.each(['example.com..', 'example.com...', '.', '..', 'example.com.:443.', '.example.com'])(
    '%s is refused',
    (text) => {
      refused(text);
    },
  );

  test('a rule with one trailing dot is the same rule', () => {
    expect(decideText(denyAllWith('example.com.'), { host: 'example.com' })).toEqual(
      allowBy('example.com.'),
    );
    expect(decideText(denyAllWith('*.example.com.'), { host: 'a.example.com.' })).toEqual(
      allowBy('*.example.com.'),
    );
  });

  test('a full-width trailing dot is refused or dropped', () => {
    refusedOrName('example.com．', 'example.com');
    refusedOrName('example.com。', 'example.com');
  });
});

describe('case', () => {
  const policy = denyAllWith('example.com', '*.example.org');
  test.each<[string, ReturnType<typeof outcome>]>([
    ['EXAMPLE.COM', allowBy('example.com')],
    ['Example.Com', allowBy('example.com')],
    ['A.EXAMPLE.ORG', allowBy('*.example.org')],
    ['EXAMPLE.ORG', denyBy('0.0.0.0/0')],
  ])('%s', (host, expected) => {
    expect(decideText(policy, { host })).toEqual(expected);
  });

  test('rules in any case match lower-case destinations', () => {
    expect(decideText(denyAllWith('EXAMPLE.COM'), { host: 'example.com' })).toEqual(
      allowBy('EXAMPLE.COM'),
    );
    expect(decideText(denyAllWith('*.EXAMPLE.COM'), { host: 'a.example.com' })).toEqual(
      allowBy('*.EXAMPLE.COM'),
    );
  });

  test('Unicode case folding is refused or lands on the folded name', () => {
    // U+212A KELVIN SIGN folds to "k" under UTS #46.
    refusedOrName('\u212Aey.com', 'key.com');
    // U+0130 LATIN CAPITAL LETTER I WITH DOT ABOVE does not fold to ASCII "i".
    const dotted = parseDestination('\u0130bm.com');
    if (dotted.ok) expect(dotted.value.host).not.toBe('ibm.com');
  });
});

describe('IDN and full-width characters', () => {
  test('U-labels and A-labels are one name', () => {
    const policy = denyAllWith('bücher.example');
    for (const host of [
      'bücher.example',
      'BÜCHER.EXAMPLE',
      'xn--bcher-kva.example',
      'XN--BCHER-KVA.example',
    ]) {
      expect(decideText(policy, { host })).toEqual(allowBy('bücher.example'));
    }
    const byALabel = denyAllWith('xn--bcher-kva.example');
    expect(decideText(byALabel, { host: 'bücher.example' })).toEqual(
      allowBy('xn--bcher-kva.example'),
    );
  });

  test('a look-alike name is a different name', () => {
    const policy = denyAllWith('apple.com', '*.example.com');
    // Cyrillic а (U+0430) and е (U+0435).
    expect(decideText(policy, { host: '\u0430pple.com' })).toEqual(denyBy('0.0.0.0/0'));
    expect(decideText(policy, { host: 'www.\u0435xample.com' })).toEqual(denyBy('0.0.0.0/0'));
    const parsed = parseDestination('\u0430pple.com');
    expect(parsed.ok && parsed.value.host?.startsWith('xn--')).toBe(true);
  });

  test.each([
    ['full-width letters', 'ｅｘａｍｐｌｅ.com'],
    ['full-width letters and dot', 'ｅｘａｍｐｌｅ．ｃｏｍ'],
    ['ideographic full stop', 'example。com'],
    ['half-width ideographic full stop', 'example｡com'],
    ['full-width capitals', 'ＥＸＡＭＰＬＥ.COM'],
    ['soft hyphen', 'exam\u00ADple.com'],
    ['zero-width joiner', 'exam\u200Dple.com'],
    ['zero-width space', 'exam\u200Bple.com'],
  ])('%s: refused or exactly example.com', (_, text) => {
    refusedOrName(text, 'example.com');
    // And never allowed by a rule for some other name.
    const result = parseDestination(text);
    if (result.ok)
      expect(decideText(denyAllWith('example.com'), { host: text })).toEqual(
        allowBy('example.com'),
      );
  });

  test.each([
    ['full-width percent', 'ex％61mple.com'],
    ['full-width solidus', 'evil.net／example.com'],
    ['full-width commercial at', 'example.com＠evil.net'],
    ['full-width colon', 'example.com：443'],
    ['full-width question mark', 'evil.net？.example.com'],
    ['full-width number sign', 'evil.net＃.example.com'],
    ['full-width reverse solidus', 'evil.net＼example.com'],
    ['small commercial at', 'example.com\uFE6Bevil.net'],
  ])('%s is refused', (_, text) => {
    refused(text);
  });

  test('a full-width rule, if accepted, is the ASCII rule', () => {
    const parsed = parseNetworkConfig({ allowOut: ['ｅｘａｍｐｌｅ.com'], denyOut: ['0.0.0.0/0'] });
    if (parsed.ok) {
      const policy = policyOf({ allowOut: ['ｅｘａｍｐｌｅ.com'], denyOut: ['0.0.0.0/0'] });
      expect(decideText(policy, { host: 'example.com' })).toEqual(allowBy('ｅｘａｍｐｌｅ.com'));
    }
  });

  test('non-LDH ASCII is refused', () => {
    for (const text of [
      'exa mple.com',
      'exa\tmple.com',
      'example.com\u0000',
      'exa"mple.com',
      'exa<mple.com',
      'exa|mple.com',
      'exa^mple.com',
      'example.com\\',
    ]) {
      refused(text);
    }
  });
});

describe('label-boundary wildcards', () => {
  const policy = denyAllWith('*.example.com', 'example.com');
  test.each([
    'notexample.com',
    'wwwexample.com',
    'evil-example.com',
    'example.com.evil.net',
    'www.example.com.evil.net',
    'example.comevil.net',
    'example.co',
    'xample.com',
    'com',
  ])('%s is not covered', (host) => {
    expect(decideText(policy, { host })).toEqual(denyBy('0.0.0.0/0'));
  });

  test.each(['www.example.com', 'a.b.c.example.com', 'example.com'])('%s is covered', (host) => {
    expect(decideText(policy, { host }).verdict).toBe('allow');
  });

  test.each([
    'http://evil.net/.example.com',
    'http://evil.net?.example.com',
    'http://evil.net#.example.com',
    'http://evil.net/www.example.com/',
  ])('the host of %s is evil.net', (text) => {
    const parsed = parseDestination(text);
    expect(parsed.ok).toBe(true);
    if (parsed.ok) {
      expect(parsed.value.host).toBe('evil.net');
      expect(outcome(decide(policy, parsed.value))).toEqual(denyBy('0.0.0.0/0'));
    }
  });

  test.each([
    'evil.net\\.example.com',
    'evil.net;.example.com',
    'evil.net,.example.com',
    'http://evil.net\\.example.com/',
  ])('%s is refused', (text) => {
    refused(text);
  });
});

describe('empty labels', () => {
  test.each([
    '.example.com',
    'a..example.com',
    'example..com',
    '..',
    '.',
    '',
    ':443',
    'http://',
    'http:///x',
    '[]',
    '[]:80',
    'http://.example.com/',
    'a.example.com..:443',
  ])('%j is refused', (text) => {
    refused(text);
  });
});

describe('zone IDs', () => {
  test.each([
    'fe80::1%eth0',
    'fe80::1%25eth0',
    '[fe80::1%eth0]',
    '[fe80::1%25eth0]:443',
    'http://[fe80::1%25eth0]/',
    'fe80::1%',
    '[::ffff:127.0.0.1%lo]:80',
    '2606:4700::1111%1',
  ])('%s is refused', (text) => {
    refused(text);
  });

  test('zone IDs are refused in rules and internal lists', () => {
    expect(parseNetworkConfig({ allowOut: ['2606:4700::1%eth0'] }).ok).toBe(false);
    expect(parseNetworkConfig({ allowOut: ['2606:4700::1%eth0/64'] }).ok).toBe(false);
    expect(parseNetworkConfig({ denyOut: ['fe80::1%eth0'] }).ok).toBe(false);
  });
});

describe('ports', () => {
  test.each([
    ['0'],
    ['00'],
    ['080'],
    ['65536'],
    ['99999'],
    ['123456'],
    ['-1'],
    ['+80'],
    [' 80'],
    ['80 '],
    ['0x50'],
    ['1e3'],
    ['80.0'],
    ['８０'],
    ['٨٠'],
    [''],
    ['4294967377'],
  ])('port %j is refused', (port) => {
    expect(parsePort(port).ok).toBe(false);
    refused(`example.com:${port}`);
    refused(`8.8.8.8:${port}`);
    refused(`[2606:4700::1111]:${port}`);
    refused(`https://example.com:${port}/`);
  });

  test.each<[string, number]>([
    ['1', 1],
    ['80', 80],
    ['443', 443],
    ['65535', 65535],
  ])('port %j is %d', (text, port) => {
    expect(parsePort(text)).toEqual({ ok: true, value: port });
    const parsed = parseAuthority(`example.com:${text}`);
    expect(parsed.ok && parsed.value.port).toBe(port);
  });

  test('scheme default ports; explicit port wins', () => {
    const port = (text: string) => {
      const parsed = parseDestination(text);
      return parsed.ok ? parsed.value.port : 'refused';
    };
    expect(port('https://example.com/')).toBe(443);
    expect(port('http://example.com')).toBe(80);
    expect(port('HTTPS://example.com')).toBe(443);
    expect(port('https://example.com:8443/')).toBe(8443);
    expect(port('https://[2606:4700::1111]/')).toBe(443);
    expect(port('example.com')).toBeUndefined();
  });

  test.each([0, -1, 65536, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 32 + 80])(
    'decide refuses port %d',
    (port) => {
      const open = policyOf({});
      const wide = policyOf({ allowOut: ['8.8.8.8', 'example.com'], denyOut: ['0.0.0.0/0'] });
      for (const policy of [open, wide]) {
        expect(outcome(decide(policy, { ...destinationOf({ ip: '8.8.8.8' }), port }))).toEqual(
          DENY_INVALID,
        );
        expect(
          outcome(decide(policy, { ...destinationOf({ host: 'example.com' }), port })),
        ).toEqual(DENY_INVALID);
      }
    },
  );

  test('valid ports do not change the decision', () => {
    const policy = policyOf({ allowOut: ['8.8.8.8'], denyOut: ['0.0.0.0/0'] });
    for (const port of [1, 22, 443, 65535]) {
      expect(decideText(policy, { ip: '8.8.8.8', port })).toEqual(allowBy('8.8.8.8'));
      expect(decideText(policy, { ip: '8.8.4.4', port })).toEqual(denyBy('0.0.0.0/0'));
    }
  });
});

describe('userinfo in authorities', () => {
  test.each([
    'user@example.com',
    'user:pass@example.com:443',
    'example.com@evil.net',
    'example.com:443@evil.net',
    '@evil.net',
    'example.com@',
    'http://example.com@evil.net/',
    'https://example.com:443@evil.net/',
    'http://user@example.com/',
    'http://@evil.net/',
    'http://a%40example.com@evil.net/',
    'http://evil.net\\@example.com/',
    '[::1]@evil.net',
    'evil.net@[::1]',
  ])('%s is refused', (text) => {
    refused(text);
  });

  test('"@" after the authority belongs to the path', () => {
    const parsed = parseDestination('http://evil.net/@example.com');
    expect(parsed.ok && parsed.value.host).toBe('evil.net');
  });
});

describe('percent-encoding in names', () => {
  test.each([
    'ex%61mple.com',
    '%65xample.com',
    'example%2ecom',
    'example%2Ecom',
    'example.com%00',
    'example.com%2f',
    'example.com%3a443',
    'http://ex%61mple.com/',
    '127.0.0.%31',
    '%31%32%37.0.0.1',
    'example.com%40evil.net',
    '%5b::1%5d',
    'ex%%61mple.com',
  ])('%s is refused', (text) => {
    refused(text);
  });

  test('percent-encoded rules are refused', () => {
    expect(parseNetworkConfig({ allowOut: ['ex%61mple.com'], denyOut: ['0.0.0.0/0'] }).ok).toBe(
      false,
    );
    expect(parseNetworkConfig({ allowOut: ['*.ex%61mple.com'], denyOut: ['0.0.0.0/0'] }).ok).toBe(
      false,
    );
  });
});

describe('brackets and colons', () => {
  test.each([
    '[1.2.3.4]',
    '[1.2.3.4]:80',
    '[example.com]:443',
    '[::1]x',
    '[::1]:',
    '[::1]]:80',
    'example.com:80:80',
    '1.2.3.4:80:80',
  ])('%s is refused', (text) => {
    refused(text);
  });

  test('a bare IPv6 literal is an address without a port', () => {
    const parsed = parseAuthority('2606:4700::1111');
    expect(parsed.ok && parsed.value.port).toBeUndefined();
    expect(parsed.ok && parsed.value.ip?.version).toBe(6);
  });
});

/** Full-width form of an ASCII letter, digit or hyphen (U+FF01..U+FF5E). */
const fullWidth = (c: string) => String.fromCharCode(c.charCodeAt(0) + 0xfee0);

describe('spelling never changes a decision (property)', () => {
  const label = fc.constantFrom('a', 'b', 'api', 'x-y', 'w1', 'example');
  const name = fc
    .tuple(fc.array(label, { minLength: 0, maxLength: 3 }), fc.constantFrom('com', 'net', 'org'))
    .map(([labels, tld]) => [...labels, tld].join('.'));
  const rule = fc.oneof(
    name,
    name.map((n) => `*.${n}`),
  );

  test('case, trailing dot and full-width forms decide like the canonical name', () => {
    fc.assert(
      fc.property(
        fc.array(rule, { minLength: 1, maxLength: 6 }),
        name,
        fc.array(fc.integer({ min: 0, max: 3 }), { minLength: 32, maxLength: 32 }),
        fc.boolean(),
        (rules, host, styles, dot) => {
          const policy = denyAllWith(...rules);
          const expected = decideText(policy, { host });
          const spelled = [...host]
            .map((c, i) => {
              const style = styles[i % styles.length]!;
              if (c === '.') return style === 3 ? '．' : c;
              if (style === 1) return c.toUpperCase();
              if (style === 2 && /[a-z0-9]/.test(c)) return fullWidth(c);
              return c;
            })
            .join('');
          const text = dot ? `${spelled}.` : spelled;
          const parsed = parseDestination(text);
          // Full-width forms may be refused; when accepted they must decide the same.
          if (!parsed.ok) {
            expect(
              [...text].some((c) => c.charCodeAt(0) > 127),
              `${text}: ${parsed.error}`,
            ).toBe(true);
            return;
          }
          expect(parsed.value.host).toBe(host);
          expect(outcome(decide(policy, parsed.value))).toEqual(expected);
        },
      ),
      { numRuns: 2000 },
    );
  });

  test('IPv4 and its IPv4-mapped IPv6 spellings decide alike', () => {
    const octet = fc.constantFrom(1, 8, 9, 10, 127, 169, 172, 192, 254, 255);
    fc.assert(
      fc.property(
        fc.tuple(octet, octet, octet, octet),
        fc.constantFrom(8, 16, 24, 32),
        (o, len) => {
          const v4 = o.join('.');
          const hex = (a: number, b: number) => ((a << 8) | b).toString(16);
          const policy = policyOf({
            allowOut: [`${o[0]}.${o[1]}.0.0/16`],
            denyOut: [`${o.slice(0, 3).join('.')}.0/${len}`],
          });
          const expected = decideText(policy, { ip: v4 });
          for (const spelled of [
            `::ffff:${v4}`,
            `::FFFF:${hex(o[0], o[1])}:${hex(o[2], o[3])}`,
            `[0:0:0:0:0:ffff:${v4}]:443`,
          ]) {
            const parsed = parseDestination(spelled);
            expect(parsed.ok).toBe(true);
            if (parsed.ok)
              expect(outcome(decide(policy, { ...parsed.value, port: undefined }))).toEqual(
                expected,
              );
          }
        },
      ),
      { numRuns: 500 },
    );
  });
});
