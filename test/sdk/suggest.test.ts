/**
 * Package installs under a preset, and `moat suggest` end to end, as an operator learns a
 * policy. With `preset:pypi` alone a sandbox (real `e2b` SDK) installs with pip from a fake
 * index and reaches nothing else. Learning: a sandbox (open
 * policy) runs `pip install` against a fake package index at pypi.org / files.pythonhosted.org,
 * `git clone` from a fake forge, and fetches from three names of one CDN; every origin is a local
 * server on this host's loopback, opened as an operator opens a host port. `moat suggest` (the
 * built CLI, a child process) reads the node's flow records and prints the policy; `moat check`
 * replays the records against it (nothing denied) and denies a name never seen.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { CommandExitError, type Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { API_KEY } from '../support/api-client.js';
import { runMoat } from '../support/moat.js';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

const ORIGIN_IP = '127.0.0.1';
const CDN = ['a.cdn-mirror.test', 'b.cdn-mirror.test', 'c.cdn-mirror.test'];
const FORGE = 'code.forge.test';
const INDEX = ['pypi.org', 'files.pythonhosted.org'];

const missing = [
  spawnSync('/usr/bin/python3', ['-m', 'pip', '--version']).status === 0 ? undefined : 'pip',
  spawnSync('git', ['--version']).status === 0 ? undefined : 'git',
].filter((tool) => tool !== undefined);
const skip = missing.length > 0 ? `${missing.join(' and ')} not installed` : undefined;
if (skip) console.warn(`moat suggest end-to-end test skipped: ${skip}`);

/** A pure-Python wheel of `learnedpkg` 1.0, made by Python's zipfile (no build tools). */
function makeWheel(dir: string): string {
  const file = path.join(dir, 'learnedpkg-1.0-py3-none-any.whl');
  execFileSync('/usr/bin/python3', [
    '-c',
    [
      'import sys, zipfile',
      'z = zipfile.ZipFile(sys.argv[1], "w")',
      'z.writestr("learnedpkg/__init__.py", "VALUE = 42\\n")',
      'z.writestr("learnedpkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\\nName: learnedpkg\\nVersion: 1.0\\n")',
      'z.writestr("learnedpkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\\nGenerator: moat-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")',
      'z.writestr("learnedpkg-1.0.dist-info/RECORD", "")',
      'z.close()',
    ].join('\n'),
    file,
  ]);
  return file;
}

/** A bare repository with one commit, served as git's dumb HTTP protocol serves one: files. */
function makeRepository(dir: string): string {
  const work = path.join(dir, 'work');
  const bare = path.join(dir, 'project.git');
  const git = (cwd: string, ...args: string[]) =>
    execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd });
  execFileSync('git', ['init', '-q', '-b', 'main', work]);
  writeFileSync(path.join(work, 'README'), 'learned\n');
  git(work, 'add', 'README');
  git(work, 'commit', '-qm', 'first');
  execFileSync('git', ['clone', '-q', '--bare', work, bare]);
  git(bare, 'update-server-info');
  return bare;
}

/** Runs a shell line in the sandbox; a failure says what the command printed. */
async function run(sandbox: Sandbox, line: string, timeoutMs = 60_000): Promise<string> {
  try {
    return (await sandbox.commands.run(line, { timeoutMs })).stdout;
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error;
    throw new Error(`${line}: exit ${error.exitCode}\n${error.stdout}${error.stderr}`, {
      cause: error,
    });
  }
}

