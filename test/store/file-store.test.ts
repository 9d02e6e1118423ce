/**
 * The embedded store on real files in temporary folders: the Store contract, then what only
 * files have: group commit, compaction, recovery from a torn tail, refusal of damaged or foreign
 * files, the folder lock, and a property test with torn tails and compaction against a Map model.
 */
import { spawn } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import {
  FileStore,
  type FileStoreOptions,
  type JsonValue,
  type StoreChange,
  StoreOpenError,
} from '../../src/store/index.js';
import {
  applyToModel,
  changeOf,
  contents,
  del,
  describeStoreContract,
  expectMatches,
  put,
  type StoreModel,
} from './store-contract.js';

const folders: string[] = [];
const opened: FileStore[] = [];

afterEach(async () => {
  await Promise.all(opened.splice(0).map((store) => store.close()));
  for (const folder of folders.splice(0)) rmSync(folder, { recursive: true, force: true });
});

/** A store folder that does not exist yet, inside a fresh temporary folder. */
function freshDir(): string {
  const parent = mkdtempSync(path.join(os.tmpdir(), 'moat-store-test-'));
  folders.push(parent);
  return path.join(parent, 'store');
}

async function openStore(dir: string, options: FileStoreOptions = {}): Promise<FileStore> {
  const store = await FileStore.open(dir, options);
  opened.push(store);
  return store;
}

async function close(store: FileStore): Promise<void> {
  opened.splice(opened.indexOf(store), 1);
  await store.close();
}

/** Closes and reopens, collecting recovery warnings. */
async function reopen(store: FileStore, options: FileStoreOptions = {}) {
  await close(store);
  const warnings: string[] = [];
  const next = await openStore(store.location, { ...options, onWarning: (m) => warnings.push(m) });
  return { store: next, warnings };
}

const logOf = (store: FileStore) => path.join(store.location, 'log');
const stateOf = (store: FileStore) => path.join(store.location, 'state');
/** The entry lines of a log (header and trailing empty line left out). */
const entryLines = (file: string) => readFileSync(file, 'utf8').split('\n').slice(1, -1);
const seqOf = (line: string) => (JSON.parse(line.slice(9)) as { seq: number }).seq;

/** Rewrites the log's entry lines (header kept) through `edit`. */
function editEntries(file: string, edit: (lines: string[]) => string[]): Promise<void> {
  const [header, ...rest] = readFileSync(file, 'utf8').split('\n');
  const lines = edit(rest.slice(0, -1));
  return writeFile(file, [header, ...lines, ''].join('\n'));
}

/** A line whose checksum no longer matches: one character of the JSON changed. */
const damage = (line: string) => line.replace('"seq"', '"sEq"');

/** Three committed records, then closed; returns the folder. */
async function threeCommits(): Promise<string> {
  const store = await openStore(freshDir());
  for (const key of ['a', 'b', 'c']) await store.commit([put('things', key, key)]);
  await close(store);
  return store.location;
}

describeStoreContract('FileStore', async () => {
  let store = await FileStore.open(freshDir());
  return {
    store,
    async reopen() {
      await store.close();
      store = await FileStore.open(store.location);
      return store;
    },
    // The folder goes with the other temporary folders after each test.
    cleanup: () => store.close(),
  };
});

describe('FileStore durability', () => {
  it('replays a multi-change commit all or nothing: a torn one leaves none of its changes', async () => {
    const store = await openStore(freshDir());
    await store.commit([put('c', 'first', 1)]);
    await store.commit([put('c', 'x', 1), put('d', 'y', 2), del('c', 'first')]);
    await close(store);
    // Cut the last entry in half, as a crash mid-append would.
    const text = readFileSync(logOf(store), 'utf8');
    await writeFile(logOf(store), text.slice(0, text.length - 20));
    const warnings: string[] = [];
    const again = await openStore(store.location, { onWarning: (m) => warnings.push(m) });
    expect(await contents(again, ['c', 'd'])).toEqual({ c: [['first', 1]], d: [] });
    expect(warnings).toHaveLength(1);
  });

  it('group-commits 200 concurrent commits: all resolve, fewer syncs, all present after reopen', async () => {
    const batches: number[] = [];
    const store = await openStore(freshDir(), { onSync: (_s, commits) => batches.push(commits) });
    const keys = Array.from({ length: 200 }, (_, i) => `k${i}`);
    await Promise.all(keys.map((key, i) => store.commit([put('many', key, i)])));
    expect(batches.reduce((a, b) => a + b, 0)).toBe(200);
    expect(batches.length).toBeLessThan(20);
    const { store: again } = await reopen(store);
    const records = await again.list('many');
    expect(records).toHaveLength(200);
    expect(new Map(records)).toEqual(new Map(keys.map((key, i) => [key, i])));
    expect(entryLines(logOf(again)).map(seqOf)).toEqual(keys.map((_, i) => i + 1));
  });
});

