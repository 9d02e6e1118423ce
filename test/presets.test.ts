/**
 * Presets (`preset:NAME` in allowOut): the files shipped in policies/presets/, the operator's
 * folder, preset-file validation, expansion in the one normaliser and its errors, and a property:
 * a policy with `preset:X` decides every destination as the same policy with X's entries written.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { afterAll, describe, expect, it, test } from 'vitest';
import { pino } from 'pino';
import { startMoat } from '../src/app/index.js';
import { loadConfig } from '../src/config.js';
import { loadPresets, SHIPPED_PRESETS_DIR } from '../src/config-presets.js';
import {
  compileInternalDenyList,
  compilePolicy,
  decide,
  lintPolicy,
  type Preset,
  parseNetworkConfig,
  parsePresetFile,
  type PresetTable,
  presetTable,
} from '../src/policy/index.js';
import { destinationOf } from './policy/helpers.js';

const folders: string[] = [];
afterAll(() => folders.forEach((folder) => rmSync(folder, { recursive: true, force: true })));

/** A folder of preset files, removed after the suite. */
function presetFolder(files: Record<string, unknown>): string {
  const folder = mkdtempSync(path.join(os.tmpdir(), 'moat-presets-'));
  folders.push(folder);
  for (const [name, json] of Object.entries(files))
    writeFileSync(path.join(folder, name), JSON.stringify(json));
  return folder;
}

const presetJson = (name: string, allowOut: unknown[], extra: Record<string, unknown> = {}) => ({
  name,
  version: 1,
  description: `${name} for tests`,
  allowOut,
  ...extra,
});

function tableOf(...presets: Array<ReturnType<typeof presetJson>>): PresetTable {
  const parsed = presets.map((json) => {
    const preset = parsePresetFile(json, `${json.name}.json`);
    if (!preset.ok) throw new Error(JSON.stringify(preset.errors));
    return preset.value;
  });
  const table = presetTable(parsed);
  if (!table.ok) throw new Error(JSON.stringify(table.errors));
  return table.value;
}

const SHIPPED = (() => {
  const loaded = loadPresets(undefined);
  if (!loaded.ok) throw new Error(loaded.error);
  return loaded.value;
})();

const policyFile = (name: string) =>
  (JSON.parse(readFileSync(`policies/${name}.json`, 'utf8')) as { allowOut: string[] }).allowOut;

describe('the shipped presets', () => {
  it('holds at least the presets issue 34 names, each file named as its preset', () => {
    expect([...SHIPPED.keys()].sort()).toEqual(
      expect.arrayContaining([
        'crates',
        'debian',
        'docker-hub',
        'github',
        'go',
        'huggingface',
        'npm',
        'pypi',
      ]),
    );
    expect(readdirSync(SHIPPED_PRESETS_DIR).sort()).toEqual(
      [...SHIPPED.keys()].map((name) => `${name}.json`).sort(),
    );
  });

  // The presets reuse the hosts the policy files chose, so the two never disagree.
  test.each([
    ['pypi', 'pypi'],
    ['npm', 'npm'],
    ['go', 'go-modules'],
    ['debian', 'debian-apt'],
    ['github', 'github'],
  ])('preset:%s names exactly the hosts of policies/%s.json', (preset, file) => {
    expect(SHIPPED.get(preset)!.entries).toEqual(policyFile(file));
  });

  it("preset:crates names package-managers.json's Rust hosts", () => {
    const crates = SHIPPED.get('crates')!.entries;
    expect(policyFile('package-managers')).toEqual(expect.arrayContaining([...crates]));
    expect(crates).toEqual(expect.arrayContaining(['crates.io', 'static.rust-lang.org']));
  });

  it('every shipped preset has a description saying what it leaves out', () => {
    for (const preset of SHIPPED.values()) expect(preset.description).toMatch(/Left out/);
  });

  it('every shipped preset is lint-clean as a policy (no repeats, no public-suffix wildcards)', () => {
    for (const name of SHIPPED.keys()) {
      const parsed = parseNetworkConfig(
        { allowOut: [`preset:${name}`], denyOut: ['0.0.0.0/0'] },
        { presets: SHIPPED },
      );
      if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
      expect(lintPolicy(parsed.value, compileInternalDenyList()), name).toEqual([]);
    }
  });
});

