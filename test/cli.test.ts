import {
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FakeDns } from './support/fake-dns.js';
import { runMoat } from './support/moat.js';
import { blankLineComments } from '../src/cli/policy-file.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
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

  it('check --help and docs/flows.md say where a --replay file comes from, and whose internal deny list decides', async () => {
    const help = (await runMoat(['check', '--help'])).stdout.replace(/\s+/g, ' ');
    const flows = readFileSync(join(ROOT, 'docs/flows.md'), 'utf8');
    const replaySection = flows
      .slice(flows.indexOf('### What-if replay'), flows.indexOf('## Configuration'))
      .replace(/\s+/g, ' ');
    for (const text of [help, replaySection]) {
      expect(text).toContain('--flow-log FILE');
      expect(text).toContain('moat observe --json > flows.jsonl');
      expect(text).toMatch(/--replay-api.*the node's internal deny list/);
    }
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

  it('decides each destination on its port, and names the port-scoped rule', async () => {
    const ported = file('ports.json', {
      allowOut: ['pypi.org:443', 'github.com:22', '44.1.2.3:5432', '[2606:4700::/32]:8000-8100'],
      denyOut: ['0.0.0.0/0', '*.pastebin.com'],
    });
    const r = await runMoat([
      'check',
      '--policy',
      ported,
      'pypi.org:443',
      'http://pypi.org/simple/',
      'github.com:22',
      '44.1.2.3:5432',
      '44.1.2.3:5433',
      '[2606:4700::1]:8080',
      'x.pastebin.com:443',
    ]);
    expect(r.code).toBe(1);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^ALLOW pypi\.org:443 +\[allowOut pypi\.org:443\]/);
    expect(lines[1]).toMatch(
      /^DENY +pypi\.org:80 +\[denyOut 0\.0\.0\.0\/0\] +no allowOut name rule covers the name;/,
    );
    expect(lines[2]).toMatch(/^ALLOW github\.com:22 +\[allowOut github\.com:22\]/);
    expect(lines[3]).toMatch(/^ALLOW 44\.1\.2\.3:5432 +\[allowOut 44\.1\.2\.3:5432\]/);
    expect(lines[4]).toMatch(/^DENY +44\.1\.2\.3:5433 +\[denyOut 0\.0\.0\.0\/0\]/);
    expect(lines[5]).toMatch(
      /^ALLOW \[2606:4700::1\]:8080 +\[allowOut \[2606:4700::\/32\]:8000-8100\]/,
    );
    expect(lines[6]).toMatch(/^DENY +x\.pastebin\.com:443 +\[denyOut \*\.pastebin\.com\]/);
  });

  it('decides a URL as a request by the methods and paths of its destination rules', async () => {
    const policy = file('methods.json', {
      allowOut: ['api.github.com'],
      denyOut: ['0.0.0.0/0'],
      rules: {
        'api.github.com': [
          { match: { methods: ['GET', 'HEAD'], paths: ['/repos/acme/*'] }, action: 'allow' },
          { action: 'deny' },
        ],
      },
    });
    const r = await runMoat([
      'check',
      '--policy',
      policy,
      'https://api.github.com/repos/acme/x?page=2',
      'POST https://api.github.com/repos/acme/x',
      'https://api.github.com/repos/acme/../../admin',
      'api.github.com',
    ]);
    expect(r.code).toBe(1);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toMatch(
      /^ALLOW api\.github\.com:443 GET \/repos\/acme\/x +\[rules api\.github\.com #1\] +GET \/repos\/acme\/x to api\.github\.com is allowed by rule api\.github\.com #1 of network\.rules/,
    );
    expect(lines[1]).toMatch(
      /^DENY +api\.github\.com:443 POST \/repos\/acme\/x +\[rules api\.github\.com #2\]/,
    );
    expect(lines[2]).toMatch(
      /^DENY +api\.github\.com:443 GET \/repos\/acme\/\.\.\/\.\.\/admin +\[invalid api\.github\.com\] .*"\.\." segment/,
    );
    // A destination alone is decided as a destination: the rules decide its requests.
    expect(lines[3]).toMatch(/^ALLOW api\.github\.com +\[allowOut api\.github\.com\]/);
    const json = await runMoat([
      'check',
      '--json',
      '--policy',
      policy,
      'DELETE http://api.github.com/repos/acme/x',
    ]);
    expect(JSON.parse(json.stdout)).toMatchObject({
      destination: 'DELETE http://api.github.com/repos/acme/x',
      verdict: 'deny',
      list: 'rules',
      rule: 'api.github.com #2',
      request: { method: 'DELETE', path: '/repos/acme/x' },
    });
  });

  it('names the network.rules key that applies to each allowed destination (TLS intercepted)', async () => {
    const withRules = file('rules.json', {
      allowOut: ['api.example.com', '*.example.org'],
      denyOut: ['0.0.0.0/0'],
      rules: {
        'API.example.com': [{ transform: { headers: { Authorization: '${e2b.secrets.token}' } } }],
        '*.example.org': [],
        'denied.test': [],
      },
    });
    const r = await runMoat([
      'check',
      '--policy',
      withRules,
      'api.example.com',
      'www.example.org',
      'example.org',
      'denied.test',
    ]);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toMatch(
      /^ALLOW api\.example\.com .*\(TLS intercepted: headers of rule api\.example\.com\)$/,
    );
    expect(lines[1]).toMatch(/\(TLS intercepted: headers of rule \*\.example\.org\)$/);
    // The apex is not below its wildcard; a rule opens nothing allowOut does not.
    expect(lines[2]).toMatch(/^DENY +example\.org /);
    expect(lines[3]).toMatch(/^DENY +denied\.test /);
    expect(lines[3]).not.toMatch(/intercepted/);
    const json = await runMoat(['check', '--json', '--policy', withRules, 'api.example.com']);
    expect(JSON.parse(json.stdout)).toMatchObject({
      verdict: 'allow',
      intercept: 'api.example.com',
    });
    const bad = file('bad-rules.json', {
      rules: { 'a.test': [{ transform: { headers: { 'X-Key': 'sk-secret-value\r\n' } } }] },
    });
    const refused = await runMoat(['check', '--policy', bad, 'a.test']);
    expect(refused.code).toBe(2);
    expect(refused.stdout + refused.stderr).toMatch(/a\.test .*header "X-Key".*control character/);
    expect(refused.stdout + refused.stderr).not.toContain('sk-secret-value');
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
      denyOut: ['0.0.0.0/0', 'evil..example.com'],
    });
    const r = await runMoat(['check', '--policy', bad, 'ok.example.com']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('invalid denied CIDR evil..example.com (denyOut[1])');
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

  it('names the new key when a config file uses a renamed one', async () => {
    const config = file('renamed.json', { namespace: 'team-a' });
    const r = await runMoat(['check', '--config', config, '--policy', config, '1.1.1.1']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`config file ${config}: key "namespace" is now "teamNamespace"`);
  });
});

describe('moat check --resolve', () => {
  // Public addresses here are only ever answered by the fake resolver and decided, never dialled.
  let dns: FakeDns;
  let upstream: string;
  let open: string;
  beforeAll(async () => {
    dns = await new FakeDns(
      new Map([
        ['api.github.com', { A: ['140.82.112.5'], AAAA: ['2606:50c0:8000::154'] }],
        ['mixed.example', { A: ['10.1.2.3', '151.101.1.69'] }],
        ['fenced.example', { A: ['10.1.2.3', '93.184.215.14'] }],
        ['empty.example', {}],
      ]),
    ).start();
    dns.silent.add('silent.example');
    upstream = `127.0.0.1:${dns.port}`;
    open = file('resolve-open.json', { denyOut: ['93.184.0.0/16'] });
  });
  afterAll(() => dns.stop());

  const check = (policy: string, ...args: string[]) =>
    runMoat(['check', '--policy', policy, '--resolve', '--dns-upstream', upstream, ...args]);

  it('lists every address a name resolves to, decided with the name; allowed when any is', async () => {
    const r = await check(open, 'mixed.example:443', 'fenced.example');
    expect(r.code).toBe(1);
    expect(r.stdout.split('\n')).toEqual([
      expect.stringMatching(/^ALLOW mixed\.example:443 +\[default\]/),
      expect.stringMatching(/^ {2}DENY +10\.1\.2\.3 +\[internal 10\.0\.0\.0\/8\]/),
      expect.stringMatching(/^ {2}ALLOW 151\.101\.1\.69 +\[default\]/),
      // Every address refused: denied by the first one's rule, as the proxy's 403 says.
      expect.stringMatching(/^DENY +fenced\.example +\[internal 10\.0\.0\.0\/8\]/),
      expect.stringMatching(/^ {2}DENY +10\.1\.2\.3 /),
      expect.stringMatching(/^ {2}DENY +93\.184\.215\.14 +\[denyOut 93\.184\.0\.0\/16\]/),
      '',
    ]);
  });

  it('never looks up a name the rules deny, nor anything without --resolve', async () => {
    const before = dns.log.length;
    const denied = await check(github, 'example.com', 'api.github.com');
    expect(denied.code).toBe(1);
    expect(denied.stdout).toMatch(/^DENY +example\.com +\[denyOut 0\.0\.0\.0\/0\]/m);
    // The policy has an allowOut range; the reason must not suggest the name could resolve into it.
    expect(denied.stdout).toContain('allowOut address ranges admit addresses, not names');
    expect(denied.stdout).toMatch(/^ALLOW api\.github\.com +\[allowOut \*\.github\.com\]/m);
    expect(denied.stdout).toMatch(/^ {2}ALLOW 140\.82\.112\.5 /m);
    expect(denied.stdout).toMatch(/^ {2}ALLOW 2606:50c0:8000::154 /m);
    expect(dns.asked('example.com')).toEqual([]);
    expect(dns.asked('api.github.com').length).toBeGreaterThan(0);
    const quiet = await runMoat([
      'check',
      '--policy',
      open,
      '--dns-upstream',
      upstream,
      'mixed.example',
    ]);
    expect(quiet.code).toBe(0);
    expect(quiet.stdout).not.toContain('151.101.1.69');
    expect(dns.log.length).toBe(before + dns.asked('api.github.com').length);
  });

  it('a name that does not resolve is denied (list "unresolved") within the DNS timeout', async () => {
    const started = performance.now();
    const r = await check(
      open,
      '--dns-timeout-ms',
      '300',
      '--json',
      'nowhere.example',
      'empty.example',
      'silent.example',
    );
    expect(performance.now() - started).toBeLessThan(10_000);
    expect(r.code).toBe(1);
    const rows = r.stdout
      .trim()
      .split('\n')
      .map((row) => JSON.parse(row) as Record<string, unknown>);
    expect(rows).toEqual([
      expect.objectContaining({
        destination: 'nowhere.example',
        verdict: 'deny',
        list: 'unresolved',
        reason: 'nowhere.example has no IPv4 or IPv6 address',
        addresses: [],
      }),
      expect.objectContaining({ destination: 'empty.example', list: 'unresolved' }),
      expect.objectContaining({
        destination: 'silent.example',
        list: 'unresolved',
        reason: expect.stringMatching(/^cannot resolve silent\.example: no upstream answered/),
      }),
    ]);
  });

  it('--json carries each address with its own decision', async () => {
    const r = await check(open, '--json', 'mixed.example', '140.82.112.5');
    const [named, bare] = r.stdout
      .trim()
      .split('\n')
      .map((row) => JSON.parse(row) as Record<string, unknown>);
    expect(named).toMatchObject({
      canonical: 'mixed.example',
      verdict: 'allow',
      list: 'default',
      addresses: [
        { address: '10.1.2.3', verdict: 'deny', list: 'internal', rule: '10.0.0.0/8' },
        { address: '151.101.1.69', verdict: 'allow', list: 'default', rule: null },
      ],
    });
    // An address needs no lookup and carries no list of addresses.
    expect(bare).not.toHaveProperty('addresses');
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

  it('warns for a port entry a portless one shadows, and names a bad port', async () => {
    const shadowed = file('shadowed.json', {
      allowOut: ['pypi.org', 'pypi.org:443', '44.1.2.3:22', '44.1.2.3:443'],
      denyOut: ['0.0.0.0/0'],
    });
    const r = await runMoat(['lint', shadowed]);
    expect(r.code).toBe(0);
    expect(r.stderr.trim().split('\n')).toEqual([
      `${shadowed}: warning: allowOut[1] "pypi.org:443" is already covered by allowOut[0] "pypi.org", which takes every port`,
    ]);
    const bad = file('bad-port.json', { allowOut: ['pypi.org:0'], denyOut: ['0.0.0.0/0'] });
    const refused = await runMoat(['lint', bad]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain(
      'invalid allowed domain pypi.org:0 (allowOut[0]): port "0" is not a whole number from 1 to 65535',
    );
  });

  it('exits 2 with one message per problem, for every file given', async () => {
    const bad = file('bad2.json', {
      allowOut: ['example.com', '0.0.0.0', 'a..b'],
      denyOut: ['x..com'],
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

describe('presets in moat check and moat lint', () => {
  it('check names the preset and its entry in the reason; --presets-dir adds presets', async () => {
    const policy = file('with-preset.json', {
      allowOut: ['preset:pypi', 'preset:corp'],
      denyOut: ['0.0.0.0/0'],
    });
    const presets = join(dir, 'presets');
    mkdirSync(presets);
    writeFileSync(
      join(presets, 'corp.json'),
      JSON.stringify({
        name: 'corp',
        version: 3,
        description: 'the company mirror',
        allowOut: ['*.mirror.corp.test'],
      }),
    );
    const r = await runMoat([
      'check',
      '--policy',
      policy,
      '--presets-dir',
      presets,
      'files.pythonhosted.org',
      'pip.mirror.corp.test:443',
      'example.test',
    ]);
    expect(r.code).toBe(1);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toBe(
      'ALLOW files.pythonhosted.org  [allowOut preset:pypi (files.pythonhosted.org)]  the name matches allowOut preset:pypi (files.pythonhosted.org)',
    );
    expect(lines[1]).toMatch(
      /^ALLOW pip\.mirror\.corp\.test:443 +\[allowOut preset:corp \(\*\.mirror\.corp\.test\)\]/,
    );
    expect(lines[2]).toMatch(/^DENY +example\.test +\[denyOut 0\.0\.0\.0\/0\]/);
    const json = await runMoat([
      'check',
      '--json',
      '--policy',
      policy,
      '--presets-dir',
      presets,
      'pypi.org',
    ]);
    expect(JSON.parse(json.stdout)).toMatchObject({
      verdict: 'allow',
      list: 'allowOut',
      rule: 'preset:pypi (pypi.org)',
    });
    // Without the operator's folder, preset:corp is unknown: the policy is invalid (exit 2).
    const unknown = await runMoat(['check', '--policy', policy, 'pypi.org']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(
      /unknown preset preset:corp \(allowOut\[1\]\): known presets are .*preset:docker-hub.*preset:pypi/,
    );
  });

  it('check refuses a presets folder that reuses a shipped name, naming both files', async () => {
    const clash = join(dir, 'clash');
    mkdirSync(clash);
    writeFileSync(
      join(clash, 'npm.json'),
      JSON.stringify({ name: 'npm', version: 1, description: 'd', allowOut: ['npm.corp.test'] }),
    );
    const r = await runMoat(['check', '--policy', github, '--presets-dir', clash, 'github.com']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(
      `preset "npm" is defined twice: in ${join(ROOT, 'policies', 'presets', 'npm.json')} and in ${join(clash, 'npm.json')}`,
    );
  });

  it('lint understands presets, warns on an entry a preset repeats, and skips the presets folder', async () => {
    const policy = file('lint-preset.json', {
      allowOut: ['preset:npm', 'registry.npmjs.org'],
      denyOut: ['0.0.0.0/0'],
    });
    const r = await runMoat(['lint', policy, join(ROOT, 'policies', 'presets')]);
    expect(r.code).toBe(0);
    expect(r.stderr).toContain(
      'warning: allowOut[1] "registry.npmjs.org" repeats allowOut[0] "preset:npm (registry.npmjs.org)"',
    );
    expect(r.stdout).toContain(`${join(ROOT, 'policies', 'presets')}: skipped (a folder)`);
  });
});

describe('policy files with // comments (what moat suggest writes)', () => {
  it.each([
    ['a comment after an entry', '["a", // two\n"b"]', ['a', 'b']],
    ['a comment at the end with no newline', '["a"] // last', ['a']],
    ['// inside a string is text', '["http://x//y"] // c', ['http://x//y']],
    ['an escaped quote does not end the string', '["a\\"//b"] // c', ['a"//b']],
    ['an escaped backslash before the closing quote', '["a\\\\"] // c', ['a\\']],
  ])('%s', (_, text, parsed) => {
    expect(JSON.parse(blankLineComments(text))).toEqual(parsed);
    // Blanked, not removed: a JSON error still points into the file as written.
    expect(blankLineComments(text)).toHaveLength(text.length);
  });

  it('moat check and moat lint read a commented policy file', async () => {
    const commented = file(
      'commented.json',
      '{\n  "allowOut": [\n    "pypi.org", // 3 flows\n    "example.com" // 1 flow\n  ],\n  "denyOut": ["0.0.0.0/0"] // everything not seen\n}\n',
    );
    const checked = await runMoat(['check', '--policy', commented, 'pypi.org', 'other.test']);
    expect(checked.stdout).toMatch(/^ALLOW pypi\.org .*\nDENY {2}other\.test /m);
    const linted = await runMoat(['lint', commented]);
    expect(linted.code, linted.stderr).toBe(0);
  });
});

describe('moat identity rotate-key', () => {
  it('makes a new current key beside the one it replaces, private to its user', async () => {
    const data = join(dir, 'identity-data');
    const kid = (r: { stdout: string }) =>
      /identity key (\S+) is published and signs from /.exec(r.stdout)?.[1];
    const first = await runMoat(['identity', 'rotate-key', '--data-dir', data]);
    expect(first.code, first.stderr).toBe(0);
    const second = await runMoat(['identity', 'rotate-key'], { env: { MOAT_DATA_DIR: data } });
    expect(second.code, second.stderr).toBe(0);
    expect(second.stdout).toMatch(/2 key\(s\) published, 0 expired key\(s\) removed/);
    expect(kid(second)).not.toBe(kid(first));
    const folder = join(data, 'identity-keys');
    expect(statSync(folder).mode & 0o777).toBe(0o700);
    for (const name of readdirSync(folder)) {
      expect(statSync(join(folder, name)).mode & 0o777).toBe(0o600);
      // The file holds the private key: nothing else but its owner reads it.
      expect(readFileSync(join(folder, name), 'utf8')).toContain('PRIVATE KEY');
    }
    expect(readdirSync(folder).sort()).toEqual(
      [`${kid(first)}.json`, `${kid(second)}.json`].sort(),
    );
  });

  it('takes one subcommand', async () => {
    for (const args of [['identity'], ['identity', 'rotate'], ['identity', 'rotate-key', 'x']]) {
      const r = await runMoat([...args, '--data-dir', join(dir, 'unused')]);
      expect(r.code, args.join(' ')).toBe(2);
      expect(r.stderr).toContain('moat identity takes one subcommand: rotate-key');
    }
  });
});
