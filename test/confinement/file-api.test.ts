/**
 * Attacker tests: the sandbox API's file operations and symlinks a sandbox controls. Before
 * confinement, Moat resolved sandbox paths on the host's view: a symlink moved to the top of
 * the sandbox became a bind of the host's `/`, and a folder swapped for a symlink between check
 * and use redirected Remove to a host file. Every operation now runs inside the sandbox.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RuntimeSandbox } from '../../src/runtime/index.js';
import { runShell, shell } from '../support/sandbox-shell.js';
import { type Harness, skipReason, startHarness } from './runtime-harness.js';

const skip = skipReason('confinement/file-api');
let harness: Harness;
let sandbox: RuntimeSandbox;
/** A folder of the host with a file no sandbox may touch. */
let victim: string;
const VICTIM_TEXT = 'host file, never to be touched';

beforeAll(async () => {
  if (skip) return;
  harness = await startHarness();
  sandbox = await harness.sandbox();
  victim = mkdtempSync(path.join(os.tmpdir(), 'moat-victim-'));
  writeFileSync(path.join(victim, 'victim.txt'), VICTIM_TEXT);
}, 60_000);

afterAll(async () => {
  await harness?.close();
  if (victim) rmSync(victim, { recursive: true, force: true });
});

const victimUntouched = () => {
  expect(readdirSync(victim)).toEqual(['victim.txt']);
  expect(readFileSync(path.join(victim, 'victim.txt'), 'utf8')).toBe(VICTIM_TEXT);
};

describe.skipIf(skip)('a symlink at the top of the sandbox never exposes the host', () => {
  it('Move places links to / and ../../.. at the sandbox’s /: they lead to the sandbox’s own /, also in a snapshot', async () => {
    await shell(sandbox, 'ln -s / /home/user/hostroot && ln -s ../../.. /home/user/up');
    // Only root may write to the sandbox's /: the user is refused, root is not.
    await expect(sandbox.files.move('user', '/home/user/hostroot', '/hostroot')).rejects.toThrow();
    await sandbox.files.move('root', '/home/user/hostroot', '/hostroot');
    await sandbox.files.move('root', '/home/user/up', '/up');
    const seeThrough = async (target: RuntimeSandbox) => {
      for (const link of ['/hostroot', '/up']) {
        const listed = (await shell(target, `ls -A ${link}/`)).split('\n');
        expect(listed, link).toEqual(expect.arrayContaining(['home', 'tmp', 'usr', 'etc']));
        // The host's data folder, the host's own top-level folders and the victim: absent.
        for (const hostPath of [harness.dataDir, victim, '/run/moat', '/work', '/root/.npm']) {
          const probe = await runShell(target, `ls -d "${link}${hostPath}"`);
          expect(probe.code, `${link}${hostPath}`).not.toBe(0);
        }
      }
      expect(await runShell(target, `cat /hostroot${victim}/victim.txt`)).toMatchObject({
        code: 1,
      });
    };
    await seeThrough(sandbox);
    await harness.runtime.snapshot(sandbox.sandboxID, 'confinement-top-links');
    const made = await harness.sandbox({}, 'confinement-top-links');
    expect((await shell(made, 'readlink /hostroot /up')).split('\n')).toEqual([
      '/',
      '../../..',
      '',
    ]);
    await seeThrough(made);
    victimUntouched();
  });

  it('a symlink named like a system folder at the top is the sandbox’s own, not a bind', async () => {
    await shell(sandbox, 'rm -rf /home/user/fake && ln -s /tmp /home/user/fake');
    await sandbox.files.move('root', '/home/user/fake', '/opt-fake');
    await sandbox.files.move('root', '/opt-fake', '/srv/link');
    expect(await shell(sandbox, 'readlink /srv/link')).toBe('/tmp\n');
    victimUntouched();
  });
});

