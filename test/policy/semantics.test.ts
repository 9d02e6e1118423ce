/**
 * Table tests pinning design.md "Policy semantics", line by line. Every expected value is written
 * out here from the spec; none is computed by the engine.
 */
import ipaddr from 'ipaddr.js';
import { describe, expect, test } from 'vitest';
import {
  compileInternalDenyList,
  compilePolicy,
  DEFAULT_INTERNAL_DENY,
  decide,
  parseInternalDenyList,
  parseNetworkConfig,
} from '../../src/policy/index.js';
import {
  ALLOW_DEFAULT,
  allowBy,
  DENY_INVALID,
  decideText,
  denyBy,
  destinationOf,
  internalBy,
  learnedBy,
  learnedOf,
  outcome,
  policyOf,
} from './helpers.js';
import {
  REF_DEFAULT_INTERNAL,
  refAddress,
  refContains,
  refIsZeroNetwork,
  refRange,
} from './reference.js';

type Parts = { host?: string; ip?: string; port?: number };

describe('decision order (design.md steps 1-6)', () => {
  const policy = policyOf({
    allowOut: ['10.0.0.0/8', 'example.com', '*.example.org', '8.8.8.0/24', '2606:4700::/32'],
    denyOut: ['0.0.0.0/0'],
  });
  const learned = learnedOf([
    ['9.9.9.9', 'example.com'],
    ['9.9.9.10', 'other.net'],
    ['10.1.1.1', 'example.com'],
    ['2a00:1450::1', 'api.example.org'],
  ]);
  test.each<[string, Parts, ReturnType<typeof outcome>]>([
    // 1. internal first, even when allowOut names the host and holds the address
    [
      'internal beats an allowed name',
      { host: 'example.com', ip: '10.1.1.1' },
      internalBy('10.0.0.0/8'),
    ],
    ['internal beats an allowOut CIDR', { ip: '10.1.1.1' }, internalBy('10.0.0.0/8')],
    ['internal beats a learned address', { ip: '10.1.1.1' }, internalBy('10.0.0.0/8')],
    [
      'internal: metadata address',
      { host: 'example.com', ip: '169.254.169.254' },
      internalBy('169.254.0.0/16'),
    ],
    // 2. allowOut names
    [
      'name allows whatever it resolves to',
      { host: 'example.com', ip: '9.9.9.9' },
      allowBy('example.com'),
    ],
    ['name allows without an address', { host: 'example.com' }, allowBy('example.com')],
    [
      'name allows an IPv6 address',
      { host: 'a.example.org', ip: '2a00:1450::1' },
      allowBy('*.example.org'),
    ],
    [
      'name beats ALL_TRAFFIC for IPv6 too',
      { host: 'example.com', ip: '[2a00:1450::1]' },
      allowBy('example.com'),
    ],
    // unmatched name without an address: the deny-all rule decides
    ['unmatched name, no address', { host: 'other.net' }, denyBy('0.0.0.0/0')],
    // 3. allowOut CIDRs, also for a host no name rule covers
    [
      'unmatched name, address in allowOut',
      { host: 'other.net', ip: '8.8.8.8' },
      allowBy('8.8.8.0/24'),
    ],
    ['address in allowOut', { ip: '8.8.8.255' }, allowBy('8.8.8.0/24')],
    ['IPv6 address in allowOut', { ip: '2606:4700:4700::1111' }, allowBy('2606:4700::/32')],
    ['address next to allowOut range', { ip: '8.8.9.0' }, denyBy('0.0.0.0/0')],
    // 4. learned addresses
    ['learned for an allowed name', { ip: '9.9.9.9' }, learnedBy('example.com')],
    ['learned IPv6 for a wildcard name', { ip: '2a00:1450::1' }, learnedBy('api.example.org')],
    // 5. denyOut
    ['learned for a name no longer allowed', { ip: '9.9.9.10' }, denyBy('0.0.0.0/0')],
    [
      'named host does not use learned addresses',
      { host: 'other.net', ip: '9.9.9.9' },
      denyBy('0.0.0.0/0'),
    ],
    ['not learned', { ip: '9.9.9.11' }, denyBy('0.0.0.0/0')],
    ['IPv6 not learned', { ip: '2a00:1450::2' }, denyBy('0.0.0.0/0')],
  ])('%s', (_, parts, expected) => {
    expect(decideText(policy, parts, learned)).toEqual(expected);
  });

  test('without a learned table, a learned-only address is denied', () => {
    expect(decideText(policy, { ip: '9.9.9.9' })).toEqual(denyBy('0.0.0.0/0'));
  });

  test('a destination with neither host nor address is invalid', () => {
    expect(outcome(decide(policy, {}))).toEqual(DENY_INVALID);
    expect(outcome(decide(policy, { port: 443 }))).toEqual(DENY_INVALID);
  });

  test('6. no rule matches: allow', () => {
    const open = policyOf({});
    for (const parts of [
      { host: 'example.com' },
      { ip: '8.8.8.8' },
      { ip: '2606:4700::1111' },
      { host: 'a.b', ip: '1.1.1.1' },
    ]) {
      expect(decideText(open, parts)).toEqual(ALLOW_DEFAULT);
    }
  });
});

