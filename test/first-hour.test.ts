/**
 * What a newcomer meets in the first hour, with real `moat` children: listener bind errors that
 * name the listener and address, the DNS default off the mDNS port, policy files that are
 * request bodies as they are (curl -d @policies/github.json), lint over policies/*, the
 * ALL_TRAFFIC alias and the host:port hint, default,-CIDR in the internal deny list, per-command
 * --help, localhost as a listen host, repeated list flags, unknown MOAT_* variables, standard
 * output that is only JSON with no API key anywhere, /ready, and moat_build_info.
 * Every socket is on loopback; the upstream resolver is a FakeDns.
 */
import { execFile, spawn } from 'node:child_process';
import dgram from 'node:dgram';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { removeMoatFolder } from '../bench/lib/scratch.js';
import { SETTINGS } from '../src/config-settings.js';
import { FakeDns } from './support/fake-dns.js';
import { API_KEY } from './support/api-client.js';
import { MOAT_BIN, runMoat } from './support/moat.js';
import { REDIS_PORT, RedisRelay, redisProblem } from './support/redis.js';
import { loopbackServeArgs, ServeChild, type Started } from './support/serve-child.js';

const redis = await redisProblem();
if (redis !== undefined) console.warn(`Redis readiness test skipped: no Redis on ${REDIS_PORT}`);

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-first-hour-'));
let folders = 0;
const folder = () => path.join(scratch, `d${++folders}`);
const file = (name: string, content: unknown) => {
  const at = path.join(scratch, name);
  writeFileSync(at, typeof content === 'string' ? content : JSON.stringify(content));
  return at;
};

/** A policy that allows everything but the internal deny list. */
const open = () => file('open.json', {});

const zone = new FakeDns(new Map([['allowed.moat.test', { A: ['127.0.0.1'] }]]));

beforeAll(() => zone.start());
afterAll(async () => {
  await ServeChild.killAll();
  await RedisRelay.closeAll();
  await zone.stop();
  for (const name of readdirSync(scratch)) removeMoatFolder(path.join(scratch, name));
  rmSync(scratch, { recursive: true, force: true });
});

/** serveArgs with one flag's value replaced (a flag given twice is refused). */
const serveArgsWith = (flag: string, value: string) => {
  const args = loopbackServeArgs(folder(), zone.port);
  args[args.indexOf(flag) + 1] = value;
  return args;
};

async function startServe(
  extra: string[] = [],
  env: Record<string, string> = {},
): Promise<{ child: ServeChild; at: Started }> {
  const child = new ServeChild(loopbackServeArgs(folder(), zone.port, extra), env);
  return { child, at: await child.started() };
}

const api = (at: Started, route: string, init: RequestInit = {}) =>
  fetch(`http://${at.api}${route}`, {
    ...init,
    headers: { 'X-API-Key': at.generatedKey!, ...init.headers },
    signal: AbortSignal.timeout(10_000),
  });

/** Runs curl (loopback only), resolving with its stdout; never rejects on curl's exit status. */
const curl = (args: string[]) =>
  new Promise<string>((resolve, reject) =>
    execFile('curl', ['-sS', '--noproxy', '*', '--max-time', '10', ...args], (error, stdout) =>
      error && stdout === '' ? reject(error) : resolve(stdout),
    ),
  );

// -- listeners ---------------------------------------------------------------------------------