describe.skipIf(skip)('racing the file API with symlink swaps never reaches the host', () => {
  it('Remove, Move, write and read through a folder swapped for a host-path symlink in a loop', async () => {
    await shell(sandbox, 'mkdir -p /home/user/race && echo inside > /home/user/race/own.txt');
    // The attacker: swaps race/d between a real folder (with a victim.txt) and symlinks to the
    // host's victim folder, absolute and relative, as fast as it can, for at most 20 s.
    const swapper = runShell(
      sandbox,
      [
        'end=$(($(date +%s) + 20)); cd /home/user/race',
        'while [ ! -e stop ] && [ $(date +%s) -lt $end ]; do',
        '  mkdir -p d.new && echo decoy > d.new/victim.txt && mv -T d.new d 2>/dev/null',
        '  rm -rf d; ln -sfn "$1" d',
        '  rm -f d; ln -sfn "../../../..$1" d',
        '  rm -f d',
        'done',
      ].join('\n'),
      { args: [victim] },
    );
    const deadline = Date.now() + 8000;
    let attempts = 0;
    for (; attempts < 400 && Date.now() < deadline; attempts++) {
      const through = '/home/user/race/d/victim.txt';
      const ops: Array<Promise<unknown>> = [
        sandbox.files.remove('user', through),
        sandbox.files.remove('root', through),
        sandbox.files.move('root', through, '/home/user/race/moved.txt'),
        sandbox.files.move('root', '/home/user/race/own.txt', '/home/user/race/d/planted.txt'),
        sandbox.files.read('root', through).then((file) => file.body.resume()),
        sandbox.files.compose(
          'root',
          ['/home/user/race/own.txt'],
          '/home/user/race/d/composed.txt',
        ),
        (async () => {
          const upload = await sandbox.files.upload('root');
          try {
            const staged = await upload.stage('/home/user/race/d/new.txt', {});
            await staged.write(Buffer.from('pwned'));
            await staged.end();
            await upload.commit();
          } catch {
            await upload.abort();
          }
        })(),
      ];
      await Promise.allSettled(ops);
      await shell(sandbox, 'echo inside > /home/user/race/own.txt').catch(() => undefined);
      victimUntouched();
    }
    await shell(sandbox, 'touch /home/user/race/stop');
    await swapper;
    expect(attempts).toBeGreaterThan(20);
    victimUntouched();
  }, 30_000);
});

describe.skipIf(skip)('a listing the sandbox made huge never floods Moat', () => {
  it('is refused past its byte bound, naming the folder; the next call is answered', async () => {
    const sandbox = await harness.sandbox({ diskSizeMB: 512 });
    await shell(
      sandbox,
      `python3 -c "
import os
os.makedirs('/home/user/bomb', exist_ok=True)
first = '/home/user/bomb/' + 'a' * 240
open(first, 'w').close()
for i in range(1):
    os.setxattr(first, 'user.e2b.k%d' % i, b'M' * 700)
for i in range(20000):
    os.link(first, '/home/user/bomb/%05d' % i + 'n' * 240)
"`,
    );
    await expect(sandbox.files.list('user', '/home/user/bomb', 1)).rejects.toMatchObject({
      code: 'exhausted',
      message: 'the listing of /home/user/bomb is over 16 MiB; list with a smaller depth',
    });
    expect((await sandbox.files.stat('user', '/home/user/bomb')).type).toBe('FILE_TYPE_DIRECTORY');
  }, 60_000);
});

describe.skipIf(skip)('the sandbox’s own /etc never stalls the file API', () => {
  it('answers with numeric owners while /etc/passwd and /etc/group are FIFOs', async () => {
    await shell(
      sandbox,
      'for f in passwd group; do mv /etc/$f /etc/$f.real && mkfifo -m 644 /etc/$f; done',
      { user: 'root' },
    );
    try {
      const entry = await Promise.race([
        sandbox.files.stat('user', '/home/user'),
        new Promise<never>((_, reject) =>
          setTimeout(() => reject(new Error('no answer within 5 s')), 5000),
        ),
      ]);
      expect(entry).toMatchObject({ owner: '1000', group: '1000' });
    } finally {
      await shell(sandbox, 'for f in passwd group; do rm /etc/$f; mv /etc/$f.real /etc/$f; done', {
        user: 'root',
      });
    }
    expect(await sandbox.files.stat('user', '/home/user')).toMatchObject({ owner: 'user' });
  });
});
