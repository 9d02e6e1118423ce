/**
 * `moat cni install`, run as the built CLI: what it writes (a plugin that runs without PATH, a
 * conflist naming the key file and never the key), what it refuses (a policy file with the very
 * messages `moat lint` gives, a key file others may read, missing folders) and its help.
 */
import {
  chmodSync,
  existsSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runMoat } from '../support/moat.js';
import { runPluginFile } from './plugin-run.js';

const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-cni-install-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

const KEY = 'install-test-key-0123456789abcdef';
const keyFile = path.join(scratch, 'api-key');
writeFileSync(keyFile, `${KEY}\n`, { mode: 0o600 });

let n = 0;
/** A fresh pair of folders for one install. */
function folders() {
  const dir = path.join(scratch, `install-${n++}`);
  return { binDir: path.join(dir, 'bin'), confDir: path.join(dir, 'net.d') };
}

const install = (dirs: { binDir: string; confDir: string }, extra: string[] = []) =>
  runMoat(['cni', 'install', '--bin-dir', dirs.binDir, '--conf-dir', dirs.confDir, ...extra]);

describe('moat cni install', () => {
  it('writes an executable plugin and the network "moat", and says where', async () => {
    const dirs = folders();
    const done = await install(dirs, ['--api', 'http://127.0.0.1:3000/', '--key-file', keyFile]);
    expect(done.code, done.stderr).toBe(0);
    const plugin = path.join(dirs.binDir, 'moat');
    const conflist = path.join(dirs.confDir, 'moat.conflist');
    expect(done.stdout).toContain(`wrote ${plugin}`);
    expect(done.stdout).toContain(`wrote ${conflist}`);
    expect(statSync(plugin).mode & 0o777).toBe(0o755);
    expect(statSync(conflist).mode & 0o777).toBe(0o644);
    expect(JSON.parse(readFileSync(conflist, 'utf8'))).toEqual({
      cniVersion: '1.0.0',
      name: 'moat',
      plugins: [{ type: 'moat', api: 'http://127.0.0.1:3000', keyFile }],
    });
    expect(readFileSync(conflist, 'utf8') + done.stdout + done.stderr).not.toContain(KEY);
    // A runtime's environment: no PATH, nothing but the CNI variables.
    const version = await runPluginFile(plugin, { CNI_COMMAND: 'VERSION' }, '');
    expect(version.code, version.stderr).toBe(0);
    expect(version.json?.supportedVersions).toContain('1.0.0');
  });

  it('puts the policy file in the conflist, less its description', async () => {
    const dirs = folders();
    const policy = path.join(scratch, 'pip.json');
    const body = { allowOut: ['pypi.org', 'files.pythonhosted.org'], denyOut: ['0.0.0.0/0'] };
    writeFileSync(policy, JSON.stringify({ description: 'pip only', ...body }));
    const done = await install(dirs, ['--key-file', keyFile, '--policy', policy]);
    expect(done.code, done.stderr).toBe(0);
    const list = JSON.parse(readFileSync(path.join(dirs.confDir, 'moat.conflist'), 'utf8'));
    expect(list.plugins[0]).toEqual({
      type: 'moat',
      api: 'http://127.0.0.1:3000',
      keyFile,
      policy: body,
    });
  });

  it('refuses a policy file with the messages moat lint gives, and writes nothing', async () => {
    const policy = path.join(scratch, 'bad.json');
    writeFileSync(policy, JSON.stringify({ allowOut: ['pypi.org'], denyOut: ['example.com'] }));
    const lint = await runMoat(['lint', policy]);
    const errors = lint.stderr.split('\n').filter((line) => line.includes(': error: '));
    expect(errors.length).toBeGreaterThan(0);
    const dirs = folders();
    const done = await install(dirs, ['--key-file', keyFile, '--policy', policy]);
    expect(done.code).toBe(2);
    for (const line of errors) expect(done.stderr).toContain(line);
    expect(existsSync(dirs.binDir) || existsSync(dirs.confDir)).toBe(false);
  });

  it('refuses a key file others may read, a relative one, a bad URL and missing folders', async () => {
    const open = path.join(scratch, 'open-key');
    writeFileSync(open, `${KEY}\n`);
    chmodSync(open, 0o640);
    const cases: Array<[string[], RegExp]> = [
      [['--key-file', open], /--key-file .*open-key has mode 0640: .*chmod 600/],
      [['--key-file', 'api-key'], /--key-file api-key must be an absolute path/],
      [['--key-file', keyFile, '--api', 'moat:3000'], /--api moat:3000 must be an http\(s\) URL/],
    ];
    for (const [extra, message] of cases) {
      const dirs = folders();
      const done = await install(dirs, extra);
      expect({ code: done.code, stderr: done.stderr }).toMatchObject({
        code: 2,
        stderr: expect.stringMatching(message),
      });
      expect(existsSync(dirs.binDir)).toBe(false);
      expect(done.stderr).not.toContain(KEY);
    }
    const none = await runMoat(['cni', 'install', '--bin-dir', scratch]);
    expect(none.code).toBe(2);
    expect(none.stderr).toMatch(/--bin-dir and --conf-dir are required\nRun "moat cni --help"/);
    const unknown = await runMoat(['cni', 'uninstall']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/unknown subcommand "uninstall"/);
  });

  it('notes a key file Moat has not generated yet, and installs', async () => {
    const dirs = folders();
    const done = await install(dirs, ['--key-file', path.join(scratch, 'later', 'api-key')]);
    expect(done.code, done.stderr).toBe(0);
    expect(done.stdout).toMatch(/not there yet/);
  });

  it('has help that names every option and where runtimes look', async () => {
    for (const args of [
      ['cni', '--help'],
      ['cni', 'install', '--help'],
      ['help', 'cni'],
    ]) {
      const help = await runMoat(args);
      expect(help.code).toBe(0);
      for (const word of [
        '--bin-dir',
        '--conf-dir',
        '--api',
        '--key-file',
        '--policy',
        '/opt/cni/bin',
        '/etc/cni/net.d',
        'moat.conflist',
      ])
        expect(help.stdout, args.join(' ')).toContain(word);
    }
    expect((await runMoat(['--help'])).stdout).toMatch(/^ {2}cni +install Moat's CNI plugin/m);
  });
});