describe('listeners', () => {
  it('the DNS listener defaults off 5353 (mDNS), to a port the docs name', async () => {
    const dns = SETTINGS.find((s) => s.key === 'dnsListen')!;
    expect(dns.default).toBe('127.0.0.1:3053');
    const printed = await runMoat(['serve', '--print-config']);
    expect(printed.code, printed.stderr).toBe(0);
    expect(JSON.parse(printed.stdout)).toMatchObject({ dnsListen: '127.0.0.1:3053' });
    expect(readFileSync(path.join(ROOT, 'docs/configuration.md'), 'utf8')).toContain(
      '127.0.0.1:3053',
    );
  });

  it('a UDP port in use stops start-up naming the DNS listener, udp and the address', async () => {
    const taken = dgram.createSocket('udp4');
    await new Promise<void>((resolve) => taken.bind(0, '127.0.0.1', resolve));
    const port = taken.address().port;
    try {
      const child = new ServeChild(serveArgsWith('--dns-listen', `127.0.0.1:${port}`));
      expect((await child.exited).code).toBe(1);
      expect(child.stderr).toContain(
        `moat serve: cannot start: DNS listener udp 127.0.0.1:${port}: address already in use`,
      );
    } finally {
      taken.close();
    }
  });

  it.each([
    ['--api-listen', 'platform API listener'],
    ['--proxy-listen', 'egress proxy listener'],
    ['--sandbox-listen', 'sandbox API listener'],
  ])('a TCP port in use for %s names the %s and the address', async (flag, listener) => {
    const taken = net.createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    const port = (taken.address() as net.AddressInfo).port;
    try {
      const child = new ServeChild(serveArgsWith(flag, `127.0.0.1:${port}`));
      expect((await child.exited).code).toBe(1);
      expect(child.stderr).toContain(
        `moat serve: cannot start: ${listener} 127.0.0.1:${port}: address already in use`,
      );
    } finally {
      taken.close();
    }
  });

  it('takes localhost as a listen host, meaning 127.0.0.1', async () => {
    const r = await runMoat(['serve', '--print-config', '--api-listen', 'localhost:3000']);
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ apiListen: '127.0.0.1:3000' });
    const bad = await runMoat(['serve', '--print-config', '--api-listen', 'example.com:3000']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--api-listen: expected ip:port, [ipv6]:port or localhost:port');
  });
});

// -- output, key, readiness ----------------------------------------------------------------------