describe('FileStore compaction', () => {
  it('folds the log into a state file; reopen and later commits keep everything', async () => {
    const store = await openStore(freshDir(), { compactAfterBytes: 600 });
    const value = (i: number) => ({ i, pad: 'x'.repeat(40) });
    const expected = new Map<string, JsonValue>();
    for (let i = 0; i < 40; i++) {
      await store.commit([put('c', `k${i % 25}`, value(i))]);
      expected.set(`k${i % 25}`, value(i));
    }
    await store.commit([del('c', 'k0'), del('c', 'k1')]);
    expected.delete('k0');
    expected.delete('k1');
    expect(existsSync(stateOf(store))).toBe(true);
    const stateText = readFileSync(stateOf(store), 'utf8');
    expect(stateText).toMatch(/^moat-store-state v1 [0-9a-f]{8}\n/);
    const stateSeq = (JSON.parse(stateText.slice(stateText.indexOf('\n') + 1)) as { seq: number })
      .seq;
    // The log was started afresh: it holds only entries after those the state file holds.
    const seqs = entryLines(logOf(store)).map(seqOf);
    expect(stateSeq).toBeGreaterThan(0);
    expect(seqs).toEqual(Array.from({ length: 41 - stateSeq }, (_, i) => stateSeq + 1 + i));
    expect(new Map(await store.list('c'))).toEqual(expected);

    const second = await reopen(store, { compactAfterBytes: 600 });
    expect(new Map(await second.store.list('c'))).toEqual(expected);
    for (let i = 0; i < 30; i++) await second.store.commit([put('later', `l${i}`, value(i))]);
    const third = await reopen(second.store);
    expect(new Map(await third.store.list('c'))).toEqual(expected);
    expect(await third.store.list('later')).toHaveLength(30);
    expect([...second.warnings, ...third.warnings]).toEqual([]);
  });
});

describe('FileStore recovery', () => {
  it.each([
    {
      tail: 'a partial line without newline',
      tear: (file: string) => appendFileSync(file, 'deadbeef {"seq":4,"ch'),
      line: 5,
      survivors: ['a', 'b', 'c'],
    },
    {
      tail: 'a complete last line with a wrong checksum',
      tear: (file: string) =>
        editEntries(file, (lines) => [...lines.slice(0, -1), damage(lines.at(-1)!)]),
      line: 4,
      survivors: ['a', 'b'],
    },
  ])('cuts off a torn tail ($tail) with a warning, keeping earlier records', async (t) => {
    const store = await openStore(freshDir());
    // Multi-byte text before the tear: the cut must be made in bytes, not characters.
    await store.commit([put('c', 'a', 'ünïcödé ✓')]);
    await store.commit([put('c', 'b', 2)]);
    await store.commit([put('c', 'c', 3)]);
    await close(store);
    await t.tear(logOf(store));
    const warnings: string[] = [];
    const again = await openStore(store.location, { onWarning: (m) => warnings.push(m) });
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain(logOf(store));
    expect(warnings[0]).toContain(`line ${t.line} `);
    const survivors = (await again.list('c')).map(([key]) => key).sort();
    expect(survivors).toEqual(t.survivors);
    // The cut leaves a clean log: later commits and another reopen raise nothing.
    await again.commit([put('c', 'd', 4)]);
    const { store: third, warnings: later } = await reopen(again);
    expect(later).toEqual([]);
    expect((await third.list('c')).map(([key]) => key).sort()).toEqual([...survivors, 'd']);
  });

  it('refuses to open when a damaged line is followed by valid ones, naming file and line', async () => {
    const dir = await threeCommits();
    const log = path.join(dir, 'log');
    await editEntries(log, ([a, b, c]) => [a!, damage(b!), c!]);
    const failure = FileStore.open(dir);
    await expect(failure).rejects.toThrow(StoreOpenError);
    await expect(failure).rejects.toThrow(`${log} line 3 is damaged`);
    expect(existsSync(path.join(dir, 'lock'))).toBe(false);
  });

  it('refuses a sequence gap', async () => {
    const dir = await threeCommits();
    await editEntries(path.join(dir, 'log'), ([a, , c]) => [a!, c!]);
    await expect(FileStore.open(dir)).rejects.toThrow(
      new StoreOpenError(
        `${path.join(dir, 'log')} line 3 has sequence 3 after 1: entries are missing; restore the folder from a backup`,
      ),
    );
  });

  it.each(['log', 'state'])('refuses a foreign %s file, naming it', async (name) => {
    const dir = freshDir();
    await openStore(dir).then(close);
    await writeFile(path.join(dir, name), 'hello');
    const failure = FileStore.open(dir);
    await expect(failure).rejects.toThrow(StoreOpenError);
    await expect(failure).rejects.toThrow(`${path.join(dir, name)} is not a Moat store`);
    expect(readFileSync(path.join(dir, name), 'utf8')).toBe('hello');
  });

  it('refuses a state file whose checksum does not match', async () => {
    const store = await openStore(freshDir(), { compactAfterBytes: 100 });
    for (let i = 0; i < 10; i++) await store.commit([put('c', `k${i}`, 'value-0')]);
    await close(store);
    const text = readFileSync(stateOf(store), 'utf8');
    expect(text).toContain('value-0');
    await writeFile(stateOf(store), text.replace('value-0', 'value-1'));
    const failure = FileStore.open(store.location);
    await expect(failure).rejects.toThrow(StoreOpenError);
    await expect(failure).rejects.toThrow(`${stateOf(store)} is damaged (checksum mismatch)`);
  });
});

