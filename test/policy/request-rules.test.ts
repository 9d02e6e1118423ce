/**
 * Methods and paths in `network.rules`: parsing (every refusal names the key, the rule and the
 * field), deciding (first fitting action wins, headers of fitting rules gather, no action
 * leaves the request to its connection's decision), and the bypass spellings of a path, pinned
 * by a table and by a property against a reference that reads a path as the most lenient
 * origin would.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  allowedPorts,
  deniedPorts,
  canonicalName,
  compileInternalDenyList,
  decide,
  decideRequest,
  type DestinationRules,
  lintPolicy,
  MAX_MATCH_METHODS,
  MAX_RULES_PER_KEY,
  type NetworkRules,
  parseIP,
  parseNetworkConfig,
} from '../../src/policy/index.js';
import { policyOf } from './helpers.js';

/** The one key of `rules` as parsed. */
function parsed(rules: unknown[]): DestinationRules {
  const result = parseNetworkConfig({ rules: { 'api.test': rules } });
  if (!result.ok) throw new Error(result.errors.map((e) => e.message).join('; '));
  return result.value.transforms[0]!;
}

function problems(rules: unknown): string {
  const result = parseNetworkConfig({ rules: { 'api.test': rules } });
  if (result.ok) throw new Error(`expected ${JSON.stringify(rules)} to be refused`);
  return result.errors.map((e) => e.message).join('; ');
}

/** `method target` decided by `rules`: `allow #1`, `allow` (no rule), `deny #2`, `invalid`. */
function verdict(rules: DestinationRules, method: string, target: string): string {
  const decided = decideRequest(rules, method, target);
  if (decided.verdict === 'invalid') return 'invalid';
  return decided.rule === undefined
    ? decided.verdict
    : `${decided.verdict} #${decided.rule.number}`;
}

const GITHUB_READ = parsed([
  { match: { methods: ['GET', 'HEAD'], paths: ['/repos/acme/*'] }, action: 'allow' },
  { action: 'deny' },
]);

describe('deciding a request by its destination rules', () => {
  it.each([
    ['GET', '/repos/acme/x', 'allow #1'],
    ['HEAD', '/repos/acme/x/pulls?state=open', 'allow #1'],
    ['GET', '/repos/acme/', 'allow #1'],
    // An allow fits the path as written: another case is another resource to some origins.
    ['GET', '/repos/ACME/x', 'deny #2'],
    ['POST', '/repos/acme/x', 'deny #2'],
    // Not upper case: origins differ on which method it is.
    ['get', '/repos/acme/x', 'invalid'],
    ['Delete', '/repos/acme/x', 'invalid'],
    ['GET', '/repos/acme', 'deny #2'],
    ['GET', '/repos/other/x', 'deny #2'],
    ['GET', '/', 'deny #2'],
    ['OPTIONS', '*', 'deny #2'],
    ['DELETE', '/repos/acme/x', 'deny #2'],
  ])('%s %s: %s', (method, target, expected) => {
    expect(verdict(GITHUB_READ, method, target)).toBe(expected);
  });

  it('lets a rule naming GET fit HEAD, and refuses a request that overrides its method', () => {
    const noReads = parsed([{ match: { methods: ['GET'] }, action: 'deny' }, { action: 'allow' }]);
    expect(verdict(noReads, 'HEAD', '/x')).toBe('deny #1');
    expect(verdict(noReads, 'POST', '/x')).toBe('allow #2');
    const decided = decideRequest(noReads, 'POST', '/x', 'x-http-method-override');
    expect(decided).toEqual({
      verdict: 'invalid',
      problem: 'the request carries x-http-method-override, which some origins take as its method',
    });
    // Where no rule matches methods, neither the case nor an override matters.
    const byPath = parsed([{ match: { paths: ['/x'] }, action: 'deny' }]);
    expect(decideRequest(byPath, 'post', '/y', 'x-http-method').verdict).toBe('allow');
  });

  it('scopes headers to a path as written: a credential never goes to another case of it', () => {
    const scoped = parsed([
      { match: { paths: ['/t/abc/*'] }, transform: { headers: { Authorization: 'k' } } },
    ]);
    const names = (path: string) => {
      const decided = decideRequest(scoped, 'GET', path);
      return decided.verdict === 'allow' ? decided.headers.map((h) => h.name) : decided.verdict;
    };
    expect(names('/t/abc/x')).toEqual(['Authorization']);
    expect(names('/T/ABC/x')).toEqual([]);
  });

  it('gathers the headers of every fitting rule up to the deciding one', () => {
    const rules = parsed([
      { transform: { headers: { 'X-All': 'a' } } },
      { match: { methods: ['POST'] }, transform: { headers: { 'X-Post': 'p' } } },
      { match: { paths: ['/open/*'] }, action: 'allow', transform: { headers: { 'X-Open': 'o' } } },
      { transform: { headers: { 'X-After': 'z' } } },
    ]);
    const headers = (method: string, path: string) => {
      const decided = decideRequest(rules, method, path);
      return decided.verdict === 'allow' ? decided.headers.map((h) => h.name) : decided.verdict;
    };
    expect(headers('GET', '/open/x')).toEqual(['X-All', 'X-Open']);
    expect(headers('POST', '/open/x')).toEqual(['X-All', 'X-Post', 'X-Open']);
    // No action decided: every fitting rule's headers, E2B's meaning of a transforms list.
    expect(headers('GET', '/closed')).toEqual(['X-All', 'X-After']);
  });

  it('leaves a request no action decides to its connection (E2B transforms alone)', () => {
    const rules = parsed([{ transform: { headers: { A: 'b' } } }]);
    expect(rules.decidesRequests).toBe(false);
    expect(verdict(rules, 'DELETE', '/anything/../at/all')).toBe('allow');
  });

  it('takes match and action inside transform, the form E2B SDK 2.51 sends on', () => {
    const inside = parsed([
      { transform: { match: { methods: ['GET'] }, action: 'allow' } },
      { transform: { action: 'deny' } },
    ]);
    expect(verdict(inside, 'GET', '/x')).toBe('allow #1');
    expect(verdict(inside, 'PUT', '/x')).toBe('deny #2');
  });
});