describe('allow beats deny; longest prefix decides within a list', () => {
  test.each<[string, unknown, Parts, ReturnType<typeof outcome>]>([
    [
      'allowOut host inside a denied range',
      { allowOut: ['8.8.8.8'], denyOut: ['8.8.8.0/24'] },
      { ip: '8.8.8.8' },
      allowBy('8.8.8.8'),
    ],
    [
      'allowOut range around a denied host',
      { allowOut: ['8.8.0.0/16'], denyOut: ['8.8.8.8'] },
      { ip: '8.8.8.8' },
      allowBy('8.8.0.0/16'),
    ],
    [
      'denied neighbour',
      { allowOut: ['8.8.8.8'], denyOut: ['8.8.8.0/24'] },
      { ip: '8.8.8.9' },
      denyBy('8.8.8.0/24'),
    ],
    [
      'longest denyOut prefix',
      { denyOut: ['8.0.0.0/8', '8.8.8.0/24', '8.8.0.0/16'] },
      { ip: '8.8.8.8' },
      denyBy('8.8.8.0/24'),
    ],
    [
      'longest allowOut prefix',
      { allowOut: ['8.0.0.0/8', '8.8.8.0/24'], denyOut: ['0.0.0.0/0'] },
      { ip: '8.8.8.1' },
      allowBy('8.8.8.0/24'),
    ],
    [
      'first entry among equal prefixes',
      { denyOut: ['8.8.8.0/24', '8.8.8.7/24'] },
      { ip: '8.8.8.8' },
      denyBy('8.8.8.0/24'),
    ],
    [
      'entry reported as written',
      { denyOut: ['8.8.8.7/24'] },
      { ip: '8.8.8.8' },
      denyBy('8.8.8.7/24'),
    ],
    ['outside every denyOut range', { denyOut: ['8.8.8.0/24'] }, { ip: '8.8.9.1' }, ALLOW_DEFAULT],
    ['/31 boundary', { denyOut: ['8.8.8.8/31'] }, { ip: '8.8.8.9' }, denyBy('8.8.8.8/31')],
    ['/31 boundary, outside', { denyOut: ['8.8.8.8/31'] }, { ip: '8.8.8.10' }, ALLOW_DEFAULT],
    [
      'IPv6 /127 boundary',
      { denyOut: ['2606:4700::/127'] },
      { ip: '2606:4700::1' },
      denyBy('2606:4700::/127'),
    ],
    [
      'IPv6 /127 boundary, outside',
      { denyOut: ['2606:4700::/127'] },
      { ip: '2606:4700::2' },
      ALLOW_DEFAULT,
    ],
    [
      'IPv6 /33 across a word boundary',
      { denyOut: ['2606:4700::/33'] },
      { ip: '2606:4700:7fff::1' },
      denyBy('2606:4700::/33'),
    ],
    [
      'IPv6 /33, outside',
      { denyOut: ['2606:4700::/33'] },
      { ip: '2606:4700:8000::1' },
      ALLOW_DEFAULT,
    ],
    [
      'IPv6 /65',
      { denyOut: ['2606:4700:1:2::/65'] },
      { ip: '2606:4700:1:2:7fff::' },
      denyBy('2606:4700:1:2::/65'),
    ],
    [
      'IPv6 /65, outside',
      { denyOut: ['2606:4700:1:2::/65'] },
      { ip: '2606:4700:1:2:8000::' },
      ALLOW_DEFAULT,
    ],
    [
      'IPv4 rule does not match IPv6',
      { denyOut: ['8.8.8.0/24'] },
      { ip: '808:800::' },
      ALLOW_DEFAULT,
    ],
    [
      'IPv6 rule does not match IPv4',
      { denyOut: ['808:808::/32'] },
      { ip: '8.8.8.8' },
      ALLOW_DEFAULT,
    ],
    ['bare IPv4 is /32', { denyOut: ['8.8.8.8'] }, { ip: '8.8.8.9' }, ALLOW_DEFAULT],
    [
      'bare IPv6 is /128',
      { denyOut: ['2606:4700::1111'] },
      { ip: '2606:4700::1112' },
      ALLOW_DEFAULT,
    ],
    [
      'bare IPv6 in a long spelling',
      { denyOut: ['2606:4700:0:0:0:0:0:1111'] },
      { ip: '2606:4700::1111' },
      denyBy('2606:4700:0:0:0:0:0:1111'),
    ],
    [
      'IPv6 upper-case hex',
      { denyOut: ['2606:4700::ABCD'] },
      { ip: '2606:4700::abcd' },
      denyBy('2606:4700::ABCD'),
    ],
    [
      'denyOut without ALL_TRAFFIC: unmatched name, no address',
      { denyOut: ['8.8.8.0/24'] },
      { host: 'example.com' },
      ALLOW_DEFAULT,
    ],
    [
      'denyOut without ALL_TRAFFIC: name with a denied address',
      { denyOut: ['8.8.8.0/24'] },
      { host: 'example.com', ip: '8.8.8.8' },
      denyBy('8.8.8.0/24'),
    ],
  ])('%s', (_, config, parts, expected) => {
    expect(decideText(policyOf(config), parts)).toEqual(expected);
  });
});

