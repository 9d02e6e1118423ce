import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runMoat } from './support/moat.js';

let dir: string;
const file = (name: string, content: unknown) => {
  const path = join(dir, name);
  writeFileSync(path, typeof content === 'string' ? content : JSON.stringify(content));
  return path;
};

let github: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'moat-cli-'));
  github = file('github.json', {
    allowOut: ['github.com', '*.github.com', '140.82.112.0/20'],
    denyOut: ['0.0.0.0/0'],
  });
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('moat --help and usage', () => {
  it('prints help naming every command and exits 0', async () => {
    const r = await runMoat(['--help']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/check\s+decide/);
    expect(r.stdout).toMatch(/lint\s+validate/);
  });

  it('prints per-command help', async () => {
    const r = await runMoat(['check', '--help']);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('--policy FILE');
    expect(r.stdout).toContain('--internal-deny');
  });

  it.each([
    [['frobnicate'], /unknown command "frobnicate"/],
    [['check', 'example.com'], /needs --policy FILE/],
    [['check', '--policy', '/nonexistent/p.json', 'x.com'], /cannot read policy file/],
    [['check', '--bogus'], /Unknown option '--bogus'/],
    [['lint'], /at least one policy file/],
  ])('exits 2 for usage error %j', async (args, message) => {
    const r = await runMoat(args);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(message);
  });
});

