/**
 * The ready-made policy files in policies/: every *.json there must parse, be lint-clean, carry a
 * description, and decide a few pinned destinations as documented. Files are discovered from
 * disk, so a new policy is covered (and must add its pins below) without editing the loop.
 * Decisions only: nothing here resolves a name or opens a connection.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import {
  canonicalName,
  compileInternalDenyList,
  compilePolicy,
  type DecisionList,
  decide,
  type LearnedAddresses,
  lintPolicy,
  type NetworkRules,
  type Policy,
  parseDestination,
  parseIP,
  parseNetworkConfig,
} from '../src/policy/index.js';

const POLICY_DIR = fileURLToPath(new URL('../policies/', import.meta.url));
const FILES = readdirSync(POLICY_DIR)
  .filter((name) => name.endsWith('.json'))
  .sort();

const INTERNAL = compileInternalDenyList();

type Verdict = 'allow' | 'deny';
/** A destination as `moat check` takes it, the expected verdict, and the deciding list. */
type Pin = readonly [destination: string, verdict: Verdict, list: DecisionList];

const ALL_TRAFFIC_DENIES = (destinations: string[]): Pin[] =>
  destinations.map((destination) => [destination, 'deny', 'denyOut']);

/** Pinned decisions per file. A policy file without an entry here fails the suite. */
const PINS: Readonly<Record<string, readonly Pin[]>> = {
  'deny-all.json': ALL_TRAFFIC_DENIES([
    'example.com',
    'https://github.com/',
    'pypi.org:443',
    '1.1.1.1:53', // decided only, never dialled: deny-all must deny public resolvers
    '8.8.8.8', // decided only, never dialled
    '2606:4700::1',
    '[2606:4700::1]:443',
    '[2001:4860:4860::8888]:53',
  ]),
  'open-internet.json': [
    ['example.com:443', 'allow', 'default'],
    ['https://github.com/', 'allow', 'default'],
    ['1.1.1.1:53', 'allow', 'default'],
    ['[2606:4700::1]:443', 'allow', 'default'],
    ['ssh://203.0.114.1:22', 'allow', 'default'],
    ['169.254.169.254:80', 'deny', 'internal'],
    ['[::ffff:169.254.169.254]:80', 'deny', 'internal'],
    ['[fd00:ec2::254]:80', 'deny', 'internal'],
    ['10.0.0.1:22', 'deny', 'internal'],
    ['192.168.1.1', 'deny', 'internal'],
    ['127.0.0.1:8080', 'deny', 'internal'],
    ['[::1]:80', 'deny', 'internal'],
  ],
  'github.json': [
    ['api.github.com:443', 'allow', 'allowOut'],
    ['https://github.com/owner/repo.git', 'allow', 'allowOut'],
    ['GitHub.COM.', 'allow', 'allowOut'],
    ['codeload.github.com:443', 'allow', 'allowOut'],
    ['raw.githubusercontent.com', 'allow', 'allowOut'],
    ['release-assets.githubusercontent.com', 'allow', 'allowOut'],
    ['objects.githubusercontent.com', 'allow', 'allowOut'],
    ['ghcr.io', 'allow', 'allowOut'],
    ['pkg-containers.githubusercontent.com', 'allow', 'allowOut'],
    ['npm.pkg.github.com', 'allow', 'allowOut'],
    ['ssh.github.com:443', 'allow', 'allowOut'],
    ['example.com', 'deny', 'denyOut'],
    ['githubusercontent.com', 'deny', 'denyOut'],
    ['gist.githubusercontent.com', 'deny', 'denyOut'],
    ['avatars.githubusercontent.com', 'deny', 'denyOut'],
    ['evil.github.io', 'deny', 'denyOut'],
    ['x.api.github.com', 'deny', 'denyOut'],
    ['api.github.com.evil.example', 'deny', 'denyOut'],
    ['notgithub.com', 'deny', 'denyOut'],
    ['docker.pkg.github.com', 'deny', 'denyOut'],
    // SSH to a bare address: allowed only through a learned address (see the test below).
    ['140.82.112.3:22', 'deny', 'denyOut'],
  ],
  'pypi.json': [
    ['https://pypi.org/simple/requests/', 'allow', 'allowOut'],
    ['files.pythonhosted.org:443', 'allow', 'allowOut'],
    ['test.pypi.org', 'deny', 'denyOut'],
    ['upload.pypi.org', 'deny', 'denyOut'],
    ['pythonhosted.org', 'deny', 'denyOut'],
    ['registry.npmjs.org', 'deny', 'denyOut'],
    ['[2a04:4e42::223]:443', 'deny', 'denyOut'],
  ],
  'npm.json': [
    ['https://registry.npmjs.org/left-pad', 'allow', 'allowOut'],
    ['registry.yarnpkg.com:443', 'allow', 'allowOut'],
    ['repo.yarnpkg.com', 'allow', 'allowOut'],
    ['www.npmjs.com', 'deny', 'denyOut'],
    ['npmjs.org', 'deny', 'denyOut'],
    ['nodejs.org', 'deny', 'denyOut'],
    ['github.com', 'deny', 'denyOut'],
    ['pypi.org', 'deny', 'denyOut'],
  ],
  'ai-apis.json': [
    ['https://api.openai.com/v1/chat/completions', 'allow', 'allowOut'],
    ['api.anthropic.com:443', 'allow', 'allowOut'],
    ['generativelanguage.googleapis.com', 'allow', 'allowOut'],
    ['api.mistral.ai', 'allow', 'allowOut'],
    ['api.groq.com', 'allow', 'allowOut'],
    ['openrouter.ai', 'allow', 'allowOut'],
    ['chatgpt.com', 'deny', 'denyOut'],
    ['claude.ai', 'deny', 'denyOut'],
    ['console.anthropic.com', 'deny', 'denyOut'],
    ['openai.com', 'deny', 'denyOut'],
    ['myresource.openai.azure.com', 'deny', 'denyOut'],
    ['storage.googleapis.com', 'deny', 'denyOut'],
    ['us-central1-aiplatform.googleapis.com', 'deny', 'denyOut'],
  ],
  'debian-apt.json': [
    ['http://deb.debian.org/debian', 'allow', 'allowOut'],
    ['security.debian.org:80', 'allow', 'allowOut'],
    ['deb.debian.org:443', 'allow', 'allowOut'],
    ['debian.org', 'deny', 'denyOut'],
    ['salsa.debian.org', 'deny', 'denyOut'],
    ['ftp.us.debian.org', 'deny', 'denyOut'],
    ['archive.ubuntu.com', 'deny', 'denyOut'],
  ],
  'ubuntu-apt.json': [
    ['http://archive.ubuntu.com/ubuntu', 'allow', 'allowOut'],
    ['us.archive.ubuntu.com:80', 'allow', 'allowOut'],
    ['eu-west-1.ec2.archive.ubuntu.com', 'allow', 'allowOut'],
    ['security.ubuntu.com', 'allow', 'allowOut'],
    ['ports.ubuntu.com', 'allow', 'allowOut'],
    ['ubuntu.com', 'deny', 'denyOut'],
    ['evilarchive.ubuntu.com', 'deny', 'denyOut'],
    ['esm.ubuntu.com', 'deny', 'denyOut'],
    ['ppa.launchpadcontent.net', 'deny', 'denyOut'],
    ['deb.debian.org', 'deny', 'denyOut'],
  ],
  'package-managers.json': [
    ['pypi.org', 'allow', 'allowOut'],
    ['files.pythonhosted.org', 'allow', 'allowOut'],
    ['registry.npmjs.org', 'allow', 'allowOut'],
    ['http://deb.debian.org/debian', 'allow', 'allowOut'],
    ['azure.archive.ubuntu.com', 'allow', 'allowOut'],
    ['dl-cdn.alpinelinux.org', 'allow', 'allowOut'],
    ['index.crates.io', 'allow', 'allowOut'],
    ['static.crates.io', 'allow', 'allowOut'],
    ['rubygems.org', 'allow', 'allowOut'],
    ['repo.maven.apache.org', 'allow', 'allowOut'],
    ['proxy.golang.org', 'deny', 'denyOut'],
    ['storage.googleapis.com', 'deny', 'denyOut'],
    ['github.com', 'deny', 'denyOut'],
    ['example.com', 'deny', 'denyOut'],
  ],
  'go-modules.json': [
    ['https://proxy.golang.org/golang.org/x/net/@v/list', 'allow', 'allowOut'],
    ['sum.golang.org:443', 'allow', 'allowOut'],
    ['storage.googleapis.com', 'allow', 'allowOut'],
    ['index.golang.org', 'deny', 'denyOut'],
    ['go.googlesource.com', 'deny', 'denyOut'],
    ['github.com', 'deny', 'denyOut'],
    ['googleapis.com', 'deny', 'denyOut'],
  ],
};