describe('wildcards: any depth below the domain, never the apex', () => {
  const policy = policyOf({
    allowOut: [
      '*.example.com',
      '*.api.example.com',
      'api.example.com',
      'x.api.example.com',
      'apex.net',
      '*.com.au',
    ],
    denyOut: ['0.0.0.0/0'],
  });
  test.each<[string, ReturnType<typeof outcome>]>([
    ['www.example.com', allowBy('*.example.com')],
    ['a.b.c.d.example.com', allowBy('*.example.com')],
    ['example.com', denyBy('0.0.0.0/0')],
    ['api.example.com', allowBy('api.example.com')],
    ['v1.api.example.com', allowBy('*.api.example.com')],
    ['a.v1.api.example.com', allowBy('*.api.example.com')],
    ['x.api.example.com', allowBy('x.api.example.com')],
    ['y.x.api.example.com', allowBy('*.api.example.com')],
    ['apex.net', allowBy('apex.net')],
    ['www.apex.net', denyBy('0.0.0.0/0')],
    ['shop.com.au', allowBy('*.com.au')],
    ['com.au', denyBy('0.0.0.0/0')],
    ['notexample.com', denyBy('0.0.0.0/0')],
    ['wwwexample.com', denyBy('0.0.0.0/0')],
    ['example.com.evil.net', denyBy('0.0.0.0/0')],
    ['www.example.com.evil.net', denyBy('0.0.0.0/0')],
    ['example.co', denyBy('0.0.0.0/0')],
    ['com', denyBy('0.0.0.0/0')],
    ['api.example.net', denyBy('0.0.0.0/0')],
  ])('%s', (host, expected) => {
    expect(decideText(policy, { host })).toEqual(expected);
    // An address that no rule covers changes nothing for names (step 2 comes before step 5).
    expect(decideText(policy, { host, ip: '93.184.216.34' })).toEqual(expected);
  });

  test('an exact rule beats a wildcard whatever the order', () => {
    for (const allowOut of [
      ['*.example.com', 'www.example.com'],
      ['www.example.com', '*.example.com'],
    ]) {
      expect(
        decideText(policyOf({ allowOut, denyOut: ['0.0.0.0/0'] }), { host: 'www.example.com' }),
      ).toEqual(allowBy('www.example.com'));
    }
  });

  test('a deeper wildcard beats a shallower one whatever the order', () => {
    for (const allowOut of [
      ['*.com', '*.example.com', '*.a.example.com'],
      ['*.a.example.com', '*.example.com', '*.com'],
    ]) {
      const policy = policyOf({ allowOut, denyOut: ['0.0.0.0/0'] });
      expect(decideText(policy, { host: 'x.a.example.com' })).toEqual(allowBy('*.a.example.com'));
      expect(decideText(policy, { host: 'a.example.com' })).toEqual(allowBy('*.example.com'));
      expect(decideText(policy, { host: 'example.com' })).toEqual(allowBy('*.com'));
    }
  });

  test('the first of two equal name rules is reported', () => {
    const policy = policyOf({
      allowOut: ['Example.com', 'example.com.', '*.A.net', '*.a.net'],
      denyOut: ['0.0.0.0/0'],
    });
    expect(decideText(policy, { host: 'example.com' })).toEqual(allowBy('Example.com'));
    expect(decideText(policy, { host: 'b.a.net' })).toEqual(allowBy('*.A.net'));
  });

  test('"*" (any hostname), if accepted, allows every name', () => {
    const parsed = parseNetworkConfig({ allowOut: ['*'], denyOut: ['0.0.0.0/0'] });
    if (parsed.ok) {
      const policy = compilePolicy(parsed.value);
      for (const host of ['example.com', 'a.b.c', 'com']) {
        expect(decideText(policy, { host }).verdict).toBe('allow');
      }
    } else {
      expect(parsed.errors.map((e) => e.at)).toEqual(['allowOut[0]']);
    }
  });
});