describe('moat check', () => {
  it('prints one line per destination with verdict, destination, rule and reason; exit 1 when any is denied', async () => {
    const r = await runMoat([
      'check',
      '--policy',
      github,
      'api.github.com',
      'https://example.com/path',
      '10.0.0.1',
    ]);
    expect(r.code).toBe(1);
    const lines = r.stdout.trim().split('\n');
    expect(lines).toHaveLength(3);
    expect(lines[0]).toMatch(/^ALLOW api\.github\.com +\[allowOut \*\.github\.com\]/);
    expect(lines[1]).toMatch(/^DENY +example\.com:443 +\[denyOut 0\.0\.0\.0\/0\]/);
    expect(lines[2]).toMatch(/^DENY +10\.0\.0\.1 +\[internal 10\.0\.0\.0\/8\]/);
  });

  it('exits 0 when every destination is allowed', async () => {
    const r = await runMoat([
      'check',
      '--policy',
      github,
      'github.com:443',
      '140.82.113.9:22',
      '[::ffff:140.82.112.1]:22',
    ]);
    expect(r.code).toBe(0);
    expect(r.stdout.trim().split('\n')).toHaveLength(3);
  });

  it('--json prints one object per line with the documented fields', async () => {
    const r = await runMoat([
      'check',
      '--json',
      '--policy',
      github,
      'api.github.com:443',
      '2606:4700::1',
      'http://0x7f.1/',
    ]);
    expect(r.code).toBe(1);
    const rows = r.stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(rows[0]).toMatchObject({
      destination: 'api.github.com:443',
      verdict: 'allow',
      list: 'allowOut',
      rule: '*.github.com',
    });
    expect(rows[1]).toMatchObject({
      destination: '2606:4700::1',
      verdict: 'deny',
      list: 'denyOut',
      rule: '0.0.0.0/0',
    });
    expect(rows[2]).toMatchObject({
      destination: 'http://0x7f.1/',
      verdict: 'deny',
      list: 'invalid',
      rule: null,
    });
    for (const row of rows)
      expect(Object.keys(row).sort()).toEqual([
        'canonical',
        'destination',
        'list',
        'reason',
        'rule',
        'verdict',
      ]);
  });

  it('reads destinations from standard input, skipping blanks and comments', async () => {
    const r = await runMoat(['check', '--policy', github], {
      input: '# comment\napi.github.com\n\n  github.com  \n',
    });
    expect(r.code).toBe(0);
    expect(r.stdout.trim().split('\n')).toHaveLength(2);
  });

  it('rejects an empty standard input as a usage error', async () => {
    const r = await runMoat(['check', '--policy', github], { input: '\n# nothing\n' });
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('no destinations given');
  });

  it('exits 2 on an invalid policy, naming the entry and its index', async () => {
    const bad = file('bad.json', {
      allowOut: ['ok.example.com'],
      denyOut: ['0.0.0.0/0', 'evil.example.com'],
    });
    const r = await runMoat(['check', '--policy', bad, 'ok.example.com']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('invalid denied CIDR evil.example.com (denyOut[1])');
    expect(r.stdout).toBe('');
  });

  it('exits 2 on a policy file that is not JSON', async () => {
    const r = await runMoat(['check', '--policy', file('broken.json', '{"allowOut": ['), 'x.com']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('not valid JSON');
  });

  it('--internal-deny overrides the hard list; none empties it', async () => {
    const open = file('open.json', {});
    expect((await runMoat(['check', '--policy', open, '127.0.0.1:8080'])).code).toBe(1);
    expect(
      (await runMoat(['check', '--policy', open, '--internal-deny', 'none', '127.0.0.1:8080']))
        .code,
    ).toBe(0);
    const narrowed = await runMoat([
      'check',
      '--policy',
      open,
      '--internal-deny',
      '169.254.0.0/16',
      '127.0.0.1',
      '169.254.169.254',
    ]);
    expect(narrowed.stdout).toMatch(/^ALLOW 127\.0\.0\.1/m);
    expect(narrowed.stdout).toMatch(/^DENY +169\.254\.169\.254 +\[internal 169\.254\.0\.0\/16\]/m);
  });

  it('takes the internal deny list from MOAT_INTERNAL_DENY, and flags beat the environment', async () => {
    const open = file('open2.json', {});
    const env = { MOAT_INTERNAL_DENY: 'none' };
    expect((await runMoat(['check', '--policy', open, '10.1.2.3'], { env })).code).toBe(0);
    expect(
      (
        await runMoat(['check', '--policy', open, '--internal-deny', '10.0.0.0/8', '10.1.2.3'], {
          env,
        })
      ).code,
    ).toBe(1);
    const bad = await runMoat(['check', '--policy', open, '10.1.2.3'], {
      env: { MOAT_INTERNAL_DENY: 'banana' },
    });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('MOAT_INTERNAL_DENY');
  });

  it('reads settings from --config', async () => {
    const config = file('moat.json', { internalDeny: ['192.0.2.0/24'], maxPolicyEntries: 1 });
    const two = file('two.json', { allowOut: ['1.1.1.1', '8.8.8.8'] });
    const r = await runMoat(['check', '--config', config, '--policy', two, '1.1.1.1']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('allowOut has 2 entries; the limit is 1 per list');
  });
});

describe('moat lint', () => {
  it('exits 0 on a clean file and summarises it', async () => {
    const r = await runMoat(['lint', github]);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain(`${github}: ok (3 allowOut, 1 denyOut, 0 warnings)`);
    expect(r.stderr).toBe('');
  });

  it('reports warnings on stderr without failing, and fails with --strict', async () => {
    const noisy = file('noisy.json', {
      allowOut: ['*.co.uk', 'a.example.com', '*.example.com'],
      denyOut: ['0.0.0.0/0'],
    });
    const r = await runMoat(['lint', noisy]);
    expect(r.code).toBe(0);
    expect(r.stderr).toContain(
      'warning: allowOut[0] "*.co.uk" is a wildcard on the public suffix co.uk',
    );
    expect(r.stderr).toContain(
      'warning: allowOut[1] "a.example.com" is already covered by allowOut[2] "*.example.com"',
    );
    const strict = await runMoat(['lint', '--strict', noisy]);
    expect(strict.code).toBe(2);
    expect(strict.stderr).toContain('error: allowOut[0]');
  });

  it('exits 2 with one message per problem, for every file given', async () => {
    const bad = file('bad2.json', {
      allowOut: ['example.com', '0.0.0.0', 'a..b'],
      denyOut: ['x.com'],
    });
    const r = await runMoat(['lint', github, bad]);
    expect(r.code).toBe(2);
    const errors = r.stderr.trim().split('\n');
    expect(errors).toHaveLength(4);
    expect(errors.every((line) => line.startsWith(`${bad}: error: `))).toBe(true);
    expect(r.stdout).toContain(`${github}: ok`);
    expect(r.stdout).toContain(`${bad}: invalid (4 errors)`);
  });
});