describe('preset files', () => {
  test.each<[string, unknown, RegExp]>([
    [
      'an IPv4 address',
      presetJson('x', ['1.2.3.4']),
      /x\.json: allowOut\[0\] "1\.2\.3\.4" is an address or CIDR/,
    ],
    [
      'a CIDR',
      presetJson('x', ['pypi.org', '140.82.112.0/20']),
      /x\.json: allowOut\[1\] "140\.82\.112\.0\/20" is an address or CIDR/,
    ],
    [
      'ALL_TRAFFIC',
      presetJson('x', ['ALL_TRAFFIC']),
      /x\.json: invalid allowed address ALL_TRAFFIC \(allowOut\[0\]\): the unspecified network cannot be allowed/,
    ],
    [
      'port 0',
      presetJson('x', ['pypi.org:0']),
      /x\.json: invalid allowed domain pypi\.org:0 \(allowOut\[0\]\): port "0" is not a whole number from 1 to 65535/,
    ],
    [
      'an address with a port',
      presetJson('x', ['140.82.112.3:22']),
      /x\.json: allowOut\[0\] "140\.82\.112\.3:22" is an address or CIDR/,
    ],
    [
      'a bad name',
      presetJson('x', ['bad..name']),
      /x\.json: invalid allowed domain bad\.\.name \(allowOut\[0\]\)/,
    ],
    [
      'another preset',
      presetJson('x', ['preset:pypi']),
      /x\.json: allowOut\[0\] "preset:pypi": a preset cannot name another preset/,
    ],
    [
      'a bad preset name',
      presetJson('Py_Pi', ['pypi.org']),
      /Py_Pi\.json: name must be lower-case letters/,
    ],
    [
      'no version',
      { name: 'x', description: 'd', allowOut: ['pypi.org'] },
      /x\.json: version must be a whole number from 1, not undefined/,
    ],
    [
      'a fractional version',
      presetJson('x', ['pypi.org'], { version: 1.5 }),
      /version must be a whole number from 1, not 1\.5/,
    ],
    ['no entries', presetJson('x', []), /allowOut must be a non-empty array/],
    [
      'an unknown field',
      presetJson('x', ['pypi.org'], { denyOut: ['0.0.0.0/0'] }),
      /unknown field "denyOut"/,
    ],
    ['not an object', ['pypi.org'], /a preset must be a JSON object/],
  ])('refuses %s, naming the file and index', (_what, json, message) => {
    const name = (json as { name?: string }).name ?? 'x';
    const parsed = parsePresetFile(json, `${name}.json`);
    expect(parsed.ok).toBe(false);
    if (!parsed.ok) expect(parsed.errors.map((e) => e.message).join('; ')).toMatch(message);
  });

  it('accepts names and wildcards, canonical or not, with or without ports', () => {
    const entries = ['Pypi.org', '*.example.com', 'github.com:22', '*.example.org:8000-8100'];
    const parsed = parsePresetFile(presetJson('x', entries), 'x.json');
    expect(parsed.ok && parsed.value.entries).toEqual(entries);
  });

  it('refuses two presets of one name, naming both files', () => {
    const one = {
      ...(parsePresetFile(presetJson('x', ['a.test']), 'a/x.json') as { value: Preset }).value,
    };
    const two = { ...one, source: 'b/x.json' };
    const table = presetTable([one, two]);
    expect(table.ok).toBe(false);
    if (!table.ok)
      expect(table.errors[0]!.message).toMatch(
        /"x" is defined twice: in a\/x\.json and in b\/x\.json/,
      );
  });

  it('loads an operator folder beside the shipped one; a shipped name there stops the load', () => {
    const extra = presetFolder({
      'internal-git.json': presetJson('internal-git', ['git.corp.example']),
    });
    const loaded = loadPresets(extra);
    expect(loaded.ok && loaded.value.get('internal-git')?.entries).toEqual(['git.corp.example']);
    expect(loaded.ok && loaded.value.has('pypi')).toBe(true);

    const clash = presetFolder({ 'pypi.json': presetJson('pypi', ['mirror.corp.example']) });
    const refused = loadPresets(clash);
    expect(refused.ok).toBe(false);
    if (!refused.ok) {
      expect(refused.error).toContain(
        `in ${path.join(SHIPPED_PRESETS_DIR, 'pypi.json')} and in ${path.join(clash, 'pypi.json')}`,
      );
    }
  });

  it('moat serve does not start with a presets folder that reuses a shipped name', async () => {
    const clash = presetFolder({ 'go.json': presetJson('go', ['goproxy.corp.example']) });
    const config = loadConfig({ flags: { 'presets-dir': clash, 'log-level': 'silent' } });
    if (!config.ok) throw new Error(config.error);
    await expect(startMoat(config.value, pino({ level: 'silent' }))).rejects.toThrow(
      `preset "go" is defined twice: in ${path.join(SHIPPED_PRESETS_DIR, 'go.json')} and in ${path.join(clash, 'go.json')}`,
    );
  });

  it('refuses a file whose name differs from its preset, a bad file, and a missing folder', () => {
    const misnamed = presetFolder({ 'a.json': presetJson('b', ['b.test']) });
    expect(loadPresets(misnamed)).toMatchObject({
      ok: false,
      error: expect.stringMatching(/its name is "b"; name the file b\.json/),
    });
    const bad = presetFolder({ 'c.json': presetJson('c', ['10.0.0.0/8']) });
    expect(loadPresets(bad)).toMatchObject({
      ok: false,
      error: expect.stringContaining(
        `preset file ${path.join(bad, 'c.json')}: allowOut[0] "10.0.0.0/8" is an address or CIDR`,
      ),
    });
    expect(loadPresets('/nonexistent/moat-presets')).toMatchObject({
      ok: false,
      error: expect.stringMatching(/cannot read presets folder \/nonexistent\/moat-presets/),
    });
  });
});