describe('ALL_TRAFFIC (0.0.0.0/0 in denyOut) denies IPv6 too', () => {
  const all = policyOf({ denyOut: ['0.0.0.0/0'] });
  test.each<[string, string]>([
    ['IPv4', '8.8.8.8'],
    ['IPv6', '2606:4700:4700::1111'],
    ['IPv6 in brackets', '[2001:4860:4860::8888]'],
    ['IPv6 high bit', '8000::1'],
    ['IPv4-mapped IPv6', '::ffff:8.8.8.8'],
  ])('%s', (_, ip) => {
    expect(decideText(all, { ip })).toEqual(denyBy('0.0.0.0/0'));
  });

  test('host only, unmatched: deny by 0.0.0.0/0', () => {
    expect(decideText(all, { host: 'example.com' })).toEqual(denyBy('0.0.0.0/0'));
  });

  test('allowOut IPv6 ranges open holes in it', () => {
    const policy = policyOf({ allowOut: ['2606:4700::/32'], denyOut: ['0.0.0.0/0'] });
    expect(decideText(policy, { ip: '2606:4700::1' })).toEqual(allowBy('2606:4700::/32'));
    expect(decideText(policy, { ip: '2606:4701::1' })).toEqual(denyBy('0.0.0.0/0'));
  });

  test('::/0 in denyOut is accepted and means all IPv6 only', () => {
    const policy = policyOf({ denyOut: ['::/0'] });
    expect(decideText(policy, { ip: '2606:4700::1' })).toEqual(denyBy('::/0'));
    expect(decideText(policy, { ip: '8.8.8.8' })).toEqual(ALLOW_DEFAULT);
    expect(decideText(policy, { ip: '::ffff:8.8.8.8' })).toEqual(ALLOW_DEFAULT);
    expect(policy.rules.denyAll).toBe(false);
  });

  test('::/0 written before 0.0.0.0/0 decides IPv6', () => {
    const policy = policyOf({ denyOut: ['::/0', '0.0.0.0/0'] });
    expect(decideText(policy, { ip: '2606:4700::1' })).toEqual(denyBy('::/0'));
    expect(decideText(policy, { ip: '8.8.8.8' })).toEqual(denyBy('0.0.0.0/0'));
  });

  test('a longer denyOut prefix is reported over ALL_TRAFFIC', () => {
    const policy = policyOf({ denyOut: ['0.0.0.0/0', '2606:4700::/32'] });
    expect(decideText(policy, { ip: '2606:4700::1' })).toEqual(denyBy('2606:4700::/32'));
    expect(decideText(policy, { ip: '2606:4701::1' })).toEqual(denyBy('0.0.0.0/0'));
  });
});

