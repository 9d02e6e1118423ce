/**
 * Port-scoped rules and names in denyOut (Moat extensions): the grammar and its errors, the
 * decision table per (destination, port) and for questions without a port (DNS), and a
 * property test against a naive reference written here from the rules' text.
 */
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import {
  canonicalName,
  compilePolicy,
  decide,
  deniedPorts,
  lintPolicy,
  compileInternalDenyList,
  parseNetworkConfig,
  parsePresetFile,
  presetTable,
  type Rule,
} from '../../src/policy/index.js';
import {
  ALLOW_DEFAULT,
  allowBy,
  decideText,
  denyBy,
  destinationOf,
  internalBy,
  learnedBy,
  learnedOf,
  outcome,
  policyOf,
} from './helpers.js';

const denyAll = (...allowOut: string[]) => ({ allowOut, denyOut: ['0.0.0.0/0'] });

const name = (text: string) => {
  const parsed = canonicalName(text);
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.value;
};

const rulesOf = (config: unknown): readonly Rule[] => {
  const parsed = parseNetworkConfig(config);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
  return [...parsed.value.allowOut, ...parsed.value.denyOut];
};

const errorOf = (config: unknown): string => {
  const parsed = parseNetworkConfig(config);
  if (parsed.ok) throw new Error(`expected ${JSON.stringify(config)} to be refused`);
  expect(parsed.errors).toHaveLength(1);
  return `${parsed.errors[0]!.at}: ${parsed.errors[0]!.message}`;
};

describe('the grammar: entries with ports', () => {
  test.each([
    ['pypi.org:443', 'name', 'pypi.org', { from: 443, to: 443 }],
    ['PyPI.org.:443', 'name', 'pypi.org', { from: 443, to: 443 }],
    ['*.example.com:22', 'wildcard', 'example.com', { from: 22, to: 22 }],
    ['example.com:8000-8100', 'name', 'example.com', { from: 8000, to: 8100 }],
    ['example.com:1-65535', 'name', 'example.com', undefined],
    ['example.com', 'name', 'example.com', undefined],
    ['8.8.8.8:53', 'address', '8.8.8.8/32', { from: 53, to: 53 }],
    ['8.8.8.0/24:443', 'address', '8.8.8.0/24', { from: 443, to: 443 }],
    ['[2606:4700::1]:443', 'address', '2606:4700::1/128', { from: 443, to: 443 }],
    ['[2606:4700::/32]:443', 'address', '2606:4700::/32', { from: 443, to: 443 }],
    ['[2606:4700::1]:8000-8100', 'address', '2606:4700::1/128', { from: 8000, to: 8100 }],
    ['2606:4700::1', 'address', '2606:4700::1/128', undefined],
    ['8.8.8.8:7-7', 'address', '8.8.8.8/32', { from: 7, to: 7 }],
  ])('allowOut %j', (entry, kind, target, ports) => {
    const [rule] = rulesOf(denyAll(entry));
    expect(rule!.kind).toBe(kind);
    expect(rule!.kind === 'address' ? rule!.cidr.text : rule!.name).toBe(target);
    expect(rule!.ports).toEqual(ports);
    expect(rule!.entry).toBe(entry);
  });

  test.each([
    ['evil.test', 'name', undefined],
    ['*.pastebin.com', 'wildcard', undefined],
    ['evil.test:25', 'name', { from: 25, to: 25 }],
    ['8.8.8.8:25', 'address', { from: 25, to: 25 }],
    ['8.8.0.0/16:25-587', 'address', { from: 25, to: 587 }],
  ])('denyOut %j (names in denyOut: a Moat extension)', (entry, kind, ports) => {
    const [rule] = rulesOf({ denyOut: [entry] });
    expect(rule!.list).toBe('denyOut');
    expect(rule!.kind).toBe(kind);
    expect(rule!.ports).toEqual(ports);
  });

  test.each([
    ['port 0', 'a.com:0', 'allowOut[0]: invalid allowed domain a.com:0 (allowOut[0]): port "0"'],
    ['port > 65535', 'a.com:65536', 'port "65536" is not a whole number from 1 to 65535'],
    ['an empty port', 'a.com:', 'invalid allowed domain a.com: (allowOut[0]): has ":" but no port'],
    ['a leading zero', 'a.com:0443', 'port "0443" is not a whole number'],
    ['a sign', 'a.com:+443', 'port "+443"'],
    ['a reversed range', 'a.com:8100-8000', 'port range "8100-8000" is reversed: write 8000-8100'],
    ['a range open at the end', 'a.com:8000-', 'port "" is not a whole number'],
    ['a range open at the start', 'a.com:-8000', 'port "" is not a whole number'],
    ['two ports', 'a.com:80,443', 'port "80,443"'],
    ['a port with nothing before it', ':443', 'names no destination before its port'],
    ['a name in brackets', '[a.com]:443', 'brackets around something that is not an IPv6'],
    ['IPv4 in brackets', '[8.8.8.8]:443', 'brackets around something that is not an IPv6'],
    ['brackets without a port', '[2606:4700::1]', 'has brackets but no port'],
    ['text after "]"', '[2606:4700::1]443', 'text after "]" that is not ":port"'],
    ['"[" without "]"', '[2606:4700::1:443', 'has "[" without "]"'],
    ['a scheme', 'https://a.com:443', 'invalid allowed address https://a.com:443 (allowOut[0])'],
    ['a preset with a port', 'preset:pypi:443', 'a preset takes no port'],
    ['ALL_TRAFFIC with a port', 'ALL_TRAFFIC:443', 'ALL_TRAFFIC takes no port'],
    ['a wildcard port', 'a.com:*', 'port "*"'],
  ])('allowOut refuses %s (%j), naming the entry and why', (_what, entry, message) => {
    expect(errorOf(denyAll(entry))).toContain(message);
  });

  test.each([
    ['port 0', '8.8.8.8:0', 'denyOut[0]: invalid denied CIDR 8.8.8.8:0 (denyOut[0]): port "0"'],
    ['ALL_TRAFFIC with a port', 'ALL_TRAFFIC:25', 'ALL_TRAFFIC takes no port'],
    ['0.0.0.0/0 with a port', '0.0.0.0/0:25', 'the unspecified network takes no port'],
    ['a bare IPv6 address read with a port', '2606:4700::1:99999', 'invalid denied CIDR'],
    ['a preset', 'preset:pypi', 'presets only allow'],
  ])('denyOut refuses %s (%j)', (_what, entry, message) => {
    expect(errorOf({ denyOut: [entry] })).toContain(message);
  });

  test('a domain with a port in allowOut still needs ALL_TRAFFIC (E2B rule)', () => {
    expect(errorOf({ allowOut: ['pypi.org:443'] })).toContain("include 'ALL_TRAFFIC'");
  });
});

