/**
 * Report mode (`network.mode: "report"`, a Moat extension): the sandbox's own rules deny
 * nothing and every decision they would have denied says so in `wouldDeny`; the internal deny
 * list and invalid destinations stay denied. Tables, the grammar, and a property: a report
 * policy decides every destination as the same rules enforced, but lets the denials through.
 */
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import {
  canonicalName,
  compileInternalDenyList,
  decide,
  deniedPorts,
  destinationRulesFor,
  parseNetworkConfig,
  requestDecision,
} from '../../src/policy/index.js';
import { destinationOf, learnedOf, policyOf } from './helpers.js';

const RULES = {
  allowOut: ['a.test', '44.1.2.0/24:5432'],
  denyOut: ['0.0.0.0/0', 'evil.test'],
  rules: { 'api.test': [{ match: { methods: ['GET'] }, action: 'allow' }, { action: 'deny' }] },
};
const enforced = policyOf(RULES);
const reporting = policyOf({ ...RULES, mode: 'report' });

const name = (text: string) => {
  const parsed = canonicalName(text);
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.value;
};

describe('report mode: the decision table', () => {
  const cases: Array<[string, { host?: string; ip?: string; port?: number }, string, string]> = [
    ['an allowed name is allowed as before', { host: 'a.test', port: 443 }, 'allow', 'allowOut'],
    ['a name ALL_TRAFFIC denies', { host: 'b.test', port: 443 }, 'allow', 'report'],
    ['a name denyOut names', { host: 'evil.test', port: 443 }, 'allow', 'report'],
    ['an address ALL_TRAFFIC denies', { ip: '44.9.9.9', port: 22 }, 'allow', 'report'],
    ['the wrong port of a port rule', { ip: '44.1.2.3', port: 5433 }, 'allow', 'report'],
    ['an internal address stays denied', { ip: '169.254.169.254', port: 80 }, 'deny', 'internal'],
    ['a loopback address stays denied', { ip: '127.0.0.1', port: 80 }, 'deny', 'internal'],
    ['a name query (DNS) ALL_TRAFFIC denies', { host: 'b.test' }, 'allow', 'report'],
  ];
  test.each(cases)('%s', (_, destination, verdict, list) => {
    const got = decide(reporting, destinationOf(destination));
    expect({ verdict: got.verdict, list: got.list }).toEqual({ verdict, list });
    const before = decide(enforced, destinationOf(destination));
    if (list === 'report') {
      expect(before.verdict).toBe('deny');
      expect(got.wouldDeny).toEqual({
        list: before.list,
        rule: before.rule,
        reason: before.reason,
      });
      expect(got.rule).toBe(before.rule);
      expect(got.reason).toBe(`report mode lets it through: ${before.reason}`);
    } else {
      expect(got).toEqual(before);
      expect(got.wouldDeny).toBeUndefined();
    }
  });

  test('an invalid destination stays denied', () => {
    expect(decide(reporting, { host: name('a.test'), port: 70_000 }).verdict).toBe('deny');
    expect(decide(reporting, {}).list).toBe('invalid');
  });

  test('a bare address whose learned name has request rules is let through, and said so', () => {
    const open = policyOf(
      {
        mode: 'report',
        rules: {
          'api.test': [{ match: { methods: ['GET'] }, action: 'allow' }, { action: 'deny' }],
        },
      },
      compileInternalDenyList([]),
    );
    const got = decide(
      open,
      destinationOf({ ip: '44.1.2.3', port: 22 }),
      learnedOf([['44.1.2.3', 'api.test']]),
    );
    expect(got.verdict).toBe('allow');
    expect(got.wouldDeny?.list).toBe('rules');
    // Nothing goes to the firewall's learned denials.
    expect(deniedPorts(open, [name('api.test')])).toEqual([]);
    expect(deniedPorts(enforced, [name('api.test')])).toBe('every');
  });

  test('a request a rule denies is let through with the rule named; an invalid one is not', () => {
    const host = name('api.test');
    const connection = decide(reporting, { host, port: 443 });
    const rules = destinationRulesFor(reporting, host)!;
    const post = requestDecision(reporting, rules, host, 'POST', '/repos/x', connection);
    expect(post.verdict).toBe('allow');
    expect(post.list).toBe('report');
    expect(post.wouldDeny).toMatchObject({ list: 'rules', rule: 'api.test #2' });
    expect(requestDecision(reporting, rules, host, 'delete', '/x', connection).list).toBe(
      'invalid',
    );
    const enforcing = requestDecision(
      enforced,
      destinationRulesFor(enforced, host)!,
      host,
      'POST',
      '/repos/x',
      decide(enforced, { host, port: 443 }),
    );
    expect(enforcing.verdict).toBe('deny');
  });
});

describe('report mode: the grammar', () => {
  const parse = (config: object) => parseNetworkConfig(config);

  test('mode is enforce or report; left out (or null), enforce', () => {
    const modeOf = (result: ReturnType<typeof parse>) => (result.ok ? result.value.mode : 'error');
    expect(modeOf(parse({}))).toBe('enforce');
    expect(modeOf(parse({ mode: null }))).toBe('enforce');
    expect(modeOf(parse({ mode: 'report' }))).toBe('report');
    expect(modeOf(parse({ mode: 'enforce' }))).toBe('enforce');
  });

  test.each([['audit'], ['REPORT'], [true], [{}]])('refuses mode %j, naming it', (mode) => {
    const parsed = parse({ mode });
    expect(parsed.ok).toBe(false);
    if (parsed.ok) return;
    expect(parsed.errors).toEqual([
      {
        at: 'mode',
        message: `mode must be "enforce" or "report" (it is ${JSON.stringify(mode)})`,
      },
    ]);
  });
});

describe('report mode: property', () => {
  const entries = ['a.test', '*.b.test', '44.1.2.0/24', '44.1.2.3:22', 'c.test:443', '44.0.0.0/8'];
  const destination = fc.record(
    {
      host: fc.constantFrom('a.test', 'x.b.test', 'c.test', 'd.test'),
      ip: fc.constantFrom('44.1.2.3', '44.1.9.9', '45.0.0.1', '10.1.2.3', '127.0.0.1'),
      port: fc.constantFrom(22, 80, 443, 5432),
    },
    { requiredKeys: [] },
  );
  test('decides as the enforced policy, with every denial but internal and invalid let through', () => {
    fc.assert(
      fc.property(
        fc.subarray(entries),
        fc.subarray(['44.1.0.0/16', 'd.test', '45.0.0.0/8:443', 'a.test:80']),
        fc.boolean(),
        destination,
        (allowOut, denyOut, all, dest) => {
          if (dest.host === undefined && dest.ip === undefined) return;
          const deny = all ? [...denyOut, '0.0.0.0/0'] : denyOut;
          const allow = all ? allowOut : allowOut.filter((e) => /^[0-9]/.test(e));
          const config = { allowOut: allow, denyOut: deny };
          const before = decide(policyOf(config), destinationOf(dest));
          const after = decide(policyOf({ ...config, mode: 'report' }), destinationOf(dest));
          if (before.verdict === 'allow' || ['internal', 'invalid'].includes(before.list)) {
            expect(after).toEqual(before);
            return;
          }
          expect(after.verdict).toBe('allow');
          expect(after.list).toBe('report');
          expect(after.wouldDeny).toEqual({
            list: before.list,
            rule: before.rule,
            reason: before.reason,
          });
        },
      ),
      { numRuns: 2000 },
    );
  });
});