describe('allow_internet_access: false behaves as denyOut ["0.0.0.0/0"]', () => {
  const off = policyOf({ allow_internet_access: false });
  test.each<[string, Parts]>([
    ['IPv4', { ip: '8.8.8.8' }],
    ['IPv6', { ip: '2606:4700::1111' }],
    ['IPv4-mapped', { ip: '::ffff:1.1.1.1' }],
    ['host only', { host: 'example.com' }],
    ['host and address', { host: 'example.com', ip: '1.1.1.1' }],
  ])('%s is denied', (_, parts) => {
    expect(decideText(off, parts)).toEqual(denyBy('allow_internet_access=false'));
  });

  test('it makes domain rules valid, and allowOut still opens holes', () => {
    const policy = policyOf({
      allow_internet_access: false,
      allowOut: ['example.com', '1.1.1.0/24', '2606:4700::/32'],
    });
    expect(decideText(policy, { host: 'example.com' })).toEqual(allowBy('example.com'));
    expect(decideText(policy, { ip: '1.1.1.1' })).toEqual(allowBy('1.1.1.0/24'));
    expect(decideText(policy, { ip: '2606:4700::1' })).toEqual(allowBy('2606:4700::/32'));
    expect(decideText(policy, { host: 'other.com' })).toEqual(
      denyBy('allow_internet_access=false'),
    );
    expect(decideText(policy, { ip: '9.9.9.9' }, learnedOf([['9.9.9.9', 'example.com']]))).toEqual(
      learnedBy('example.com'),
    );
  });

  test('with denyOut ranges, a longer prefix is still reported', () => {
    const policy = policyOf({ allow_internet_access: false, denyOut: ['9.9.9.0/24'] });
    expect(decideText(policy, { ip: '9.9.9.9' })).toEqual(denyBy('9.9.9.0/24'));
    expect(decideText(policy, { ip: '9.9.8.9' })).toEqual(denyBy('allow_internet_access=false'));
  });

  test('together with 0.0.0.0/0, the denyOut entry is reported', () => {
    const policy = policyOf({ allow_internet_access: false, denyOut: ['0.0.0.0/0'] });
    expect(decideText(policy, { ip: '8.8.8.8' })).toEqual(denyBy('0.0.0.0/0'));
    expect(decideText(policy, { ip: '2606:4700::1' })).toEqual(denyBy('0.0.0.0/0'));
    expect(decideText(policy, { host: 'example.com' })).toEqual(denyBy('0.0.0.0/0'));
  });

  test('allow_internet_access: true (or null) denies nothing by itself', () => {
    for (const allow_internet_access of [true, null]) {
      const policy = policyOf({ allow_internet_access });
      expect(decideText(policy, { ip: '8.8.8.8' })).toEqual(ALLOW_DEFAULT);
      expect(decideText(policy, { ip: '2606:4700::1' })).toEqual(ALLOW_DEFAULT);
      expect(decideText(policy, { host: 'example.com' })).toEqual(ALLOW_DEFAULT);
    }
  });

  test('allow_internet_access: false with a domain and no denyOut is valid', () => {
    expect(parseNetworkConfig({ allow_internet_access: false, allowOut: ['example.com'] }).ok).toBe(
      true,
    );
  });
});