/*
 * The decision table (docs/policy.md, "Ports"): allow beats deny per (destination, port); a
 * question without a port is allowed when some port would be, denied only by a rule covering
 * every port.
 *
 * | policy                                   | question             | verdict            |
 * | allowOut a.test:443, deny-all            | a.test, port 443     | allow a.test:443   |
 * |                                          | a.test, port 80      | deny ALL_TRAFFIC   |
 * |                                          | a.test, no port (DNS)| allow a.test:443   |
 * | allowOut 44.1.2.3:5432, deny-all         | 44.1.2.3:5432        | allow              |
 * |                                          | 44.1.2.3:5433        | deny ALL_TRAFFIC   |
 * |                                          | 44.1.2.3, no port    | allow (some port)  |
 * | denyOut evil.test (default allow)        | evil.test, any/none  | deny (NXDOMAIN)    |
 * | denyOut evil.test:25                     | evil.test:25         | deny               |
 * |                                          | evil.test:443 / none | allow (resolves)   |
 * | denyOut 44.1.2.3:25                      | 44.1.2.3:25          | deny               |
 * |                                          | 44.1.2.3:443 / none  | allow              |
 * | allowOut a.test:443 + denyOut a.test     | a.test:443           | allow (allow wins) |
 * |                                          | a.test:80            | deny evil          |
 */