describe('preset:NAME in a network configuration', () => {
  const presets = tableOf(
    presetJson('pkgs', ['pypi.org', '*.pythonhosted.org']),
    presetJson('hub', ['hub.test']),
  );
  const parse = (config: unknown) => parseNetworkConfig(config, { presets });
  const errors = (config: unknown) => {
    const parsed = parse(config);
    return parsed.ok ? [] : parsed.errors.map((problem) => problem.message);
  };

  it('expands into rules at the entry index, named as the preset and its entry', () => {
    const parsed = parse({
      allowOut: ['a.test', 'preset:pkgs', 'preset:pkgs'],
      denyOut: ['0.0.0.0/0'],
    });
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
    expect(parsed.value.allowOut.map((rule) => [rule.index, rule.entry])).toEqual([
      [0, 'a.test'],
      [1, 'pypi.org'],
      [1, '*.pythonhosted.org'],
      [2, 'pypi.org'],
      [2, '*.pythonhosted.org'],
    ]);
    expect(parsed.value.presets).toEqual([
      { name: 'pkgs', version: 1, entries: ['pypi.org', '*.pythonhosted.org'] },
    ]);
    const policy = compilePolicy(parsed.value);
    expect(decide(policy, destinationOf({ host: 'files.pythonhosted.org' }))).toMatchObject({
      verdict: 'allow',
      list: 'allowOut',
      rule: 'preset:pkgs (*.pythonhosted.org)',
      reason:
        'the name is below pythonhosted.org, matched by allowOut preset:pkgs (*.pythonhosted.org)',
    });
    expect(decide(policy, destinationOf({ host: 'pythonhosted.org' }))).toMatchObject({
      verdict: 'deny',
      list: 'denyOut',
    });
  });

  test.each<[string, unknown, string]>([
    [
      'an unknown preset',
      { allowOut: ['pypi.org', 'preset:nope'], denyOut: ['0.0.0.0/0'] },
      'unknown preset preset:nope (allowOut[1]): known presets are preset:hub, preset:pkgs',
    ],
    [
      'an empty name',
      { allowOut: ['preset:'], denyOut: ['0.0.0.0/0'] },
      'unknown preset preset: (allowOut[0]): known presets are preset:hub, preset:pkgs',
    ],
    [
      'a preset in denyOut',
      { allowOut: [], denyOut: ['preset:pkgs'] },
      'invalid denied CIDR preset:pkgs (denyOut[0]): presets only allow; use preset:pkgs in allowOut',
    ],
    [
      'a preset without ALL_TRAFFIC',
      { allowOut: ['preset:hub'] },
      `When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic. (allowOut[0] "preset:hub" names domains; ALL_TRAFFIC is "0.0.0.0/0", which denies IPv6 too)`,
    ],
  ])('refuses %s with a message naming it', (_what, config, message) => {
    expect(errors(config)).toEqual([message]);
  });

  it('knows no preset when given no table', () => {
    const parsed = parseNetworkConfig({ allowOut: ['preset:pypi'], denyOut: ['0.0.0.0/0'] });
    expect(!parsed.ok && parsed.errors[0]!.message).toBe(
      'unknown preset preset:pypi (allowOut[0]): known presets are none',
    );
  });

  it('accepts preset:NAME with allow_internet_access false, as a written name', () => {
    expect(parse({ allowOut: ['preset:hub'], allow_internet_access: false }).ok).toBe(true);
  });
});