/** One address from each default internal range, with the range it must fall in. */
const INTERNAL_SAMPLES: ReadonlyArray<readonly [string, string]> = [
  ['0.0.0.0', '0.0.0.0/8'],
  ['0.255.255.255', '0.0.0.0/8'],
  ['10.0.0.1', '10.0.0.0/8'],
  ['10.255.255.255', '10.0.0.0/8'],
  ['100.64.0.1', '100.64.0.0/10'],
  ['100.127.255.255', '100.64.0.0/10'],
  ['127.0.0.1', '127.0.0.0/8'],
  ['127.255.255.254', '127.0.0.0/8'],
  ['169.254.169.254', '169.254.0.0/16'],
  ['172.16.0.1', '172.16.0.0/12'],
  ['172.31.255.255', '172.16.0.0/12'],
  ['192.0.0.8', '192.0.0.0/24'],
  ['192.0.2.1', '192.0.2.0/24'],
  ['192.88.99.1', '192.88.99.0/24'],
  ['192.168.1.1', '192.168.0.0/16'],
  ['198.18.0.1', '198.18.0.0/15'],
  ['198.19.255.255', '198.18.0.0/15'],
  ['198.51.100.7', '198.51.100.0/24'],
  ['203.0.113.9', '203.0.113.0/24'],
  ['224.0.0.251', '224.0.0.0/4'],
  ['239.255.255.250', '224.0.0.0/4'],
  ['240.0.0.1', '240.0.0.0/4'],
  ['255.255.255.255', '240.0.0.0/4'],
  ['::', '::/96'],
  ['::1', '::/96'],
  ['::7f00:1', '::/96'],
  ['::a9fe:a9fe', '::/96'],
  ['64:ff9b::a9fe:a9fe', '64:ff9b::/96'],
  ['64:ff9b:1::1', '64:ff9b:1::/48'],
  ['100::1', '100::/64'],
  ['100:0:0:1::5', '100:0:0:1::/64'],
  ['2001::1', '2001::/23'],
  ['2001:0:4136:e378:8000:63bf:3fff:fdd2', '2001::/23'],
  ['2001:db8::1', '2001:db8::/32'],
  ['2002:7f00:1::1', '2002::/16'],
  ['2002:a9fe:a9fe::', '2002::/16'],
  ['3fff::1', '3fff::/20'],
  ['5f00::1', '5f00::/16'],
  ['fc00::1', 'fc00::/7'],
  ['fd00:ec2::254', 'fc00::/7'],
  ['fe80::1', 'fe80::/10'],
  ['febf:ffff::1', 'fe80::/10'],
  ['fec0::1', 'fec0::/10'],
  ['ff02::1', 'ff00::/8'],
  ['::ffff:127.0.0.1', '127.0.0.0/8'],
  ['::ffff:169.254.169.254', '169.254.0.0/16'],
  ['::ffff:a00:1', '10.0.0.0/8'],
];

/** Public addresses just outside the internal ranges. */
const PUBLIC_SAMPLES = [
  '1.0.0.0',
  '8.8.8.8',
  '9.255.255.255',
  '11.0.0.0',
  '100.63.255.255',
  '100.128.0.0',
  '126.255.255.255',
  '128.0.0.0',
  '169.253.255.255',
  '169.255.0.0',
  '172.15.255.255',
  '172.32.0.0',
  '192.0.1.0',
  '192.167.255.255',
  '192.169.0.0',
  '198.17.255.255',
  '198.20.0.0',
  '223.255.255.255',
  '2001:200::1',
  '2001:4860:4860::8888',
  '2606:4700:4700::1111',
  '2a00:1450:4001:80e::200e',
  '::1:0:0:1',
  '::ffff:8.8.8.8',
  '64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff',
  'fbff:ffff::1',
];