describe('decisions per (destination, port)', () => {
  test('a name allowed on one port', () => {
    const policy = policyOf(denyAll('a.test:443', '*.b.test:22'));
    expect(decideText(policy, { host: 'a.test', port: 443 })).toEqual(allowBy('a.test:443'));
    expect(decideText(policy, { host: 'a.test', port: 80 })).toEqual(denyBy('0.0.0.0/0'));
    expect(decideText(policy, { host: 'a.test' })).toEqual(allowBy('a.test:443'));
    expect(decideText(policy, { host: 'x.b.test', port: 22 })).toEqual(allowBy('*.b.test:22'));
    expect(decideText(policy, { host: 'x.b.test', port: 23 })).toEqual(denyBy('0.0.0.0/0'));
    expect(decideText(policy, { host: 'b.test', port: 22 })).toEqual(denyBy('0.0.0.0/0'));
    // The name with its address, as the proxy decides each address it dials.
    expect(decideText(policy, { host: 'a.test', ip: '44.1.2.3', port: 443 })).toEqual(
      allowBy('a.test:443'),
    );
    expect(decideText(policy, { host: 'a.test', ip: '44.1.2.3', port: 80 })).toEqual(
      denyBy('0.0.0.0/0'),
    );
    // An address in a DNS answer for the name: kept (the name is allowed on some port).
    expect(decideText(policy, { host: 'a.test', ip: '44.1.2.3' })).toEqual(allowBy('a.test:443'));
    // The internal list still comes first.
    expect(decideText(policy, { host: 'a.test', ip: '10.0.0.1', port: 443 })).toEqual(
      internalBy('10.0.0.0/8'),
    );
  });

  test('a wildcard on one port and an exact name on another: each covers its own port', () => {
    const policy = policyOf(denyAll('*.a.test:443', 'x.a.test:22', '*.x.a.test:80'));
    expect(decideText(policy, { host: 'x.a.test', port: 22 })).toEqual(allowBy('x.a.test:22'));
    expect(decideText(policy, { host: 'x.a.test', port: 443 })).toEqual(allowBy('*.a.test:443'));
    expect(decideText(policy, { host: 'y.x.a.test', port: 443 })).toEqual(allowBy('*.a.test:443'));
    expect(decideText(policy, { host: 'y.x.a.test', port: 80 })).toEqual(allowBy('*.x.a.test:80'));
    expect(decideText(policy, { host: 'x.a.test', port: 80 })).toEqual(denyBy('0.0.0.0/0'));
  });

  test('a port range and overlapping entries of one name', () => {
    const policy = policyOf(denyAll('a.test:8000-8100', 'a.test:8050-8200', 'a.test:22'));
    expect(decideText(policy, { host: 'a.test', port: 7999 })).toEqual(denyBy('0.0.0.0/0'));
    expect(decideText(policy, { host: 'a.test', port: 8000 })).toEqual(allowBy('a.test:8000-8100'));
    expect(decideText(policy, { host: 'a.test', port: 8100 })).toEqual(allowBy('a.test:8000-8100'));
    expect(decideText(policy, { host: 'a.test', port: 8101 })).toEqual(allowBy('a.test:8050-8200'));
    expect(decideText(policy, { host: 'a.test', port: 8200 })).toEqual(allowBy('a.test:8050-8200'));
    expect(decideText(policy, { host: 'a.test', port: 8201 })).toEqual(denyBy('0.0.0.0/0'));
    expect(decideText(policy, { host: 'a.test', port: 22 })).toEqual(allowBy('a.test:22'));
  });

  test('addresses and networks allowed on some ports', () => {
    const policy = policyOf(
      denyAll('44.1.2.3:5432', '44.1.0.0/16:443', '[2606:4700::/32]:443', '44.1.2.0/24:22'),
    );
    expect(decideText(policy, { ip: '44.1.2.3', port: 5432 })).toEqual(allowBy('44.1.2.3:5432'));
    expect(decideText(policy, { ip: '44.1.2.3', port: 5433 })).toEqual(denyBy('0.0.0.0/0'));
    // Every network around the address counts, on its own ports.
    expect(decideText(policy, { ip: '44.1.2.3', port: 443 })).toEqual(allowBy('44.1.0.0/16:443'));
    expect(decideText(policy, { ip: '44.1.2.3', port: 22 })).toEqual(allowBy('44.1.2.0/24:22'));
    expect(decideText(policy, { ip: '44.1.3.3', port: 22 })).toEqual(denyBy('0.0.0.0/0'));
    expect(decideText(policy, { ip: '44.1.3.3', port: 443 })).toEqual(allowBy('44.1.0.0/16:443'));
    expect(decideText(policy, { ip: '44.2.0.1', port: 443 })).toEqual(denyBy('0.0.0.0/0'));
    expect(decideText(policy, { ip: '2606:4700::9', port: 443 })).toEqual(
      allowBy('[2606:4700::/32]:443'),
    );
    expect(decideText(policy, { ip: '2606:4700::9', port: 80 })).toEqual(denyBy('0.0.0.0/0'));
    // Without a port (an address in a DNS answer): allowed on some port, by the most specific
    // network's rule, though an outer one holds lower ports.
    expect(decide(policy, destinationOf({ ip: '44.1.2.3' })).verdict).toBe('allow');
    expect(decideText(policy, { ip: '44.1.2.3' })).toEqual(allowBy('44.1.2.3:5432'));
    expect(decide(policy, destinationOf({ ip: '44.2.0.1' })).verdict).toBe('deny');
  });

  test('a portless rule covers every port; allow beats deny per port', () => {
    const policy = policyOf({
      allowOut: ['44.1.2.3:443', 'a.test:443'],
      denyOut: ['44.1.0.0/16', 'a.test', '8.8.8.8:53'],
    });
    expect(decideText(policy, { ip: '44.1.2.3', port: 443 })).toEqual(allowBy('44.1.2.3:443'));
    expect(decideText(policy, { ip: '44.1.2.3', port: 80 })).toEqual(denyBy('44.1.0.0/16'));
    expect(decideText(policy, { host: 'a.test', port: 443 })).toEqual(allowBy('a.test:443'));
    expect(decideText(policy, { host: 'a.test', port: 80 })).toEqual(denyBy('a.test'));
    // DNS for a.test resolves: it is allowed on 443.
    expect(decideText(policy, { host: 'a.test' })).toEqual(allowBy('a.test:443'));
    expect(decideText(policy, { ip: '8.8.8.8', port: 53 })).toEqual(denyBy('8.8.8.8:53'));
    expect(decideText(policy, { ip: '8.8.8.8', port: 443 })).toEqual(ALLOW_DEFAULT);
    expect(decideText(policy, { ip: '8.8.8.8' })).toEqual(ALLOW_DEFAULT);
  });

  test('names in denyOut: every port answers NXDOMAIN, some ports still resolve', () => {
    const policy = policyOf({ denyOut: ['*.pastebin.com', 'evil.test:25', 'smtp.test:25-587'] });
    // DNS: a query name has no port.
    expect(decideText(policy, { host: 'x.pastebin.com' })).toEqual(denyBy('*.pastebin.com'));
    expect(decideText(policy, { host: 'pastebin.com' })).toEqual(ALLOW_DEFAULT);
    expect(decideText(policy, { host: 'evil.test' })).toEqual(ALLOW_DEFAULT);
    expect(decideText(policy, { host: 'evil.test', ip: '44.1.2.3' })).toEqual(ALLOW_DEFAULT);
    // The proxy: a name and a port.
    expect(decideText(policy, { host: 'x.pastebin.com', port: 443 })).toEqual(
      denyBy('*.pastebin.com'),
    );
    expect(decideText(policy, { host: 'evil.test', port: 25 })).toEqual(denyBy('evil.test:25'));
    expect(decideText(policy, { host: 'evil.test', ip: '44.1.2.3', port: 25 })).toEqual(
      denyBy('evil.test:25'),
    );
    expect(decideText(policy, { host: 'evil.test', port: 443 })).toEqual(ALLOW_DEFAULT);
    expect(decideText(policy, { host: 'smtp.test', port: 465 })).toEqual(
      denyBy('smtp.test:25-587'),
    );
  });

  test('a denied name is allowed where an allowOut entry covers it', () => {
    const policy = policyOf({
      allowOut: ['api.pastebin.com:443'],
      denyOut: ['*.pastebin.com'],
    });
    expect(decideText(policy, { host: 'api.pastebin.com', port: 443 })).toEqual(
      allowBy('api.pastebin.com:443'),
    );
    expect(decideText(policy, { host: 'api.pastebin.com', port: 80 })).toEqual(
      denyBy('*.pastebin.com'),
    );
    expect(decideText(policy, { host: 'api.pastebin.com' })).toEqual(
      allowBy('api.pastebin.com:443'),
    );
    expect(decideText(policy, { host: 'www.pastebin.com' })).toEqual(denyBy('*.pastebin.com'));
  });

  test('a learned address is closed on the ports denyOut denies its name on; allow still beats deny', () => {
    const policy = policyOf({ denyOut: ['smtp.test:25', '*.pastebin.com'] });
    const smtp = learnedOf([['44.1.2.3', 'smtp.test']]);
    expect(decide(policy, destinationOf({ ip: '44.1.2.3', port: 25 }), smtp)).toEqual({
      verdict: 'deny',
      list: 'denyOut',
      rule: 'smtp.test:25',
      reason:
        'the address was given to this sandbox by DNS for smtp.test, which denyOut smtp.test:25 denies on this port',
    });
    expect(decideText(policy, { ip: '44.1.2.3', port: 443 }, smtp)).toEqual(ALLOW_DEFAULT);
    // Learned before a PUT denied the name on every port: closed on every port.
    const paste = learnedOf([['44.1.2.4', 'x.pastebin.com']]);
    expect(decideText(policy, { ip: '44.1.2.4', port: 443 }, paste)).toEqual(
      denyBy('*.pastebin.com'),
    );
    expect(deniedPorts(policy, [name('smtp.test')])).toEqual([{ from: 25, to: 25 }]);
    expect(deniedPorts(policy, [name('x.pastebin.com')])).toBe('every');
    expect(deniedPorts(policy, [name('db.test')])).toEqual([]);
    // An allowOut entry covering the learned name on the port wins; so does another name the
    // address was learned for.
    const both = policyOf({
      allowOut: ['smtp.test:25', 'relay.test'],
      denyOut: ['0.0.0.0/0', 'smtp.test'],
    });
    expect(decideText(both, { ip: '44.1.2.3', port: 25 }, smtp)).toEqual(learnedBy('smtp.test'));
    expect(decideText(both, { ip: '44.1.2.3', port: 26 }, smtp)).toEqual(denyBy('smtp.test'));
    const shared = learnedOf([
      ['44.1.2.3', 'smtp.test'],
      ['44.1.2.3', 'relay.test'],
    ]);
    expect(decideText(both, { ip: '44.1.2.3', port: 26 }, shared)).toEqual(learnedBy('relay.test'));
  });

  test('a learned address opens only the ports its name is allowed on', () => {
    const policy = policyOf(denyAll('db.test:5432'));
    const learned = learnedOf([['44.1.2.3', 'db.test']]);
    expect(decideText(policy, { ip: '44.1.2.3', port: 5432 }, learned)).toEqual(
      learnedBy('db.test'),
    );
    expect(decideText(policy, { ip: '44.1.2.3', port: 22 }, learned)).toEqual(denyBy('0.0.0.0/0'));
  });
});

