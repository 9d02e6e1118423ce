/**
 * Automatic sandbox id ranges across crashes. A Moat that crashed left its range free to any
 * other Moat starting meanwhile, and then could not start again on its own data folder (the ids
 * its sandboxes' files are owned by were another's). A range is now left to the data folder
 * that took it last while that folder exists, as long as another range is free.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { LOCK_DIR, RangeLock } from '../../src/runtime/range-lock.js';
import { IDS_PER_SANDBOX, SandboxIds } from '../../src/runtime/sandbox-ids.js';

const skip = process.getuid?.() !== 0 ? 'needs root (locks in /run/moat)' : undefined;
if (skip) console.log(`confinement/sandbox-ids skipped: ${skip}`);
const folders: string[] = [];
const folder = () => {
  const made = mkdtempSync(path.join(os.tmpdir(), 'moat-ids-'));
  folders.push(made);
  return made;
};

afterAll(() => {
  for (const made of folders) rmSync(made, { recursive: true, force: true });
});

/** A pid that no process has any more. */
function deadPid(): number {
  return spawnSync('/bin/true').pid!;
}

const lockFile = (ids: SandboxIds) =>
  path.join(LOCK_DIR, `ids-${ids.first}-${ids.first + ids.slots * IDS_PER_SANDBOX - 1}.pid`);

describe.skipIf(skip)('automatic sandbox id ranges', () => {
  it('a crashed Moat’s range waits for its data folder; another Moat takes a different one', async () => {
    const crashed = folder();
    const first = await SandboxIds.acquire('auto', crashed);
    // As a SIGKILL leaves it: the lock file names a process that is gone.
    await first.stop();
    writeFileSync(lockFile(first), `${deadPid()}\n${crashed}\n`);
    const other = await SandboxIds.acquire('auto', folder());
    try {
      expect(other.first).not.toBe(first.first);
      const again = await SandboxIds.acquire('auto', crashed);
      expect(again.first).toBe(first.first);
      await again.stop();
    } finally {
      await other.stop();
    }
  });

  it('a cleanly stopped Moat’s range is left to it too', async () => {
    const stopped = folder();
    const first = await SandboxIds.acquire('auto', stopped);
    await first.stop();
    const other = await SandboxIds.acquire('auto', folder());
    expect(other.first).not.toBe(first.first);
    await other.stop();
    const again = await SandboxIds.acquire('auto', stopped);
    expect(again.first).toBe(first.first);
    await again.stop();
  });
});

describe('when every free range is kept for another data folder', () => {
  it('a new Moat takes the one released longest ago, not one a Moat is restarting to take back', async () => {
    const locks = folder();
    const held: SandboxIds[] = [];
    for (;;) {
      const taken = await SandboxIds.acquire('auto', folder(), locks).catch(() => undefined);
      if (taken === undefined) break;
      held.push(taken);
    }
    expect(held.length).toBeGreaterThan(2);
    // Stopped one after another, the lowest range last: a Moat about to start again on its
    // folder (the lowest is the one a scan in order would come to first).
    for (const ids of [...held].reverse()) {
      await ids.stop();
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const newcomer = await SandboxIds.acquire('auto', folder(), locks);
    expect(newcomer.first).toBe(held.at(-1)!.first);
    await newcomer.stop();
  });
});

describe('a range kept for its last data folder', () => {
  const lockIn = (dir: string, owner: string | undefined) =>
    new RangeLock('ids', 10, 19, 'range 10-19', 'advice', (a, b) => `${a}-${b}`, owner, dir);

  it('is kept while that folder exists, for every other folder, and free once it is gone', async () => {
    const locks = folder();
    const owner = folder();
    const mine = lockIn(locks, owner);
    await mine.acquire();
    await mine.release();
    expect(readFileSync(path.join(locks, 'ids-10-19.pid'), 'utf8')).toBe(`0\n${owner}\n`);
    expect(await lockIn(locks, folder()).keptForAnother()).toBe(true);
    expect(await lockIn(locks, owner).keptForAnother()).toBe(false);
    rmSync(owner, { recursive: true });
    expect(await lockIn(locks, folder()).keptForAnother()).toBe(false);
  });

  it('without an owner, is removed on release as before', async () => {
    const locks = folder();
    const lock = lockIn(locks, undefined);
    await lock.acquire();
    await lock.release();
    expect(readdirSync(locks)).toEqual([]);
  });
});