describe('the hard internal deny list', () => {
  test('the reference table of samples agrees with itself', () => {
    // Guards the table above against typos: every sample lies in the range it names.
    for (const [ip, range] of INTERNAL_SAMPLES)
      expect(refContains(refRange(range), refAddress(ip)), ip).toBe(true);
    for (const ip of PUBLIC_SAMPLES) {
      expect(
        REF_DEFAULT_INTERNAL.some((range) => refContains(refRange(range), refAddress(ip))),
        ip,
      ).toBe(false);
    }
  });

  test('the default list holds the IANA special-purpose ranges design.md names', () => {
    expect(DEFAULT_INTERNAL_DENY.map((range) => range.entry)).toEqual(REF_DEFAULT_INTERNAL);
  });

  const permissive = policyOf({});
  test.each(INTERNAL_SAMPLES)('%s is internal (%s)', (ip, range) => {
    expect(decideText(permissive, { ip })).toEqual(internalBy(range));
    expect(decideText(permissive, { host: 'example.com', ip })).toEqual(internalBy(range));
  });

  test.each(PUBLIC_SAMPLES)('%s is not internal', (ip) => {
    expect(decideText(permissive, { ip })).toEqual(ALLOW_DEFAULT);
  });

  test.each(INTERNAL_SAMPLES)('allowOut cannot override the internal list: %s', (ip, range) => {
    // The address itself and its whole internal range, where allowOut accepts them (it refuses
    // the unspecified network), plus names.
    const allowOut = [ip, range].filter((entry) => !refIsZeroNetwork(refRange(entry)));
    const policy = policyOf({
      allowOut: [...allowOut, 'example.com', '*.example.com'],
      denyOut: ['0.0.0.0/0'],
    });
    expect(decideText(policy, { ip })).toEqual(internalBy(range));
    expect(decideText(policy, { host: 'example.com', ip })).toEqual(internalBy(range));
    expect(decideText(policy, { host: 'a.example.com', ip })).toEqual(internalBy(range));
    expect(decideText(policy, { ip }, learnedOf([[ip, 'example.com']]))).toEqual(internalBy(range));
  });

  test('allow_internet_access: true does not open it either', () => {
    expect(
      decideText(policyOf({ allow_internet_access: true }), { ip: '169.254.169.254' }),
    ).toEqual(internalBy('169.254.0.0/16'));
  });

  test('a bad port is invalid before anything else is looked at', () => {
    expect(outcome(decide(permissive, destinationOf({ ip: '127.0.0.1', port: 0 })))).toEqual(
      DENY_INVALID,
    );
  });
});