describe('moat serve output', () => {
  it('standard output is only JSON; the generated key is in its file and printed nowhere', async () => {
    const { child, at } = await startServe([], { MOAT_DNS_LISTN: '127.0.0.1:1' });
    const keyFile = path.join(at.dataDir, 'api-key');
    expect(at.generatedKey).toMatch(/^moat_[0-9a-f]{48}$/);
    expect(readFileSync(keyFile, 'utf8').trim()).toBe(at.generatedKey);
    expect(await child.stop('SIGTERM')).toEqual({ code: 0, signal: null });
    const lines = child.stdout.split('\n').filter((line) => line !== '');
    for (const line of lines) expect(() => JSON.parse(line) as unknown, line).not.toThrow();
    expect(lines.map((line) => (JSON.parse(line) as { msg: string }).msg)).toContain(
      'moat started',
    );
    expect(child.stderr).toContain(`moat: API key          generated into ${keyFile} `);
    expect(`${child.stdout}${child.stderr}`).not.toContain(at.generatedKey);
    // The misspelt variable is named, with the setting it was probably meant to be.
    expect(child.stderr).toContain(
      'moat: warning: MOAT_DNS_LISTN is not a Moat setting and is ignored; did you mean MOAT_DNS_LISTEN?\n',
    );
    expect(child.logLines().find((l) => l.variable === 'MOAT_DNS_LISTN')).toMatchObject({
      level: 40,
      didYouMean: 'MOAT_DNS_LISTEN',
      msg: 'MOAT_DNS_LISTN is not a Moat setting and is ignored; did you mean MOAT_DNS_LISTEN?',
    });
  });

  it('/health is liveness, /ready checks the store and listeners; moat_build_info says what runs', async () => {
    const { child, at } = await startServe();
    const health = await fetch(`http://${at.api}/health`);
    expect(health.status).toBe(200);
    const ready = await fetch(`http://${at.api}/ready`);
    expect([ready.status, await ready.json()]).toEqual([200, { status: 'ready' }]);
    const metrics = await (await api(at, '/metrics')).text();
    const version = (
      JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }
    ).version;
    expect(metrics).toContain(
      `moat_build_info{version="${version}",node_version="${process.version}"} 1`,
    );
    await child.stop('SIGTERM');
  });

  it('a key sent as Authorization: Bearer gets a 401 saying the key goes in X-API-Key, never echoing it', async () => {
    const { child, at } = await startServe();
    const answer = await fetch(`http://${at.api}/sandboxes`, {
      headers: { Authorization: `Bearer ${at.generatedKey}` },
      signal: AbortSignal.timeout(10_000),
    });
    const text = await answer.text();
    expect([answer.status, JSON.parse(text)]).toEqual([
      401,
      {
        code: 401,
        message:
          'missing X-API-Key header: the API key goes in the X-API-Key header, not in Authorization',
      },
    ]);
    expect(text).not.toContain(at.generatedKey);
    // Without any key, the message stays the plain one.
    const bare = await fetch(`http://${at.api}/sandboxes`, { signal: AbortSignal.timeout(10_000) });
    expect(await bare.json()).toEqual({ code: 401, message: 'missing X-API-Key header' });
    await child.stop('SIGTERM');
  });

  it('observe and check --replay-api read the key from the file serve wrote, as serve finds it', async () => {
    const home = folder();
    const child = new ServeChild(loopbackServeArgs(path.join(home, 'data'), zone.port));
    const at = await child.started();
    const apiUrl = `http://${at.api}`;
    const policy = open();
    const clients = [
      ['observe', '--api', apiUrl, '--json'],
      ['check', '--policy', policy, '--replay-api', apiUrl],
    ];
    for (const args of clients) {
      // Run where serve ran: its default data folder, ./data.
      const here = await runMoat(args, { cwd: home });
      expect(here.code, here.stderr).toBe(0);
      // Anywhere else, with MOAT_DATA_DIR naming the data folder (as serve reads it).
      const there = await runMoat(args, { cwd: scratch, env: { MOAT_DATA_DIR: at.dataDir } });
      expect(there.code, there.stderr).toBe(0);
      // Where no key file is: the file is named, and how to give a key said.
      const nowhere = await runMoat(args, { cwd: scratch });
      expect(nowhere.code).toBe(2);
      expect(nowhere.stderr).toContain(
        `no API key: ${path.join(scratch, 'data', 'api-key')}, where moat serve writes it (--data-dir, MOAT_DATA_DIR), does not exist; give --key KEY or --key-file FILE`,
      );
    }
    await child.stop('SIGTERM');
  });

  it.skipIf(redis !== undefined)(
    '/ready answers 503 naming the store while Redis is away, 200 once it is back',
    async () => {
      const relay = await RedisRelay.start();
      const { child, at } = await startServe([
        ...['--store', relay.url, '--store-prefix', `moat-first-hour-${process.pid}:`],
      ]);
      expect((await fetch(`http://${at.api}/ready`)).status).toBe(200);
      relay.cut();
      await expect
        .poll(async () => (await fetch(`http://${at.api}/ready`)).status, { timeout: 10_000 })
        .toBe(503);
      const down = (await (await fetch(`http://${at.api}/ready`)).json()) as {
        status: string;
        reason: string;
      };
      expect(down.status).toBe('not ready');
      expect(down.reason).toMatch(/^store: .*Redis at redis:\/\/127\.0\.0\.1:\d+/);
      expect((await fetch(`http://${at.api}/health`)).status).toBe(200);
      relay.restore();
      await expect
        .poll(async () => (await fetch(`http://${at.api}/ready`)).status, { timeout: 10_000 })
        .toBe(200);
      await child.stop('SIGTERM');
    },
  );
});

// -- policy files as request bodies ----------------------------------------------------------------