describe('a preset that names ports', () => {
  test('its entries are enforced on their ports, as the same entries written in allowOut', () => {
    const file = parsePresetFile(
      {
        name: 'git',
        version: 1,
        description: 'git over SSH and HTTPS',
        allowOut: ['github.com:22', 'github.com:443', '*.githubusercontent.com:443'],
      },
      'git.json',
    );
    if (!file.ok) throw new Error(JSON.stringify(file.errors));
    const presets = presetTable([file.value]);
    if (!presets.ok) throw new Error(JSON.stringify(presets.errors));
    const parsed = parseNetworkConfig(denyAll('preset:git'), { presets: presets.value });
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
    const policy = compilePolicy(parsed.value);
    const at = (host: string, port?: number) =>
      outcome(decide(policy, destinationOf({ host, port })));
    expect(at('github.com', 22)).toEqual(allowBy('preset:git (github.com:22)'));
    expect(at('github.com', 443)).toEqual(allowBy('preset:git (github.com:443)'));
    expect(at('github.com', 80)).toEqual(denyBy('0.0.0.0/0'));
    expect(at('raw.githubusercontent.com', 443)).toEqual(
      allowBy('preset:git (*.githubusercontent.com:443)'),
    );
    expect(at('raw.githubusercontent.com', 22)).toEqual(denyBy('0.0.0.0/0'));
    expect(at('github.com')).toEqual(allowBy('preset:git (github.com:22)'));
  });
});