describe('the operator configures the internal list (parseInternalDenyList)', () => {
  const compiled = (text: string) => {
    const parsed = parseInternalDenyList(text);
    if (!parsed.ok) throw new Error(parsed.error);
    return compileInternalDenyList(parsed.value);
  };

  test('"none": nothing is internal; sandbox rules decide', () => {
    const policy = policyOf({ denyOut: ['127.0.0.0/8'] }, compiled('none'));
    expect(decideText(policy, { ip: '127.0.0.1' })).toEqual(denyBy('127.0.0.0/8'));
    expect(decideText(policy, { ip: '10.0.0.1' })).toEqual(ALLOW_DEFAULT);
    expect(decideText(policy, { ip: '::1' })).toEqual(ALLOW_DEFAULT);
  });

  test('a custom list replaces the default and still beats allowOut', () => {
    const internal = compiled(' 100.100.100.100 , 2606:4700::/32,10.0.0.0/8');
    const policy = policyOf(
      { allowOut: ['100.100.0.0/16', '2606::/16', 'example.com'], denyOut: ['0.0.0.0/0'] },
      internal,
    );
    expect(decideText(policy, { ip: '100.100.100.100' })).toEqual(internalBy('100.100.100.100'));
    expect(decideText(policy, { host: 'example.com', ip: '2606:4700::1' })).toEqual(
      internalBy('2606:4700::/32'),
    );
    expect(decideText(policy, { ip: '100.100.100.101' })).toEqual(allowBy('100.100.0.0/16'));
    expect(decideText(policy, { host: 'example.com', ip: '127.0.0.1' })).toEqual(
      allowBy('example.com'),
    );
    expect(decideText(policy, { ip: '10.9.9.9' })).toEqual(internalBy('10.0.0.0/8'));
  });

  test('the longest internal prefix is reported', () => {
    const policy = policyOf({}, compiled('10.0.0.0/8,10.1.0.0/16'));
    expect(decideText(policy, { ip: '10.1.2.3' })).toEqual(internalBy('10.1.0.0/16'));
    expect(decideText(policy, { ip: '10.2.2.3' })).toEqual(internalBy('10.0.0.0/8'));
  });

  test('"default" is the built-in list', () => {
    const policy = policyOf({}, compiled('default'));
    for (const [ip, range] of INTERNAL_SAMPLES)
      expect(decideText(policy, { ip })).toEqual(internalBy(range));
  });

  test.each([
    '',
    'example.com',
    '10.0.0.0/33',
    '10.0.0.0/8,,11.0.0.0/8',
    '127.1',
    'fe80::1%eth0',
    '10.0.0.0/8;11.0.0.0/8',
  ])('rejects %j', (text) => {
    expect(parseInternalDenyList(text).ok).toBe(false);
  });
});

describe('canonical names decide, whatever the spelling (design.md "Canonical form")', () => {
  const policy = policyOf({
    allowOut: ['Example.COM.', '*.Bücher.example', 'xn--caf-dma.example'],
    denyOut: ['0.0.0.0/0'],
  });
  test.each<[string, ReturnType<typeof outcome>]>([
    ['example.com', allowBy('Example.COM.')],
    ['EXAMPLE.COM', allowBy('Example.COM.')],
    ['example.com.', allowBy('Example.COM.')],
    ['shop.xn--bcher-kva.example', allowBy('*.Bücher.example')],
    ['SHOP.BÜCHER.EXAMPLE', allowBy('*.Bücher.example')],
    ['café.example', allowBy('xn--caf-dma.example')],
    ['CAFÉ.example.', allowBy('xn--caf-dma.example')],
    ['xn--bcher-kva.example', denyBy('0.0.0.0/0')],
    ['cafe.example', denyBy('0.0.0.0/0')],
  ])('%s', (host, expected) => {
    expect(decideText(policy, { host })).toEqual(expected);
  });

  test('IDN names become A-labels', () => {
    const d = destinationOf({ host: 'Bücher.Example' });
    expect(d.host).toBe('xn--bcher-kva.example');
  });
});

describe('every address an allowOut range covers is allowed, and only those', () => {
  // A small exhaustive sweep near range edges (independent check with ipaddr.js).
  test.each(['8.8.8.0/29', '8.8.8.8/30', '2606:4700::/126', '2606:4700::8/125'])('%s', (range) => {
    const policy = policyOf({ allowOut: [range], denyOut: ['0.0.0.0/0'] });
    const parsed = refRange(range);
    const base = parsed.addr.toByteArray();
    for (let delta = -8; delta < 24; delta++) {
      const bytes = [...base];
      let carry = delta;
      for (let i = bytes.length - 1; i >= 0 && carry !== 0; i--) {
        const v = bytes[i]! + carry;
        bytes[i] = ((v % 256) + 256) % 256;
        carry = Math.floor(v / 256);
      }
      const address = ipaddr.fromByteArray(bytes);
      const text = address.toString();
      const expected = refContains(parsed, address) ? allowBy(range) : denyBy('0.0.0.0/0');
      expect(decideText(policy, { ip: text }), text).toEqual(expected);
    }
  });
});