describe('policies/ files', () => {
  it('go to PUT /sandboxes/{id}/network as they are (curl -d @policies/github.json)', async () => {
    const { child, at } = await startServe();
    const created = await api(at, '/v2/sandboxes', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', timeout: 120 }),
    });
    expect(created.status).toBe(201);
    const { sandboxID } = (await created.json()) as { sandboxID: string };
    const put = (body: string) =>
      curl([
        ...['-X', 'PUT', `http://${at.api}/sandboxes/${sandboxID}/network`],
        ...['-H', `X-API-Key: ${at.generatedKey}`, '-H', 'Content-Type: application/json'],
        ...['-w', '%{http_code}', '-d', body],
      ]);
    for (const name of readdirSync(path.join(ROOT, 'policies')).filter((n) =>
      n.endsWith('.json'),
    )) {
      expect(await put(`@${path.join(ROOT, 'policies', name)}`), name).toBe('204');
    }
    // Bounded: a description is a note, not storage.
    const long = await put(JSON.stringify({ description: 'x'.repeat(4097) }));
    expect(long).toMatch(/^\{"code":400,"message":"[^"]*description[^"]*4096[^"]*"\}400$/);
    expect(await put(JSON.stringify({ description: 7 }))).toMatch(/"code":400/);
    await child.stop('SIGTERM');
  });

  it('moat lint policies/* lints every policy and skips policies/README.md with a note', async () => {
    const names = readdirSync(path.join(ROOT, 'policies')).sort();
    expect(names).toContain('README.md');
    const r = await runMoat(['lint', ...names.map((n) => path.join(ROOT, 'policies', n))]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`${path.join(ROOT, 'policies/README.md')}: skipped (not JSON`);
    expect(r.stdout).toMatch(/github\.json: ok \(/);
  });

  it('lint still fails a broken *.json file, and a non-JSON file that is not named *.json is skipped', async () => {
    const broken = file('broken.json', '{"allowOut": [');
    const notes = file('notes.txt', 'some notes');
    const r = await runMoat(['lint', broken, notes]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`${broken}: error: not valid JSON`);
    expect(r.stdout).toContain(`${notes}: skipped`);
  });
});

// -- entries ---------------------------------------------------------------------------------------

describe('policy entries', () => {
  it('ALL_TRAFFIC in denyOut means 0.0.0.0/0, IPv6 included', async () => {
    const policy = file('all-traffic.json', {
      allowOut: ['pypi.org'],
      denyOut: ['ALL_TRAFFIC'],
    });
    const r = await runMoat([
      ...['check', '--policy', policy, 'pypi.org', 'example.com', '[2606:4700::1]:443'],
    ]);
    expect(r.code, r.stderr).toBe(1);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^ALLOW pypi\.org /);
    expect(lines[1]).toMatch(/^DENY +example\.com +\[denyOut 0\.0\.0\.0\/0\]/);
    expect(lines[2]).toMatch(/^DENY +\[2606:4700::1\]:443 +\[denyOut 0\.0\.0\.0\/0\]/);
  });

  it('a name without deny-all is told that ALL_TRAFFIC is 0.0.0.0/0', async () => {
    const r = await runMoat(['lint', file('no-deny.json', { allowOut: ['pypi.org'] })]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("include 'ALL_TRAFFIC' in deny out");
    expect(r.stderr).toContain('ALL_TRAFFIC is "0.0.0.0/0"');
  });

  it.each([
    ['allowOut', 'pypi.org:443'],
    ['allowOut', '151.101.0.223:443'],
    ['denyOut', '10.1.2.3:22'],
    ['denyOut', '[2001:db8::1]:443'],
  ])('%s entry %s takes its port (a Moat extension)', async (list, entry) => {
    const body = { [list]: [entry], denyOut: list === 'denyOut' ? [entry] : ['0.0.0.0/0'] };
    const r = await runMoat(['lint', file(`port-${entry.replace(/[^0-9a-z]/g, '_')}.json`, body)]);
    expect(r.code, r.stderr).toBe(0);
  });

  it.each([
    ['pypi.org:0', 'port "0" is not a whole number from 1 to 65535'],
    ['pypi.org:', 'has ":" but no port after it'],
    ['pypi.org:443-80', 'port range "443-80" is reversed: write 80-443'],
  ])('a bad port in %s is named', async (entry, message) => {
    const body = { allowOut: [entry], denyOut: ['0.0.0.0/0'] };
    const r = await runMoat([
      'lint',
      file(`bad-port-${entry.replace(/[^0-9a-z]/g, '_')}.json`, body),
    ]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`invalid allowed domain ${entry} (allowOut[0]): ${message}`);
  });
});

// -- the internal deny list -------------------------------------------------------------------------

describe('--internal-deny default,-CIDR', () => {
  it('takes a default range out, and only that range', async () => {
    const r = await runMoat([
      ...['check', '--policy', open(), '--internal-deny', 'default,-198.18.0.0/15'],
      ...['198.18.0.5', '198.19.255.1', '10.0.0.1', '169.254.169.254'],
    ]);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^ALLOW 198\.18\.0\.5 /);
    expect(lines[1]).toMatch(/^ALLOW 198\.19\.255\.1 /);
    expect(lines[2]).toMatch(/^DENY +10\.0\.0\.1 +\[internal 10\.0\.0\.0\/8\]/);
    expect(lines[3]).toMatch(/^DENY +169\.254\.169\.254 +\[internal 169\.254\.0\.0\/16\]/);
  });

  it('a hole inside a range leaves the rest of that range denied', async () => {
    const r = await runMoat([
      ...['check', '--policy', open(), '--internal-deny', 'default,-198.18.5.0/24'],
      ...['198.18.5.77', '198.18.4.255', '198.18.6.0', '198.19.0.1'],
    ]);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^ALLOW 198\.18\.5\.77 /);
    expect(lines[1]).toMatch(/^DENY +198\.18\.4\.255 +\[internal 198\.18\.4\.0\/24\]/);
    expect(lines[2]).toMatch(/^DENY +198\.18\.6\.0 +\[internal 198\.18\.6\.0\/23\]/);
    expect(lines[3]).toMatch(/^DENY +198\.19\.0\.1 +\[internal 198\.19\.0\.0\/16\]/);
    const printed = await runMoat([
      ...['serve', '--print-config', '--internal-deny', 'default,-198.18.5.0/24'],
    ]);
    const { internalDeny } = JSON.parse(printed.stdout) as { internalDeny: string[] };
    expect(internalDeny).not.toContain('198.18.0.0/15');
    expect(internalDeny).toContain('198.18.0.0/22');
    expect(internalDeny).toContain('10.0.0.0/8');
  });

  it.each(['default,-8.8.8.0/24', '-10.0.0.0/8', 'default,-10.0.0.0/7', 'default,-banana'])(
    'refuses %s, naming the exclusion',
    async (list) => {
      // A value starting with "-" is written --flag=VALUE (parseArgs takes it for a flag otherwise).
      const r = await runMoat(['check', '--policy', open(), `--internal-deny=${list}`, '1.1.1.1']);
      expect(r.code).toBe(2);
      const exclusion = list.split(',').at(-1)!;
      expect(r.stderr).toContain(`--internal-deny: internal deny list entry`);
      expect(r.stderr).toContain(JSON.stringify(exclusion));
    },
  );
});