describe('lint with ports', () => {
  const lint = (config: unknown) => {
    const parsed = parseNetworkConfig(config);
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
    return lintPolicy(parsed.value, compileInternalDenyList()).map((w) => w.message);
  };
  test('a port entry shadowed by a portless one', () => {
    expect(lint(denyAll('a.test', 'a.test:443'))).toContain(
      'allowOut[1] "a.test:443" is already covered by allowOut[0] "a.test", which takes every port',
    );
    expect(lint(denyAll('*.a.test', 'b.a.test:22'))).toContain(
      'allowOut[1] "b.a.test:22" is already covered by allowOut[0] "*.a.test"',
    );
    expect(lint(denyAll('44.1.2.3', '44.1.2.3:443'))).toContain(
      'allowOut[1] "44.1.2.3:443" is already covered by allowOut[0] "44.1.2.3", which takes every port',
    );
    expect(lint(denyAll('a.test:8000-8100', 'a.test:8080'))).toContain(
      'allowOut[1] "a.test:8080" is already covered by allowOut[0] "a.test:8000-8100"',
    );
  });
  test('different ports of one destination are neither repeats nor shadowed', () => {
    expect(lint(denyAll('a.test:22', 'a.test:443', '44.1.2.3:22', '44.1.2.3:443'))).toEqual([]);
  });
  test('a repeat with the same port; a deny that an allow covers', () => {
    expect(lint(denyAll('a.test:22', 'a.test:22'))).toContain(
      'allowOut[1] "a.test:22" repeats allowOut[0] "a.test:22"',
    );
    expect(lint({ allowOut: ['a.test'], denyOut: ['a.test:25'] })).toContain(
      'denyOut[0] "a.test:25" has no effect: allowOut[0] "a.test" covers it, and allow beats deny',
    );
    expect(lint({ allowOut: ['44.1.2.3:25'], denyOut: ['44.1.2.3:25'] })).toContain(
      'denyOut[0] "44.1.2.3:25" has no effect: allowOut[0] "44.1.2.3:25" covers it, and allow beats deny',
    );
  });
});