/** The pid of a process that has exited (and been reaped). */
function deadPid(): Promise<number> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['-e', '']);
    child.on('error', reject);
    child.on('exit', () => resolve(child.pid!));
  });
}

describe('FileStore lock and lifetime', () => {
  it('refuses a second open of the same folder in one process, naming the folder', async () => {
    const store = await openStore(freshDir());
    await expect(FileStore.open(store.location)).rejects.toThrow(
      `the data folder ${store.location} is in use by process ${process.pid}`,
    );
    await close(store);
    await openStore(store.location);
  });

  it('takes over a stale lock left by a process that is gone', async () => {
    const dir = await threeCommits();
    const pid = await deadPid();
    await writeFile(path.join(dir, 'lock'), `${pid}\n`);
    const store = await openStore(dir);
    expect(readFileSync(path.join(dir, 'lock'), 'utf8')).toBe(`${process.pid}\n`);
    expect(await store.list('things')).toHaveLength(3);
  });

  it('refuses a lock held by another live process', async () => {
    const dir = await threeCommits();
    const child = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 20000)']);
    try {
      await writeFile(path.join(dir, 'lock'), `${child.pid}\n`);
      await expect(FileStore.open(dir)).rejects.toThrow(`in use by process ${child.pid}`);
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('releases the lock on close', async () => {
    const store = await openStore(freshDir());
    await store.commit([put('c', 'k', 1)]);
    await close(store);
    expect(existsSync(path.join(store.location, 'lock'))).toBe(false);
  });

  it('creates its folder 0700 and its files 0600', async () => {
    const store = await openStore(freshDir(), { compactAfterBytes: 100 });
    for (let i = 0; i < 10; i++) await store.commit([put('c', `k${i}`, i)]);
    const mode = (file: string) => statSync(file).mode & 0o777;
    expect(mode(store.location).toString(8)).toBe('700');
    for (const name of ['log', 'state', 'lock']) {
      expect([name, mode(path.join(store.location, name)).toString(8)]).toEqual([name, '600']);
    }
  });
});

describe('FileStore names', () => {
  // The store knows nothing of what names mean: any string is a collection or key.
  it('keeps a collection named __proto__ through compaction and reopen', async () => {
    const store = await openStore(freshDir(), { compactAfterBytes: 10 });
    await store.commit([put('__proto__', 'k', 1), put('other', '__proto__', 2)]);
    // Folding runs after the commit is acknowledged; close() waits for it.
    const { store: again } = await reopen(store);
    expect(existsSync(stateOf(again))).toBe(true);
    expect(await again.list('__proto__')).toEqual([['k', 1]]);
    expect(await again.list('other')).toEqual([['__proto__', 2]]);
  });
});

type Step =
  | { readonly kind: 'commit'; readonly changes: StoreChange[] }
  | { readonly kind: 'reopen'; readonly compactAfterBytes: number }
  | { readonly kind: 'tear'; readonly garbage: string };

// '__proto__' as a collection name has its own test below.
const COLLECTIONS = ['sandboxes', 'templates', 'constructor'];
const change = changeOf(COLLECTIONS);
const step: fc.Arbitrary<Step> = fc.oneof(
  { weight: 6, arbitrary: fc.record({ kind: fc.constant('commit'), changes: fc.array(change) }) },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant('reopen'),
      compactAfterBytes: fc.constantFrom(64, 512, 1 << 20),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant('tear'),
      garbage: fc.string({ minLength: 1, maxLength: 30 }).filter((s) => !s.includes('\n')),
    }),
  },
) as fc.Arbitrary<Step>;

describe('FileStore against a Map model', () => {
  // Commits and plain reopens alone are in the contract; this adds what files go through.
  it('agrees after random commits, reopens, compactions and torn tails', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(step, { maxLength: 25 }), async (steps) => {
        const model: StoreModel = new Map();
        let store = await openStore(freshDir(), { compactAfterBytes: 256 });
        for (const s of steps) {
          if (s.kind === 'commit') {
            await store.commit(s.changes);
            applyToModel(model, s.changes);
          } else {
            await close(store);
            if (s.kind === 'tear') appendFileSync(logOf(store), s.garbage);
            const warnings: string[] = [];
            const options = s.kind === 'reopen' ? { compactAfterBytes: s.compactAfterBytes } : {};
            store = await openStore(store.location, {
              ...options,
              onWarning: (m) => warnings.push(m),
            });
            expect(warnings).toHaveLength(s.kind === 'tear' ? 1 : 0);
          }
          await expectMatches(store, model, COLLECTIONS);
        }
        await close(store);
        store = await openStore(store.location);
        await expectMatches(store, model, COLLECTIONS);
        await close(store);
      }),
      { numRuns: 60 },
    );
  });
});