// -- flags, help, environment -----------------------------------------------------------------------

describe('flags, help and environment', () => {
  it('moat check --help shows the flags check takes, not the ones of serve', async () => {
    const r = await runMoat(['check', '--help']);
    expect(r.code).toBe(0);
    for (const flag of [
      '--policy FILE',
      '--internal-deny',
      '--max-policy-entries',
      '--dns-upstream',
    ])
      expect(r.stdout).toContain(flag);
    for (const flag of ['--api-listen', '--dns-listen', '--store', '--sandbox-cpus'])
      expect(r.stdout).not.toContain(flag);
    const refused = await runMoat(['check', '--api-listen', '127.0.0.1:1', '--policy', open()]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain("Unknown option '--api-listen'");
  });

  it('moat --help describes serve as what it runs', async () => {
    const r = await runMoat(['--help']);
    expect(r.stdout).toMatch(/serve +run Moat: the platform API and sandboxes/);
  });

  it('a repeated list flag adds to the list; a repeated single-value flag is refused', async () => {
    const r = await runMoat([
      ...['check', '--policy', open(), '--internal-deny', '10.0.0.0/8'],
      ...['--internal-deny', '192.168.0.0/16', '10.1.1.1', '192.168.1.1', '172.16.0.1'],
    ]);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^DENY +10\.1\.1\.1 +\[internal 10\.0\.0\.0\/8\]/);
    expect(lines[1]).toMatch(/^DENY +192\.168\.1\.1 +\[internal 192\.168\.0\.0\/16\]/);
    expect(lines[2]).toMatch(/^ALLOW 172\.16\.0\.1 /);
    const twice = await runMoat([
      ...['serve', '--print-config', '--api-listen', '127.0.0.1:1', '--api-listen', '127.0.0.1:2'],
    ]);
    expect(twice.code).toBe(2);
    expect(twice.stderr).toContain(
      '--api-listen is given 2 times ("127.0.0.1:1", "127.0.0.1:2"); it takes one value',
    );
  });

  it('an unknown MOAT_* variable is warned about, with a did-you-mean when one is close', async () => {
    const r = await runMoat(['check', '--policy', open(), '1.1.1.1'], {
      env: { MOAT_INTERNAL_DNEY: 'none', MOAT_SOMETHING_ELSE_ENTIRELY: 'x' },
    });
    expect(r.stderr).toContain(
      'moat: warning: MOAT_INTERNAL_DNEY is not a Moat setting and is ignored; did you mean MOAT_INTERNAL_DENY?',
    );
    expect(r.stderr).toContain(
      'moat: warning: MOAT_SOMETHING_ELSE_ENTIRELY is not a Moat setting and is ignored\n',
    );
  });

  it('serve --print-config warns about an unknown MOAT_* variable on stderr, in the line docs/troubleshooting.md shows', async () => {
    const shown = /^### `(moat: warning: MOAT_DNS_LISTN [^`]*)`$/m.exec(
      readFileSync(path.join(ROOT, 'docs/troubleshooting.md'), 'utf8'),
    )?.[1];
    expect(shown, 'docs/troubleshooting.md has the warning as a heading').toBeDefined();
    const r = await runMoat(['serve', '--print-config'], {
      env: { MOAT_DNS_LISTN: '127.0.0.1:1' },
    });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe(`${shown}\n`);
    expect(JSON.parse(r.stdout)).toMatchObject({ dnsListen: '127.0.0.1:3053' });
  });

  it.each([
    [['serve', '--print-config', '--dns-listn', '127.0.0.1:1'], '--dns-listn', '--dns-listen'],
    [['serve', '--print-config', '--internal-dney=none'], '--internal-dney', '--internal-deny'],
    [['check', '--polcy', 'p.json', 'x.test'], '--polcy', '--policy'],
    [['observe', '--verdikt', 'deny'], '--verdikt', '--verdict'],
  ])('a flag typo (%j) is told the flag it probably meant', async (args, typo, meant) => {
    const r = await runMoat(args);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`Unknown option '${typo}'; did you mean ${meant}?\n`);
  });

  it('a flag typo is shown in docs/troubleshooting.md as printed; a flag far from all gets no guess', async () => {
    const r = await runMoat(['serve', '--dns-listn', '127.0.0.1:1']);
    const printed = r.stderr.split('\n')[0]!;
    expect(printed).toBe("moat serve: Unknown option '--dns-listn'; did you mean --dns-listen?");
    expect(readFileSync(path.join(ROOT, 'docs/troubleshooting.md'), 'utf8')).toContain(
      `\n### \`${printed}\`\n`,
    );
    const far = await runMoat(['serve', '--print-config', '--frobnicate']);
    expect(far.stderr).toContain("Unknown option '--frobnicate'");
    expect(far.stderr).not.toContain('did you mean');
  });
});