/*
 * The property: decide agrees with a naive reference that reads each rule's text (name or
 * address, ports) and scans every rule in design.md's order, per port.
 */
const NAMES = ['a.test', 'b.a.test', 'c.b.a.test', 'x.test'];
const ADDRESSES = ['44.1.2.3', '44.1.2.4', '44.1.9.9', '44.2.0.1', '10.1.2.3'];
const NETWORKS = ['44.1.2.3/32', '44.1.2.0/24', '44.1.0.0/16', '44.0.0.0/8'];
const PORTS = [22, 25, 80, 443, 8000, 8080, 8100];
const PORT_SPECS = ['', ':22', ':80', ':443', ':8000-8100', ':25-443', ':8080'];

interface RefRule {
  readonly entry: string;
  readonly kind: 'name' | 'wildcard' | 'address';
  readonly target: string;
  readonly from: number;
  readonly to: number;
}

const refRule = (entry: string): RefRule => {
  const colon = entry.indexOf(':');
  const target = colon < 0 ? entry : entry.slice(0, colon);
  const spec = colon < 0 ? '1-65535' : entry.slice(colon + 1);
  const [from, to] = spec.includes('-') ? spec.split('-').map(Number) : [+spec, +spec];
  const kind = /^[0-9]/.test(target) ? 'address' : target.startsWith('*.') ? 'wildcard' : 'name';
  return {
    entry,
    kind,
    target: kind === 'wildcard' ? target.slice(2) : target,
    from: from!,
    to: to!,
  };
};

const v4 = (text: string) => text.split('.').reduce((a, o) => a * 256 + Number(o), 0);
const inNetwork = (ip: string, target: string) => {
  const [base, length] = target.includes('/') ? target.split('/') : [target, '32'];
  const size = 2 ** (32 - Number(length));
  return Math.floor(v4(ip) / size) === Math.floor(v4(base!) / size);
};
const nameCovers = (rule: RefRule, host: string) =>
  rule.kind === 'name' ? rule.target === host : host.endsWith(`.${rule.target}`);
/** Some port (allow) or every port (deny) when the question has none. */
const portCovers = (rule: RefRule, port: number | undefined, list: 'allow' | 'deny') =>
  port === undefined
    ? list === 'allow' || (rule.from === 1 && rule.to === 65535)
    : rule.from <= port && port <= rule.to;