describe('property: preset:X decides as X written out', () => {
  const NAMES = [
    'a.test',
    'b.a.test',
    'c.b.a.test',
    'x.test',
    'y.x.test',
    'pypi.org',
    'files.pythonhosted.org',
    'z.test',
  ];
  const entry = fc.oneof(
    fc.constantFrom(...NAMES),
    fc.constantFrom(...NAMES).map((name) => `*.${name}`),
  );
  // Documentation ranges: a property of decide, nothing is dialled.
  const address = fc.constantFrom(
    '198.51.100.8',
    '93.184.216.0/24',
    '203.0.113.1',
    '2001:db8::/32',
  );

  test('same verdict and list for every destination; the rule names the preset', () => {
    fc.assert(
      fc.property(
        fc.array(entry, { minLength: 1, maxLength: 5 }),
        fc.array(fc.oneof(entry, address), { maxLength: 4 }),
        fc.nat({ max: 4 }),
        fc.constantFrom<string[]>(['0.0.0.0/0'], ['198.51.0.0/16'], []),
        fc.boolean(),
        fc.constantFrom(...NAMES, 'other.test'),
        fc.option(
          fc.constantFrom(
            '198.51.100.8',
            '93.184.216.34',
            '203.0.113.1',
            '2001:db8::1',
            '10.0.0.1',
          ),
          { nil: undefined },
        ),
        (presetEntries, written, at, denyOut, noAccess, host, ip) => {
          const presets = tableOf(presetJson('x', presetEntries));
          const position = Math.min(at, written.length);
          const withPreset = [
            ...written.slice(0, position),
            'preset:x',
            ...written.slice(position),
          ];
          const writtenOut = [
            ...written.slice(0, position),
            ...presetEntries,
            ...written.slice(position),
          ];
          const access = noAccess ? { allow_internet_access: false } : {};
          const a = parseNetworkConfig({ allowOut: withPreset, denyOut, ...access }, { presets });
          const b = parseNetworkConfig({ allowOut: writtenOut, denyOut, ...access });
          expect(a.ok).toBe(b.ok);
          if (!a.ok || !b.ok) return;
          const [pa, pb] = [compilePolicy(a.value), compilePolicy(b.value)];
          for (const destination of [
            destinationOf({ host }),
            destinationOf({ host, ...(ip === undefined ? {} : { ip }) }),
            ...(ip === undefined ? [] : [destinationOf({ ip })]),
          ]) {
            const [da, db] = [decide(pa, destination), decide(pb, destination)];
            expect({ verdict: da.verdict, list: da.list }).toEqual({
              verdict: db.verdict,
              list: db.list,
            });
            const fromPreset = da.rule !== null && da.rule.startsWith('preset:x (');
            expect(da.rule).toBe(fromPreset ? `preset:x (${db.rule})` : db.rule);
          }
        },
      ),
      { numRuns: 2000 },
    );
  });
});