/** Destinations in the hard internal deny list: no policy file may open them. */
const ALWAYS_INTERNAL = [
  '169.254.169.254:80',
  '[fd00:ec2::254]:80',
  '127.0.0.1:22',
  '[::1]:443',
  '10.1.2.3:5432',
  '172.16.0.1',
  '192.168.0.1:80',
  '100.64.0.1',
  '[::ffff:10.0.0.1]:80',
];

interface Loaded {
  readonly json: Record<string, unknown>;
  readonly rules: NetworkRules;
  readonly policy: Policy;
}

function load(file: string): Loaded {
  const json = JSON.parse(readFileSync(`${POLICY_DIR}${file}`, 'utf8')) as Record<string, unknown>;
  const parsed = parseNetworkConfig(json);
  if (!parsed.ok) {
    const problems = parsed.errors.map((problem) => problem.message).join('\n');
    throw new Error(`${file} does not parse:\n${problems}`);
  }
  return { json, rules: parsed.value, policy: compilePolicy(parsed.value, INTERNAL) };
}

function decideText(policy: Policy, text: string, learned?: LearnedAddresses) {
  const destination = parseDestination(text);
  if (!destination.ok) throw new Error(`pinned destination ${text}: ${destination.error}`);
  return decide(policy, destination.value, learned);
}

