/**
 * Attacker tests for snapshots (layer_tool flatten, host root over files a sandbox wrote).
 * Found in review: a hardlink's first copy was remembered by a folder fd that was closed and
 * reused, and the link made again followed symlinks, so a sandbox's symlink to a 0600 host
 * file became a hardlink of it in the next snapshot; a sparse file of 3 GB became 3 GB of
 * zeros; a deep tree ended the copy with a RecursionError; ACLs travelled with unshifted ids.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runShell, shell } from '../support/sandbox-shell.js';
import { type Harness, skipReason, startHarness } from './runtime-harness.js';

const skip = skipReason('confinement/layers');
const LAYER_TOOL = new URL('../../src/runtime/supervisor/layer_tool.py', import.meta.url).pathname;
let harness: Harness;
let victim: string;
let canary: string;
const CANARY_TEXT = 'host only: no sandbox may ever read this';

beforeAll(async () => {
  if (skip) return;
  harness = await startHarness();
  victim = mkdtempSync(path.join(os.tmpdir(), 'moat-victim-'));
  canary = path.join(victim, 'canary');
  writeFileSync(canary, CANARY_TEXT, { mode: 0o600 });
}, 60_000);

afterAll(async () => {
  await harness?.close();
  if (victim) rmSync(victim, { recursive: true, force: true });
});

/** The stored layer of template `key` (its manifest names it). */
function layerOf(key: string): string {
  const manifest = path.join(harness.dataDir, 'templates', `${encodeURIComponent(key)}.json`);
  const { layer } = JSON.parse(readFileSync(manifest, 'utf8')) as { layer: string };
  return path.join(harness.dataDir, 'layers', layer);
}

describe.skipIf(skip)('a snapshot never brings a host file into a layer', () => {
  it('keeps hardlinks between the sandbox own files and never follows its symlinks', async () => {
    const first = await harness.sandbox();
    await shell(
      first,
      'mkdir -p /w/a /w/b && echo decoy > /w/a/f && ln /w/a/f /w/b/g && ln -s "$1" /w/b/f',
      { user: 'root', args: [canary] },
    );
    await harness.runtime.snapshot(first.sandboxID, 'links1');
    const second = await harness.sandbox({}, 'links1');
    expect(await shell(second, 'cat /w/b/g; stat -c %h /w/a/f', { user: 'root' })).toBe(
      'decoy\n2\n',
    );
    await harness.runtime.snapshot(second.sandboxID, 'links2');
    const third = await harness.sandbox({}, 'links2');
    const seen = await runShell(third, 'cat /w/b/g /w/a/f; stat -c %i /w/a/f /w/b/g', {
      user: 'root',
    });
    expect(seen.stdout).not.toContain(CANARY_TEXT);
    const [g, f, inodeF, inodeG] = seen.stdout.trim().split('\n');
    expect([g, f]).toEqual(['decoy', 'decoy']);
    expect(inodeF).toBe(inodeG);
    expect(statSync(canary).nlink).toBe(1);
  }, 120_000);

  it('stores a sparse file as its data, not its size', async () => {
    const sandbox = await harness.sandbox();
    await shell(sandbox, 'truncate -s 3G /home/user/sparse && echo end >> /home/user/sparse');
    await harness.runtime.snapshot(sandbox.sandboxID, 'sparse');
    const stored = statSync(path.join(layerOf('sparse'), 'root', 'home', 'user', 'sparse'));
    expect(stored.size).toBe(3 * 2 ** 30 + 4);
    expect(stored.blocks * 512).toBeLessThan(2 ** 20);
    const made = await harness.sandbox({}, 'sparse');
    expect(await shell(made, 'stat -c %s /home/user/sparse; tail -c 4 /home/user/sparse')).toBe(
      `${3 * 2 ** 30 + 4}\nend\n`,
    );
  }, 120_000);

  it('copies a tree deeper than any recursion limit', async () => {
    const sandbox = await harness.sandbox();
    await shell(
      sandbox,
      'cd /home/user && for i in $(seq 1 1500); do mkdir d && cd d || exit 1; done && echo bottom > end',
    );
    await harness.runtime.snapshot(sandbox.sandboxID, 'deep');
    const made = await harness.sandbox({}, 'deep');
    expect(
      await shell(
        made,
        'cd /home/user && n=0; while [ -d d ]; do cd d; n=$((n+1)); done; echo $n; cat end',
      ),
    ).toBe('1500\nbottom\n');
  }, 120_000);

  it('leaves POSIX ACLs behind (their ids are the sandbox ids) but keeps user labels', async () => {
    const sandbox = await harness.sandbox();
    await shell(
      sandbox,
      `python3 -c "
import os, struct
entries = [(1, 6, 0xffffffff), (2, 7, 0), (4, 4, 0xffffffff), (0x10, 7, 0xffffffff), (0x20, 0, 0xffffffff)]
open('/home/user/acl', 'w').write('x')
os.setxattr('/home/user/acl', 'system.posix_acl_access', struct.pack('<I', 2) + b''.join(struct.pack('<HHI', *e) for e in entries))
os.setxattr('/home/user/acl', 'user.label', b'kept')
"`,
      { user: 'root' },
    );
    await harness.runtime.snapshot(sandbox.sandboxID, 'acl');
    const stored = path.join(layerOf('acl'), 'root', 'home', 'user', 'acl');
    const names = execFileSync(
      '/usr/bin/python3',
      ['-c', 'import os, sys; print(sorted(os.listxattr(sys.argv[1])))', stored],
      { encoding: 'utf8' },
    );
    expect(names).toContain('user.label');
    expect(names).not.toContain('system.posix_acl_access');
  }, 120_000);
});

describe.skipIf(skip)('layer_tool flatten on its own', () => {
  it('refuses a writable layer holding more data than the budget, naming it', () => {
    const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-flatten-'));
    try {
      const upper = path.join(scratch, 'upper');
      mkdirSync(path.join(upper, 'root'), { recursive: true });
      writeFileSync(path.join(upper, 'root', 'big'), Buffer.alloc(2 << 20, 1));
      const run = (budget: number) =>
        spawnSync(
          '/usr/bin/python3',
          [
            '-I',
            '-S',
            '-B',
            LAYER_TOOL,
            'flatten',
            path.join(scratch, `out${budget}`),
            ...['100000', '0', '65536', String(budget), upper],
          ],
          { encoding: 'utf8' },
        );
      const refused = run(1 << 20);
      expect(refused.status).toBe(1);
      expect(refused.stderr.trim()).toBe(
        "the snapshot holds more data than the sandbox's disk can",
      );
      const made = run(4 << 20);
      expect(made.status, made.stderr).toBe(0);
      expect(statSync(path.join(scratch, `out${4 << 20}`, 'root', 'big')).size).toBe(2 << 20);
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
  });
});