function refDecidePorts(
  allowOut: readonly string[],
  denyOut: readonly string[],
  dest: { host?: string; ip?: string; port?: number },
  learned: ReadonlyMap<string, string>,
): { verdict: string; list: string; rules: string[] } {
  const allow = allowOut.map(refRule);
  const deny = denyOut.map(refRule);
  const all = denyOut.includes('0.0.0.0/0');
  const { host, ip, port } = dest;
  const names = (rules: RefRule[], list: 'allow' | 'deny', name: string) =>
    rules.filter((r) => r.kind !== 'address' && nameCovers(r, name) && portCovers(r, port, list));
  const addresses = (rules: RefRule[], list: 'allow' | 'deny') =>
    rules.filter(
      (r) => r.kind === 'address' && inNetwork(ip!, r.target) && portCovers(r, port, list),
    );
  const result = (verdict: string, list: string, rules: RefRule[]) => ({
    verdict,
    list,
    rules: rules.map((r) => r.entry),
  });
  if (ip !== undefined && ip.startsWith('10.')) return result('deny', 'internal', []);
  if (host !== undefined && names(allow, 'allow', host).length > 0)
    return result('allow', 'allowOut', names(allow, 'allow', host));
  if (ip === undefined) {
    if (names(deny, 'deny', host!).length > 0)
      return result('deny', 'denyOut', names(deny, 'deny', host!));
    return all ? result('deny', 'denyOut', []) : result('allow', 'default', []);
  }
  if (addresses(allow, 'allow').length > 0)
    return result('allow', 'allowOut', addresses(allow, 'allow'));
  const learnedName = learned.get(ip);
  if (host === undefined && learnedName !== undefined) {
    if (names(allow, 'allow', learnedName).length > 0)
      return { verdict: 'allow', list: 'learned', rules: [learnedName] };
    // The firewall cannot read a name: a bare address is denied where its learned name is.
    if (names(deny, 'deny', learnedName).length > 0)
      return result('deny', 'denyOut', names(deny, 'deny', learnedName));
  }
  if (host !== undefined && names(deny, 'deny', host).length > 0)
    return result('deny', 'denyOut', names(deny, 'deny', host));
  const everything = all ? [refRule('0.0.0.0/0')] : [];
  const denied = [
    ...addresses(
      deny.filter((r) => r.entry !== '0.0.0.0/0'),
      'deny',
    ),
    ...everything,
  ];
  if (denied.length > 0) return result('deny', 'denyOut', denied);
  return result('allow', 'default', []);
}

describe('property: decide with ports agrees with a naive reference', () => {
  const nameEntry = fc
    .tuple(fc.constantFrom(...NAMES), fc.boolean(), fc.constantFrom(...PORT_SPECS))
    .map(([name, wildcard, ports]) => `${wildcard ? '*.' : ''}${name}${ports}`);
  const addressEntry = fc
    .tuple(fc.constantFrom(...NETWORKS), fc.constantFrom(...PORT_SPECS))
    .map(([network, ports]) => `${network}${ports}`);
  const entry = fc.oneof(nameEntry, addressEntry);
  const destination = fc.record(
    {
      host: fc.constantFrom(...NAMES, 'd.c.b.a.test'),
      ip: fc.constantFrom(...ADDRESSES),
      port: fc.constantFrom(...PORTS),
    },
    { requiredKeys: [] },
  );
  test('on generated policies and destinations', () => {
    fc.assert(
      fc.property(
        fc.array(entry, { maxLength: 6 }),
        fc.array(entry, { maxLength: 6 }),
        fc.boolean(),
        destination,
        fc.constantFrom(...NAMES),
        (allowOut, denyOut, everything, dest, learnedName) => {
          const deny = everything ? [...denyOut, '0.0.0.0/0'] : denyOut;
          const allowWritten = everything ? allowOut : allowOut.filter((e) => /^[0-9]/.test(e));
          const parsed = parseNetworkConfig({ allowOut: allowWritten, denyOut: deny });
          if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
          const policy = compilePolicy(parsed.value);
          if (dest.host === undefined && dest.ip === undefined) return;
          const learned = new Map([['44.1.2.4', learnedName]]);
          const got = outcome(
            decide(policy, destinationOf(dest), learnedOf([['44.1.2.4', learnedName]])),
          );
          const want = refDecidePorts(allowWritten, deny, dest, learned);
          expect({ verdict: got.verdict, list: got.list }).toEqual({
            verdict: want.verdict,
            list: want.list,
          });
          // The rule named is one of those that cover the destination on its port.
          if (want.rules.length > 0) expect(want.rules).toContain(got.rule);
        },
      ),
      { numRuns: 5000 },
    );
  });
});