describe.skipIf(skip !== undefined)('moat suggest from what a sandbox did', () => {
  let harness: SdkMoat;
  let origin: http.Server;
  let scratch: string;
  let port: number;
  let api: string;

  beforeAll(async () => {
    scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-suggest-'));
    const wheel = makeWheel(scratch);
    const bare = makeRepository(scratch);
    origin = http.createServer((request, response) => {
      const host = (request.headers.host ?? '').replace(/:\d+$/, '');
      const url = new URL(request.url ?? '/', 'http://x');
      const send = (status: number, body: string | Buffer, type = 'text/plain') => {
        response.writeHead(status, { 'content-type': type });
        response.end(body);
      };
      if (host === 'pypi.org' && url.pathname === '/simple/learnedpkg/')
        return send(
          200,
          `<html><body><a href="http://files.pythonhosted.org:${port}/packages/${path.basename(wheel)}">${path.basename(wheel)}</a></body></html>`,
          'text/html',
        );
      if (host === 'files.pythonhosted.org' && url.pathname.startsWith('/packages/'))
        return send(200, readFileSync(wheel), 'application/octet-stream');
      if (host === FORGE && url.pathname.startsWith('/project.git/')) {
        const file = path.join(bare, path.normalize(url.pathname.slice('/project.git/'.length)));
        if (!file.startsWith(bare)) return send(403, 'no');
        try {
          return send(200, readFileSync(file));
        } catch {
          return send(404, 'not found');
        }
      }
      if (CDN.includes(host)) return send(200, `asset from ${host}\n`);
      send(404, 'not found');
    });
    await new Promise<void>((resolve) => origin.listen(0, ORIGIN_IP, resolve));
    port = (origin.address() as AddressInfo).port;
    harness = await startSdkMoat({
      zone: new Map([...INDEX, FORGE, ...CDN].map((name) => [name, { A: [ORIGIN_IP] }])),
      flags: {
        enforcement: 'proxy',
        'internal-deny': '169.254.0.0/16',
        'allow-host-ports': String(port),
      },
    });
    api = `http://127.0.0.1:${harness.moat.listening.api.port}`;
  }, 60_000);

  afterAll(async () => {
    await harness?.stop();
    origin?.close();
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });

  /** pip installs learnedpkg from the fake index and imports it: prints 42. */
  const pipInstall = (sandbox: Sandbox) => {
    const index = `http://pypi.org:${port}/simple`;
    const trusted = INDEX.map((name) => `--trusted-host ${name}`).join(' ');
    return run(
      sandbox,
      `python3 -m pip install -q --no-cache-dir --disable-pip-version-check --index-url ${index} ${trusted} --target /tmp/site learnedpkg && PYTHONPATH=/tmp/site python3 -c 'import learnedpkg; print(learnedpkg.VALUE)'`,
      120_000,
    );
  };

  it('pip installs with allowOut ["preset:pypi"] alone; nothing else is reached', async () => {
    const sandbox = await harness.sandbox({
      network: { allowOut: ['preset:pypi'], denyOut: ['0.0.0.0/0'] },
    });
    expect(await pipInstall(sandbox)).toBe('42\n');
    await expect(
      run(sandbox, `curl -sSf http://${FORGE}:${port}/project.git/HEAD`),
    ).rejects.toThrow(/exit [1-9]/);
  }, 240_000);

  it('learns a policy that allows what pip, git and curl did, and nothing else', async () => {
    const sandbox = await harness.sandbox();
    expect(await pipInstall(sandbox)).toBe('42\n');
    const cloned = await run(
      sandbox,
      `git clone -q http://${FORGE}:${port}/project.git /tmp/project && cat /tmp/project/README`,
    );
    expect(cloned).toBe('learned\n');
    for (const name of CDN) await sandbox.commands.run(`curl -sSf http://${name}:${port}/asset.js`);

    const learned = await runMoat([
      'suggest',
      ...['--api', api, '--key', API_KEY, '--sandbox', sandbox.sandboxId, '--check'],
    ]);
    expect(learned.code, learned.stderr).toBe(0);
    expect(learned.stderr).toMatch(/--check: replayed \d+ records: every one allowed/);
    const policyFile = path.join(scratch, 'learned.json');
    writeFileSync(policyFile, learned.stdout);
    // Presets where one covers the names, a wildcard for three names of one domain, a name.
    expect(learned.stdout).toMatch(
      /^ {4}"preset:pypi", \/\/ \d+ flows: files\.pythonhosted\.org, pypi\.org$/m,
    );
    // Names and wildcards on the port they were reached on.
    expect(learned.stdout).toContain(
      `    "*.cdn-mirror.test:${port}", // 3 flows: a.cdn-mirror.test, b.cdn-mirror.test, c.cdn-mirror.test\n`,
    );
    expect(learned.stdout).toMatch(
      new RegExp(`^ {4}"code\\.forge\\.test:${port}" // \\d+ flows$`, 'm'),
    );
    expect(learned.stdout).toMatch(/"denyOut": \["0\.0\.0\.0\/0"\]/);

    const replayed = await runMoat([
      'check',
      ...['--policy', policyFile, '--replay-api', api, '--key', API_KEY],
      ...['--sandbox', sandbox.sandboxId],
    ]);
    expect(replayed.code, replayed.stderr).toBe(0);
    expect(replayed.stderr).toMatch(/: 0 newly denied/);
    const unseen = await runMoat([
      ...['check', '--policy', policyFile, 'elsewhere.test', 'pypi.org'],
      `${FORGE}:22`,
    ]);
    expect(unseen.code).toBe(1);
    expect(unseen.stdout).toMatch(/^DENY {2}elsewhere\.test /m);
    expect(unseen.stdout).toMatch(/^DENY {2}code\.forge\.test:22 /m);
    expect(unseen.stdout).toMatch(/^ALLOW pypi\.org {2}\[allowOut preset:pypi/m);
  }, 240_000);
});
