/**
 * A git server over SSH inside a network namespace of a test's own: dropbear (from
 * scripts/system-packages.mjs --ssh) on `address:22`, serving one bare repository with one
 * commit to one client key. It runs in a private mount namespace whose /root is an empty tmpfs
 * holding only that key's authorized_keys, so nothing of the host's own SSH set-up is read or
 * written.
 */
import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const DROPBEAR = '/usr/sbin/dropbear';

/** Why the git over SSH origin cannot run here (dropbear missing and not installable). */
export function gitSshSkipReason(): string | undefined {
  if (!existsSync(DROPBEAR))
    spawnSync(process.execPath, [path.join(ROOT, 'scripts', 'system-packages.mjs'), '--ssh'], {
      stdio: 'inherit',
      timeout: 300_000,
    });
  return existsSync(DROPBEAR) ? undefined : 'dropbear is not installed and could not be';
}

export interface GitSshOrigin {
  /** The client's private key (OpenSSH format), for the sandbox to use. */
  readonly privateKey: string;
  /** The bare repository's path on the server. */
  readonly repository: string;
  /** What the repository's one commit holds in README. */
  readonly readme: string;
  close(): Promise<void>;
}

export async function startGitSshOrigin(namespace: string, address: string): Promise<GitSshOrigin> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'moat-git-ssh-'));
  const run = (file: string, args: string[], cwd = dir) =>
    execFileSync(file, args, { cwd, stdio: 'pipe', timeout: 30_000 });
  run('/usr/bin/dropbearkey', ['-t', 'ed25519', '-f', 'host_key']);
  run('/usr/bin/ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'moat-test', '-f', 'client']);
  const readme = `moat git over ssh ${process.pid}`;
  const work = path.join(dir, 'work');
  const repository = path.join(dir, 'repo.git');
  run('/usr/bin/git', ['init', '-q', '--bare', repository]);
  run('/usr/bin/git', ['init', '-q', '-b', 'main', work]);
  writeFileSync(path.join(work, 'README'), `${readme}\n`);
  const git = (...args: string[]) =>
    run(
      '/usr/bin/git',
      ['-c', 'user.name=moat', '-c', 'user.email=moat@test.invalid', ...args],
      work,
    );
  git('add', 'README');
  git('commit', '-q', '-m', 'one');
  git('push', '-q', repository, 'main');
  run('/usr/bin/git', ['--git-dir', repository, 'symbolic-ref', 'HEAD', 'refs/heads/main']);
  const script = [
    'set -e',
    'mount -t tmpfs -o mode=0700 moat-git-ssh /root',
    'mkdir -m 0700 /root/.ssh',
    `cp ${dir}/client.pub /root/.ssh/authorized_keys`,
    'chmod 0600 /root/.ssh/authorized_keys',
    `exec ${DROPBEAR} -F -E -s -j -k -p ${address}:22 -r ${dir}/host_key`,
  ].join('\n');
  const server: ChildProcess = spawn(
    '/usr/bin/nsenter',
    [
      `--net=/run/netns/${namespace}`,
      '--',
      '/usr/bin/unshare',
      '--mount',
      '--propagation',
      'private',
      '/bin/sh',
      '-c',
      script,
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let log = '';
  server.stderr!.setEncoding('utf8').on('data', (chunk: string) => (log += chunk));
  const exited = new Promise<void>((resolve) => server.once('exit', () => resolve()));
  // Listening once something answers on the port inside the namespace.
  for (let attempt = 0; ; attempt++) {
    const probe = spawnSync(
      '/usr/bin/nsenter',
      [
        `--net=/run/netns/${namespace}`,
        '--',
        '/usr/bin/timeout',
        '1',
        'bash',
        '-c',
        `exec 3<>/dev/tcp/${address}/22 && head -c4 <&3`,
      ],
      { encoding: 'utf8' },
    );
    if (probe.stdout === 'SSH-') break;
    if (attempt >= 50 || server.exitCode !== null) {
      server.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`dropbear did not start on ${address}:22: ${log}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return {
    privateKey: readFileSync(path.join(dir, 'client'), 'utf8'),
    repository,
    readme,
    async close() {
      server.kill('SIGKILL');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