// -- confinement ---------------------------------------------------------------------------------

/** The cgroup mount Moat's freezer would be in: v1's freezer hierarchy, else the v2 root. */
const FREEZER_MOUNT = existsSync('/sys/fs/cgroup/freezer/cgroup.procs')
  ? '/sys/fs/cgroup/freezer'
  : '/sys/fs/cgroup';

describe('confinement is advertised only after a write test', () => {
  /** `moat serve` with the freezer hierarchy read-only (in a private mount namespace). */
  async function withReadOnlyFreezer(
    extra: string[],
    use: (stderr: string, api: string) => Promise<void>,
  ): Promise<void> {
    // A private mount namespace: the read-only remount is this child's alone.
    const args = loopbackServeArgs(folder(), zone.port, ['--api-keys', API_KEY, ...extra]);
    const child = spawn(
      'unshare',
      [
        ...['--mount', '--propagation', 'private', 'sh', '-c'],
        `mount -o remount,bind,ro ${FREEZER_MOUNT} && exec "$0" "$@"`,
        ...[process.execPath, MOAT_BIN, 'serve', ...args],
      ],
      { env: { PATH: process.env.PATH ?? '' }, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    const exited = new Promise((resolve) => child.once('exit', resolve));
    try {
      await expect.poll(() => stderr, { timeout: 15_000 }).toMatch(/^moat: metrics /m);
      const api = /^moat: platform API +(http:\/\/\S+) /m.exec(stderr)?.[1];
      expect(api, stderr).toBeDefined();
      await use(stderr, api!);
    } finally {
      child.kill('SIGTERM');
      await exited;
    }
  }
  const create = (api: string) =>
    fetch(`${api}/sandboxes`, {
      method: 'POST',
      headers: { 'X-API-Key': API_KEY, 'Content-Type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', timeout: 60 }),
    });

  it.skipIf(process.getuid?.() !== 0)(
    'with the freezer hierarchy read-only, start-up refuses sandboxes and says why; POST is 503',
    async () => {
      await withReadOnlyFreezer([], async (stderr, api) => {
        const processes = /^moat: processes +(.*)$/m.exec(stderr)?.[1];
        expect(processes, stderr).toMatch(
          /^sandboxes are refused: they cannot be confined here \(/,
        );
        expect(processes).toMatch(/cgroup v[12] .* was found but a write test failed: /);
        expect(processes).not.toMatch(/^confined/);
        const refused = await create(api);
        expect(refused.status).toBe(503);
        expect(await refused.text()).toMatch(
          /not created: sandboxes are refused: they cannot be confined/,
        );
      });
    },
  );

  it.skipIf(process.getuid?.() !== 0)(
    'with --unconfined-sandboxes there, start-up says UNCONFINED and so does GET /sandboxes/{id}',
    async () => {
      await withReadOnlyFreezer(['--unconfined-sandboxes'], async (stderr, api) => {
        expect(/^moat: processes +(.*)$/m.exec(stderr)?.[1], stderr).toMatch(
          /^UNCONFINED \(--unconfined-sandboxes\): /,
        );
        const made = await create(api);
        expect(made.status, await made.clone().text()).toBe(201);
        const { sandboxID } = (await made.json()) as { sandboxID: string };
        const headers = { 'X-API-Key': API_KEY };
        const detail = await fetch(`${api}/sandboxes/${sandboxID}`, { headers });
        expect(await detail.json()).toMatchObject({ sandboxID, confinement: 'unconfined' });
        await fetch(`${api}/sandboxes/${sandboxID}`, { method: 'DELETE', headers });
      });
    },
  );
});
