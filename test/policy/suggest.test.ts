/**
 * Learning a policy from observed destinations (`suggestPolicy`, what `moat suggest` prints):
 * the wildcard and public-suffix rules, presets, names before addresses, flow counts, and the
 * property that matters: the suggestion allows everything observed, and each entry is there for
 * something observed.
 */
import fc from 'fast-check';
import { getPublicSuffix } from 'tldts';
import { describe, expect, it } from 'vitest';
import { loadPresets } from '../../src/config-presets.js';
import {
  canonicalName,
  compileInternalDenyList,
  compilePolicy,
  decide,
  type ObservedDestination,
  parseIP,
  parseNetworkConfig,
  suggestPolicy,
} from '../../src/policy/index.js';

const loaded = loadPresets(undefined);
if (!loaded.ok) throw new Error(loaded.error);
const PRESETS = loaded.value;

const names = (...list: string[]): ObservedDestination[] =>
  list.map((name) => ({ name, address: null, port: null, flows: 1 }));
const entries = (observed: ObservedDestination[]) =>
  suggestPolicy(observed, PRESETS).allowOut.map((e) => e.entry);

describe('suggestPolicy', () => {
  it.each([
    ['one name', names('api.example.com'), ['api.example.com']],
    [
      'two siblings stay names',
      names('a.example.com', 'b.example.com'),
      ['a.example.com', 'b.example.com'],
    ],
    [
      'three siblings under one registrable domain make a wildcard',
      names('a.example.com', 'b.example.com', 'c.x.example.com'),
      ['*.example.com'],
    ],
    [
      'the apex is not under its wildcard: it stays a name',
      names('example.com', 'a.example.com', 'b.example.com', 'c.example.com'),
      ['*.example.com', 'example.com'],
    ],
    [
      'never a wildcard on a public suffix (ICANN section)',
      names('a.co.uk', 'b.co.uk', 'c.co.uk'),
      ['a.co.uk', 'b.co.uk', 'c.co.uk'],
    ],
    [
      'never a wildcard on a public suffix (private section)',
      names('alice.github.io', 'bob.github.io', 'carol.github.io'),
      ['alice.github.io', 'bob.github.io', 'carol.github.io'],
    ],
    [
      'siblings below a private suffix take the wildcard of their own registrable domain',
      names('a.alice.github.io', 'b.alice.github.io', 'c.alice.github.io'),
      ['*.alice.github.io'],
    ],
    [
      'a preset that covers two or more names stands for them',
      names('pypi.org', 'files.pythonhosted.org', 'example.com'),
      ['preset:pypi', 'example.com'],
    ],
    ['a preset covering one name only is not used', names('pypi.org'), ['pypi.org']],
    [
      'names before addresses, addresses with no name only',
      [
        { name: null, address: '198.18.0.9', port: null, flows: 1 },
        { name: 'mirror.test', address: '198.18.0.7', port: null, flows: 1 },
        { name: null, address: '198.18.0.7', port: null, flows: 1 },
        { name: null, address: '2001:db8::1', port: null, flows: 1 },
      ],
      ['mirror.test', '198.18.0.9', '2001:db8::1'],
    ],
    [
      'spellings of one name are one entry',
      names('Example.COM', 'example.com.', 'example.com'),
      ['example.com'],
    ],
    ['nothing observed: nothing allowed', [], []],
  ])('%s', (_, observed, expected) => {
    expect(entries(observed)).toEqual(expected);
  });

  const at = (name: string | null, address: string | null, port: number | null, flows = 1) => ({
    name,
    address,
    port,
    flows,
  });

  it.each([
    ['one port', [at('api.test', null, null), at('api.test', '198.18.0.5', 443)], ['api.test:443']],
    [
      'two ports: one entry each, the DNS question counted with the first',
      [at('git.test', null, null), at('git.test', null, 22), at('git.test', null, 443)],
      ['git.test:22', 'git.test:443'],
    ],
    [
      'more ports than MAX_PORTS_PER_ENTRY: every port',
      [1, 2, 3, 4, 5].map((i) => at('many.test', null, 8000 + i)),
      ['many.test'],
    ],
    ['asked but never connected: every port', [at('dns-only.test', null, null)], ['dns-only.test']],
    [
      'a wildcard on the ports its names used',
      ['a', 'b', 'c'].map((label) => at(`${label}.cdn.test`, null, 443)),
      ['*.cdn.test:443'],
    ],
    [
      'an address with its port, IPv6 in brackets',
      [at(null, '198.18.0.9', 5432), at(null, '2001:db8::1', 443)],
      ['198.18.0.9:5432', '[2001:db8::1]:443'],
    ],
    [
      'a preset as it is, whatever the ports',
      [at('pypi.org', null, 443), at('files.pythonhosted.org', null, 443)],
      ['preset:pypi'],
    ],
  ])('ports: %s', (_, observed, expected) => {
    expect(entries(observed)).toEqual(expected);
  });

  it('counts the flows each entry covers and names what it stands for', () => {
    const suggestion = suggestPolicy(
      [
        { name: 'pypi.org', address: null, port: null, flows: 3 },
        { name: 'files.pythonhosted.org', address: null, port: null, flows: 5 },
        { name: 'a.cdn.test', address: null, port: null, flows: 1 },
        { name: 'b.cdn.test', address: null, port: null, flows: 1 },
        { name: 'c.cdn.test', address: null, port: null, flows: 2 },
        { name: null, address: '198.18.0.9', port: null, flows: 4 },
      ],
      PRESETS,
    );
    expect(suggestion).toEqual({
      allowOut: [
        { entry: 'preset:pypi', flows: 8, covers: ['files.pythonhosted.org', 'pypi.org'] },
        { entry: '*.cdn.test', flows: 4, covers: ['a.cdn.test', 'b.cdn.test', 'c.cdn.test'] },
        { entry: '198.18.0.9', flows: 4, covers: ['198.18.0.9'] },
      ],
      denyOut: ['0.0.0.0/0'],
    });
  });

  it('learns from a flow log a hostile sandbox filled with names under one domain in linear time', () => {
    // A sandbox can make a new name per request (random subdomains, as DNS tunnels do): a day
    // of a flow log holds a great many. Each name is gathered under its domain once, not by
    // copying the names gathered so far (60,000 names took over 30 s that way; this takes < 1 s).
    const many = Array.from({ length: 60_000 }, (_, i) => `x${i}.exfil.test`);
    const started = performance.now();
    const suggestion = suggestPolicy(names(...many, 'a.cdn.test', 'b.cdn.test'));
    expect(performance.now() - started).toBeLessThan(10_000);
    expect(suggestion.allowOut.map((e) => [e.entry, e.flows])).toEqual([
      ['*.exfil.test', 60_000],
      ['a.cdn.test', 1],
      ['b.cdn.test', 1],
    ]);
  }, 60_000);

  it('allows everything observed, denies a name never seen, and spends no entry on nothing (property)', () => {
    const label = fc.constantFrom('a', 'b', 'c', 'd', 'www', 'api');
    const domain = fc.constantFrom('example.com', 'co.uk', 'github.io', 'test', 'pythonhosted.org');
    const name = fc
      .tuple(fc.array(label, { minLength: 0, maxLength: 2 }), domain)
      .map(([labels, d]) => [...labels, d].join('.'));
    const address = fc.ipV4().map((ip) => `198.18.${ip.split('.').slice(2).join('.')}`);
    // Few ports, so names share them; sometimes more than an entry names one by one.
    const port = fc.option(fc.constantFrom(22, 80, 443, 5432, 8000, 8001, 8002), { nil: null });
    const observed = fc.array(
      fc.oneof(
        fc.tuple(name, port).map(([n, p]) => ({ name: n, address: null, port: p, flows: 1 })),
        fc.tuple(address, port).map(([a, p]) => ({ name: null, address: a, port: p, flows: 1 })),
      ),
      { maxLength: 20 },
    );
    fc.assert(
      fc.property(observed, (seen) => {
        const suggestion = suggestPolicy(seen, PRESETS);
        const parsed = parseNetworkConfig(
          { allowOut: suggestion.allowOut.map((e) => e.entry), denyOut: suggestion.denyOut },
          { presets: PRESETS },
        );
        if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
        // The internal deny list is decided before any policy: records it decided are not learned.
        const policy = compilePolicy(parsed.value, compileInternalDenyList([]));
        const host = (text: string) => {
          const canonical = canonicalName(text);
          if (!canonical.ok) throw new Error(canonical.error);
          return canonical.value;
        };
        for (const { name: n, address: a, port: p } of seen) {
          const ip = a === null ? undefined : parseIP(a);
          const destination = {
            ...(n === null ? { ip: ip?.ok ? ip.value : undefined } : { host: host(n) }),
            ...(p === null ? {} : { port: p }),
          };
          expect(decide(policy, destination).verdict, `${n ?? a}:${p}`).toBe('allow');
        }
        // A port no flow of a port-scoped name used stays closed.
        for (const entry of suggestion.allowOut) {
          const scopedTo = /^([^*[\]:]+):(\d+)$/.exec(entry.entry);
          if (scopedTo === null || parseIP(scopedTo[1]!).ok) continue;
          // (No flow used port 9, and each name is in one entry only.)
          expect(decide(policy, { host: host(scopedTo[1]!), port: 9 }).verdict).toBe('deny');
        }
        expect(decide(policy, { host: host('never-seen.invalid') }).verdict).toBe('deny');
        for (const entry of suggestion.allowOut) {
          expect(entry.flows).toBeGreaterThan(0);
          expect(entry.covers.length).toBeGreaterThan(0);
          if (entry.entry.startsWith('*.')) {
            const domain = entry.entry.slice(2);
            expect(getPublicSuffix(domain, { allowPrivateDomains: true })).not.toBe(domain);
            expect(entry.covers.length).toBeGreaterThanOrEqual(3);
          }
        }
      }),
      { numRuns: 300 },
    );
  });
});