/**
 * Every spelling here names /admin/x (or something below it) to some origin: lower-case or
 * upper-case, decoded, with dot segments or empty segments resolved, path parameters dropped,
 * backslashes read as slashes. None may pass a rule that denies /admin/*.
 */
const ADMIN_DENIED = parsed([
  { match: { paths: ['/admin/*'] }, action: 'deny' },
  { action: 'allow' },
]);

describe('path spellings cannot pass a rule that denies /admin/*', () => {
  it.each([
    ['/admin/x', 'deny #1'],
    ['/ADMIN/x', 'deny #1'],
    ['/Admin/X', 'deny #1'],
    ['/admin/x?via=query', 'deny #1'],
    ['/admin/', 'deny #1'],
    ['//admin/x', 'invalid'],
    ['/admin//x', 'invalid'],
    ['/./admin/x', 'invalid'],
    ['/public/../admin/x', 'invalid'],
    ['/admin/./x', 'invalid'],
    ['/%61dmin/x', 'invalid'],
    ['/ad%6Din/x', 'invalid'],
    ['/%2e/admin/x', 'invalid'],
    ['/%2E%2E/admin/x', 'invalid'],
    ['/public/%2e%2e/admin/x', 'invalid'],
    ['/admin%2fx', 'invalid'],
    ['/admin%2Fx', 'invalid'],
    ['/public%2f..%2fadmin/x', 'invalid'],
    ['/admin%5cx', 'invalid'],
    ['/public\\..\\admin\\x', 'invalid'],
    ['/admin;jsessionid=1/x', 'invalid'],
    ['/admin%3B/x', 'invalid'],
    ['/%2561dmin/x', 'invalid'],
    ['/admin%00/x', 'invalid'],
    ['/admin/x#frag', 'invalid'],
    ['/admin x', 'invalid'],
    ['/admin%3Ax', 'invalid'],
    ['/admin%40x', 'invalid'],
    ['/%C0%AE%C0%AE/admin/x', 'invalid'],
    ['/adm%C0%AFin/x', 'invalid'],
    ['/admin/%E2%82', 'invalid'],
    ['/admin%C3%A9/x', 'allow #2'],
    ['/admın/x', 'invalid'],
    ['/admin%', 'invalid'],
    ['/admin%zz', 'invalid'],
    ['admin/x', 'invalid'],
    // Not /admin: allowed by the second rule.
    ['/administrator', 'allow #2'],
    ['/public/admin/x', 'allow #2'],
    ['/public/%C3%A9', 'allow #2'],
  ])('%s: %s', (path, expected) => {
    expect(verdict(ADMIN_DENIED, 'GET', path)).toBe(expected);
  });

  /**
   * The most lenient reading any origin gives a path: decoded (twice), backslashes as slashes,
   * path parameters dropped, empty and dot segments resolved, case folded.
   */
  function leniently(path: string): string {
    let decoded = path;
    for (let round = 0; round < 2; round++)
      decoded = decoded.replace(/%([0-9a-fA-F]{2})/g, (_, hex: string) =>
        String.fromCharCode(Number.parseInt(hex, 16)),
      );
    const segments: string[] = [];
    for (const raw of decoded.replace(/\\/g, '/').split('/')) {
      const segment = raw.split(';')[0]!;
      if (segment === '' || segment === '.') continue;
      if (segment === '..') segments.pop();
      else segments.push(segment);
    }
    return `/${segments.join('/')}`.toLowerCase();
  }

  it('denies or refuses every random path a lenient origin reads as /admin/...', () => {
    // Mostly the plain spelling, so that each trick is tried alone as well as with others.
    const mostly = <T>(plain: T, ...tricks: T[]) =>
      fc.oneof(
        { arbitrary: fc.constant(plain), weight: 3 },
        { arbitrary: fc.constantFrom(...tricks), weight: 1 },
      );
    const separator = mostly('/', '//', '\\', '%2f', '%2F', '%5c', '%252f');
    const dots = mostly('..', '%2e%2e', '.%2e', '%2E.', '%252e%252e');
    // Pieces a lenient origin reads as nothing at all.
    const nothing = fc.oneof(
      fc.tuple(separator, dots).map(([sep, up]) => `/x${sep}${up}`),
      separator.map((sep) => `${sep}.`),
      fc.constant('/;p=1'),
      fc.constant('/'),
    );
    const admin = mostly('admin', 'ADMIN', '%61dmin', 'ad%6Din', '%2561dmin', 'admin;p=1');
    fc.assert(
      fc.property(
        fc.array(nothing, { maxLength: 3 }),
        separator,
        admin,
        separator,
        fc.constantFrom('x', 'X', 'x?q=1', '%78'),
        (lead, first, name, second, tail) => {
          const path = `${lead.join('')}${first}${name}${second}${tail}`;
          const query = path.search(/[?#]/);
          const read = leniently(query < 0 ? path : path.slice(0, query));
          expect(read, path).toMatch(/^\/admin\//);
          expect(verdict(ADMIN_DENIED, 'GET', path), path).not.toMatch(/^allow/);
        },
      ),
      { numRuns: 5000 },
    );
  });
});

describe('parsing match and action', () => {
  it.each([
    [[{}], 'rule 0 is empty: it matches nothing and sets nothing'],
    [[{}], 'write match and action inside transform'],
    [[{ match: { methods: ['GET'] } }], 'rule 0 has a match but neither an action nor headers'],
    [[{ action: 'block' }], 'rule 0: action "block" is neither "allow" nor "deny"'],
    [[{ match: {}, action: 'deny' }], 'rule 0: match names neither methods nor paths'],
    [[{ match: [], action: 'deny' }], 'match must be an object with methods, paths or both'],
    [[{ match: { verbs: ['GET'] }, action: 'deny' }], 'match has unknown field "verbs"'],
    [[{ match: { methods: [] }, action: 'deny' }], 'match.methods must be a non-empty array'],
    [
      [{ match: { methods: ['GE T'] }, action: 'deny' }],
      'match.methods[0] "GE T" is not an HTTP method',
    ],
    [[{ match: { methods: [7] }, action: 'deny' }], 'match.methods[0] must be a string'],
    [
      [{ match: { paths: ['repos/*'] }, action: 'deny' }],
      'match.paths[0] "repos/*" is not a path a request could send: it does not begin with "/"',
    ],
    [[{ match: { paths: ['/a?b=1'] }, action: 'deny' }], 'the query is not matched'],
    [[{ match: { paths: ['/a/../b'] }, action: 'deny' }], 'it has a ".." segment'],
    [[{ match: { paths: ['/a//b'] }, action: 'deny' }], 'it has an empty segment'],
    [[{ match: { paths: ['/%61'] }, action: 'deny' }], '%61 at character 2 escapes "a"'],
    [
      [{ match: { paths: [`/${'a'.repeat(1024)}`] }, action: 'deny' }],
      'longer than 1024 characters',
    ],
    [
      [
        {
          match: { methods: Array.from({ length: MAX_MATCH_METHODS + 1 }, (_, i) => `M${i}`) },
          action: 'deny',
        },
      ],
      `match.methods has ${MAX_MATCH_METHODS + 1} items; the limit is ${MAX_MATCH_METHODS}`,
    ],
    [
      [{ match: { methods: ['GET'] }, transform: { match: { methods: ['PUT'] } }, action: 'deny' }],
      'rule 0: match is written both beside and inside transform',
    ],
    [[{ when: 'always' }], 'rule 0 has unknown field "when"'],
    [[{ transform: { act: 'deny' } }], 'rule 0\'s transform has unknown field "act"'],
    [
      Array.from({ length: MAX_RULES_PER_KEY + 1 }, () => ({ action: 'allow' })),
      `it has ${MAX_RULES_PER_KEY + 1} rules; the limit is ${MAX_RULES_PER_KEY}`,
    ],
  ])('%j is refused: %s', (rules, message) => {
    const text = problems(rules);
    expect(text).toContain(message);
    expect(text).toMatch(/^invalid rule api\.test \(rules\["api\.test"\]\): /);
  });

  it('keeps methods upper-case and once each', () => {
    const rules = parsed([{ match: { methods: ['get', 'GET', 'Post'] }, action: 'allow' }]);
    expect(rules.rules[0]!.match!.methods).toEqual(['GET', 'POST']);
    expect(rules.matchesPaths).toBe(false);
    expect(rules.decidesRequests).toBe(true);
  });
});

describe('an address given for a name whose rules decide requests', () => {
  // Nothing internal: the addresses are documentation ones.
  const policy = policyOf(
    {
      allowOut: ['api.test', 'cdn.test'],
      denyOut: ['0.0.0.0/0'],
      rules: {
        'api.test': [{ match: { methods: ['GET'] }, action: 'allow' }, { action: 'deny' }],
        'cdn.test': [{ transform: { headers: { 'X-Team': 'moat' } } }],
      },
    },
    compileInternalDenyList([]),
  );
  const address = (text: string) => {
    const parsed = parseIP(text);
    if (!parsed.ok) throw new Error(parsed.error);
    return parsed.value;
  };
  const learnedFor = (...names: string[]) => ({
    names: () => names.map((n) => canonicalName(n)).flatMap((n) => (n.ok ? [n.value] : [])),
  });

  it('does not open a bare-address connection: the name is reached by name, through Moat', () => {
    expect(
      decide(policy, { ip: address('198.51.100.7'), port: 443 }, learnedFor('api.test')),
    ).toEqual({
      verdict: 'deny',
      list: 'rules',
      rule: 'api.test',
      reason:
        'the address was given to this sandbox by DNS for api.test, whose network.rules decide each request by method and path: connect to api.test by name',
    });
    // Header rules alone decide no request: the address opens as any learned one.
    expect(
      decide(policy, { ip: address('198.51.100.8'), port: 443 }, learnedFor('cdn.test')).list,
    ).toBe('learned');
  });

  it('opens no port of its addresses in the firewall', () => {
    const name = (text: string) => {
      const parsed = canonicalName(text);
      if (!parsed.ok) throw new Error(parsed.error);
      return parsed.value;
    };
    expect(allowedPorts(policy, [name('api.test')])).toEqual([]);
    expect(allowedPorts(policy, [name('cdn.test')])).toBeUndefined();
    // And closes every port of them, which matters where nothing else denies the address.
    expect(deniedPorts(policy, [name('api.test')])).toBe('every');
    expect(deniedPorts(policy, [name('cdn.test')])).toEqual([]);
  });

  it('holds a bare address under a default-allow policy too, where no allowOut names the name', () => {
    const open = policyOf(
      {
        rules: {
          'api.test': [{ match: { methods: ['GET'] }, action: 'allow' }, { action: 'deny' }],
        },
      },
      compileInternalDenyList([]),
    );
    const bare = { ip: address('198.51.100.7'), port: 22 };
    expect(decide(open, bare, learnedFor('api.test')).list).toBe('rules');
    expect(decide(open, bare, learnedFor('api.test')).verdict).toBe('deny');
    // Another name the address was learned for, allowed by allowOut, still opens it; a name
    // allowed only by default does not.
    expect(decide(policy, bare, learnedFor('api.test', 'cdn.test')).list).toBe('learned');
    expect(decide(open, bare, learnedFor('api.test', 'other.test')).verdict).toBe('deny');
    expect(decide(open, bare, learnedFor('other.test')).list).toBe('default');
  });
});

describe('lint of method and path rules', () => {
  const warnings = (config: object) =>
    lintPolicy(
      (parseNetworkConfig(config) as { ok: true; value: NetworkRules }).value,
      compileInternalDenyList([]),
    ).map((w) => w.message);

  it("warns of a deny of /admin/* that lets /admin through, and of a wildcard key's apex", () => {
    expect(
      warnings({
        allowOut: ['x.test', '*.x.test'],
        denyOut: ['0.0.0.0/0'],
        rules: {
          '*.x.test': [
            { match: { paths: ['/admin/*', '/ops/*', '/ops'] }, action: 'deny' },
            { match: { paths: ['/open/*'] }, action: 'allow' },
          ],
        },
      }),
    ).toEqual([
      'rules["*.x.test"] #1 denies /admin/* but not /admin itself; add "/admin" to its paths if that was meant',
      'rules["*.x.test"] decides requests below x.test but not to x.test itself, which allowOut allows with no rules; add a "x.test" key if that was meant',
    ]);
    expect(
      warnings({
        allowOut: ['x.test', '*.x.test'],
        denyOut: ['0.0.0.0/0'],
        rules: {
          'x.test': [{ action: 'deny' }],
          '*.x.test': [{ match: { paths: ['/admin', '/admin/*'] }, action: 'deny' }],
        },
      }),
    ).toEqual([]);
  });
});