describe('policies/', () => {
  it('holds the ready-made policy files', () => {
    expect(FILES).toEqual(
      expect.arrayContaining([
        'deny-all.json',
        'github.json',
        'pypi.json',
        'npm.json',
        'ai-apis.json',
        'debian-apt.json',
      ]),
    );
  });

  it('pins decisions only for files that exist', () => {
    expect(Object.keys(PINS).filter((file) => !FILES.includes(file))).toEqual([]);
  });
});

describe.each(FILES)('policies/%s', (file) => {
  it('parses without errors', () => {
    const parsed = parseNetworkConfig(
      JSON.parse(readFileSync(`${POLICY_DIR}${file}`, 'utf8')) as unknown,
    );
    expect(parsed.ok ? [] : parsed.errors).toEqual([]);
  });

  it('is lint-clean', () => {
    const { rules } = load(file);
    expect(lintPolicy(rules, INTERNAL)).toEqual([]);
  });

  it('has a one-paragraph description', () => {
    const { json, rules } = load(file);
    expect(typeof json.description).toBe('string');
    expect(rules.description?.trim().length ?? 0).toBeGreaterThan(80);
    expect(rules.description).not.toMatch(/\n/);
  });

  it('names hosts rather than listing public address ranges', () => {
    const { rules } = load(file);
    expect(
      rules.allowOut.filter((rule) => rule.kind === 'address').map((rule) => rule.entry),
    ).toEqual([]);
  });

  it('never opens the internal deny list', () => {
    const { policy } = load(file);
    for (const destination of ALWAYS_INTERNAL) {
      const decision = decideText(policy, destination);
      expect({ destination, verdict: decision.verdict, list: decision.list }).toEqual({
        destination,
        verdict: 'deny',
        list: 'internal',
      });
    }
  });

  it('denies IPv4 and IPv6 alike when it denies by default', () => {
    const { rules, policy } = load(file);
    if (!rules.denyAll) return;
    for (const destination of [
      '93.184.215.14:443',
      '[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443',
    ]) {
      expect(decideText(policy, destination)).toMatchObject({ verdict: 'deny', list: 'denyOut' });
    }
  });

  it('decides its pinned destinations', () => {
    const pins = PINS[file];
    expect(pins, `add pinned decisions for ${file} to PINS in test/policies.test.ts`).toBeDefined();
    const { policy } = load(file);
    const actual = (pins ?? []).map(([destination]) => {
      const decision = decideText(policy, destination);
      return [destination, decision.verdict, decision.list];
    });
    expect(actual).toEqual(pins);
  });
});

describe('policies/github.json and SSH', () => {
  const { policy } = load('github.json');
  const github = parseIP('140.82.112.3');
  if (!github.ok) throw new Error(github.error);
  const githubName = canonicalName('github.com');
  if (!githubName.ok) throw new Error(githubName.error);
  const learned: LearnedAddresses = {
    names: (ip) => (ip.text === github.value.text ? [githubName.value] : []),
  };

  it('allows port 22 to an address learned for github.com', () => {
    expect(decideText(policy, '140.82.112.3:22', learned)).toMatchObject({
      verdict: 'allow',
      list: 'learned',
      rule: 'github.com',
    });
  });

  it('denies the same address without a DNS answer behind it', () => {
    expect(decideText(policy, '140.82.112.3:22')).toMatchObject({
      verdict: 'deny',
      list: 'denyOut',
    });
    expect(decideText(policy, '140.82.112.4:22', learned)).toMatchObject({
      verdict: 'deny',
      list: 'denyOut',
    });
  });

  it('does not let a learned address rescue a connection that names another host', () => {
    const destination = parseDestination('evil.example:443');
    if (!destination.ok) throw new Error(destination.error);
    const decision = decide(policy, { ...destination.value, ip: github.value }, learned);
    expect(decision).toMatchObject({ verdict: 'deny', list: 'denyOut' });
  });
});
