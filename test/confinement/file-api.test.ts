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

/** A whole-file write through the file API as `user`, the way POST /files makes one: the paths
 * it wrote. */
async function write(target: RuntimeSandbox, user: string, path: string, text: string) {
  const upload = await target.files.upload(user);
  try {
    const staged = await upload.stage(path, {});
    await staged.write(Buffer.from(text));
    await staged.end();
    return await upload.commit();
  } catch (error) {
    await upload.abort();
    throw error;
  }
}

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
        write(sandbox, 'root', '/home/user/race/d/new.txt', 'pwned'),
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

describe.skipIf(skip)(
  'a write for the user where only root may create (E2B’s envd writes as root)',
  () => {
    /** `stat` of paths inside the sandbox: owner:group and mode, or `absent`. */
    const owners = (target: RuntimeSandbox, ...paths: string[]) =>
      shell(target, 'for p in "$@"; do stat -c "%u:%g %a" "$p" 2>/dev/null || echo absent; done', {
        user: 'root',
        args: paths,
      }).then((out) => out.trim().split('\n'));

    /** Runs `lines` as a Python program in the sandbox as `user`, with `os`, `time`, the C
     * library as `libc` and `end` (20 s after its start, a bound for its loops). */
    const python = (target: RuntimeSandbox, lines: string[], user = 'user') =>
      runShell(target, 'exec python3 -c "$1"', {
        user,
        args: [
          [
            'import ctypes, os, time',
            'libc = ctypes.CDLL(None, use_errno=True)',
            'end = time.monotonic() + 20',
            ...lines,
          ].join('\n'),
        ],
      });

    it('makes only what is missing and hands it to the user; what exists stays as it is', async () => {
      const target = await harness.sandbox();
      await write(target, 'user', '/0/a/b.txt', 'made for the user');
      expect(await owners(target, '/0', '/0/a', '/0/a/b.txt')).toEqual([
        '1000:1000 755',
        '1000:1000 755',
        '1000:1000 644',
      ]);
      // Root's file in root's folder, and another user's in theirs: the user may not replace them.
      await shell(
        target,
        'mkdir /rooted && echo root > /rooted/root.txt && mkdir -m 755 /rooted/other && echo theirs > /rooted/other/theirs.txt && chown -R 1001:1001 /rooted/other',
        { user: 'root' },
      );
      for (const path of ['/rooted/root.txt', '/rooted/other/theirs.txt']) {
        await expect(write(target, 'user', path, 'replaced')).rejects.toMatchObject({
          code: 'EACCES',
        });
      }
      expect(await shell(target, 'cat /rooted/root.txt /rooted/other/theirs.txt')).toBe(
        'root\ntheirs\n',
      );
      expect(await owners(target, '/rooted/root.txt', '/rooted/other/theirs.txt')).toEqual([
        '0:0 644',
        '1001:1001 644',
      ]);
      // A new file in the other user's folder is the user's, as envd makes it.
      await write(target, 'user', '/rooted/other/mine.txt', 'mine');
      expect(await owners(target, '/rooted/other', '/rooted/other/mine.txt')).toEqual([
        '1001:1001 755',
        '1000:1000 644',
      ]);
      // Root makes no folder inside a folder others may change (the user's, read-only or not):
      // the user makes its own there. A new file in one is the user's.
      await shell(target, 'mkdir -m 555 /home/user/closed');
      await expect(write(target, 'user', '/home/user/closed/new/f.txt', 'x')).rejects.toMatchObject(
        { code: 'EACCES' },
      );
      await write(target, 'user', '/home/user/closed/f.txt', 'x');
      expect(await owners(target, '/home/user/closed/new', '/home/user/closed/f.txt')).toEqual([
        'absent',
        '1000:1000 644',
      ]);
    });

    it('creates nothing for the user under the system folders, where a file the user may rewrite would run as root', async () => {
      const target = await harness.sandbox();
      const planted = [
        '/etc/ld.so.preload',
        '/etc/profile.d/p.sh',
        '/root/.bashrc',
        '/usr/local/bin/p',
        '/var/lib/dpkg/p',
      ];
      for (const path of planted) {
        await expect(write(target, 'user', path, 'planted'), path).rejects.toMatchObject({
          code: 'EACCES',
          message: expect.stringContaining('outside the system folders'),
        });
      }
      expect(await owners(target, ...planted)).toEqual(planted.map(() => 'absent'));
      // Outside them, as E2B's own test writes: made for the user.
      await write(target, 'user', '/srv/made.txt', 'made');
      expect(await owners(target, '/srv/made.txt')).toEqual(['1000:1000 644']);
    });

    it('follows no symbolic link: one the user planted, or root’s, refuses the write', async () => {
      const target = await harness.sandbox();
      await shell(target, 'ln -s /etc /home/user/etc-link && ln -s /etc/made /home/user/dangling');
      await shell(target, 'mkdir -p /rooted/links && ln -s /etc /rooted/links/etc', {
        user: 'root',
      });
      const before = await shell(target, 'ls -A /etc');
      // The user's own write reaches /etc and is refused; root's for the user meets the link.
      for (const path of [
        '/home/user/etc-link/planted.txt',
        '/home/user/etc-link/made/planted.txt',
        '/rooted/links/etc/planted.txt',
      ]) {
        await expect(write(target, 'user', path, 'planted'), path).rejects.toMatchObject({
          code: 'EACCES',
        });
      }
      await expect(write(target, 'user', '/home/user/dangling/p.txt', 'planted')).rejects.toThrow();
      expect(await shell(target, 'ls -A /etc')).toBe(before);
      expect(await shell(target, 'readlink /home/user/etc-link')).toBe('/etc\n');
    });

    it('a folder of the user swapped for a link to /etc in a loop never lets root create there', async () => {
      const target = await harness.sandbox();
      await write(target, 'user', '/0/seed.txt', 'seed');
      const before = await shell(target, 'ls -A /etc');
      const swapper = runShell(
        target,
        [
          'end=$(($(date +%s) + 20)); cd /0',
          'while [ ! -e stop ] && [ $(date +%s) -lt $end ]; do',
          '  ln -sfn /etc d; sleep 0.02; rm -f d',
          '  mkdir d; sleep 0.005; rm -rf d',
          'done',
        ].join('\n'),
      );
      const deadline = Date.now() + 8000;
      let attempts = 0;
      for (; attempts < 300 && Date.now() < deadline; attempts++) {
        await write(target, 'user', `/0/d/e/pwn${attempts}.txt`, 'pwned').catch(() => undefined);
      }
      await shell(target, 'touch /0/stop');
      await swapper;
      expect(attempts).toBeGreaterThan(20);
      expect(await shell(target, 'ls -A /etc')).toBe(before);
      // Everything the writes made lies below /0 and is the user's.
      expect(await shell(target, 'find /0 ! -uid 1000', { user: 'root' })).toBe('');
    }, 30_000);

    it('a relative path is in the user’s home also when root creates it, never in root’s', async () => {
      const target = await harness.sandbox();
      // The user's own agent is refused in a home the user made read-only; root's creates.
      await shell(target, 'chmod 555 /home/user');
      expect(await write(target, 'user', 'notes.txt', 'for the user')).toEqual([
        '/home/user/notes.txt',
      ]);
      expect(await owners(target, '/home/user/notes.txt', '/root/notes.txt')).toEqual([
        '1000:1000 644',
        'absent',
      ]);
    });

    it('a folder root makes, swapped in a folder the user may change, never hands over another', async () => {
      // Two CPUs: the user's exchanger and root's agent run side by side.
      const target = await harness.sandbox({ cpuCount: 2 });
      const count = 1500;
      // The user's folder p holds folders of root's (say, made by a command run as root), each
      // with a secret: the user may rename them in p but not look inside.
      await shell(target, 'mkdir -p /home/user/q/p');
      const secrets = await python(
        target,
        [
          `for i in range(${count}):`,
          "    os.mkdir(f'/home/user/q/p/v{i}', 0o700)",
          "    open(f'/home/user/q/p/v{i}/secret', 'w').write('secret')",
        ],
        'root',
      );
      expect(secrets.stderr).toBe('');
      // The user holds p open and closes q to itself: its own agent is refused on the way to
      // p/y<i>, so root's makes y<i>. The moment it appears (still empty), two racers (one may
      // be off its CPU) each try to rename v<i> over it, before root opens it.
      const racers = [0, 1].map((racer) =>
        python(target, [
          "p = os.open('/home/user/q/p', os.O_PATH)",
          `open('/home/user/ready${racer}', 'w').close()`,
          "made, theirs, i, spins = b'y0', b'v0', 0, 0",
          "while not (spins % 4096 == 0 and os.path.exists('/home/user/stop')) and time.monotonic() < end:",
          '    spins += 1',
          '    try:',
          '        os.lstat(made, dir_fd=p)',
          '    except FileNotFoundError:',
          '        continue',
          '    libc.renameat(p, theirs, p, made)',
          '    i += 1',
          "    made, theirs = f'y{i}'.encode(), f'v{i}'.encode()",
        ]),
      );
      const ready = 'test -e /home/user/ready0 && test -e /home/user/ready1';
      for (let tries = 0; (await runShell(target, ready)).code !== 0;) {
        expect(++tries).toBeLessThan(100);
      }
      await shell(target, 'chmod 0 /home/user/q');
      const deadline = Date.now() + 15_000;
      let attempts = 0;
      for (; attempts < count && Date.now() < deadline; attempts++) {
        await write(target, 'user', `/home/user/q/p/y${attempts}/f.txt`, 'x').catch(
          () => undefined,
        );
      }
      await shell(target, 'touch /home/user/stop');
      for (const racer of racers) expect((await racer).stderr).toBe('');
      expect(attempts).toBeGreaterThan(100);
      // Every folder holding a secret is still root's alone.
      const holders = await shell(
        target,
        'cd /home/user/q/p && for s in */secret; do stat -c "%u:%g %a" "${s%/secret}"; done | sort | uniq -c',
        { user: 'root' },
      );
      expect(holders.trim()).toBe(`${count} 0:0 700`);
    }, 60_000);
  },
);

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
