/**
 * What every Store must do, whatever holds the state: each store's test file runs this suite
 * against its own store, next to the tests of what only that store has.
 */
import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import {
  type JsonValue,
  type Store,
  type StoreChange,
  StoreUnavailableError,
} from '../../src/store/index.js';

/** A fresh, empty store and the means to reopen and remove it. */
export interface StoreSubject {
  readonly store: Store;
  /** Closes the store last opened and opens the same state again. */
  reopen(): Promise<Store>;
  /** Closes what is open and removes the state. */
  cleanup(): Promise<void>;
}

export const put = (collection: string, key: string, value: JsonValue): StoreChange => ({
  collection,
  key,
  value,
});
export const del = (collection: string, key: string) => put(collection, key, null);

/** Every record of the named collections, sorted by key, for comparison. */
export async function contents(store: Store, collections: readonly string[]) {
  const out: Record<string, Array<[string, JsonValue]>> = {};
  for (const name of collections) {
    out[name] = (await store.list(name)).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  }
  return out;
}

/** What a store should hold, for model tests: collection -> key -> value. */
export type StoreModel = Map<string, Map<string, JsonValue>>;
type Step =
  { readonly kind: 'commit'; readonly changes: StoreChange[] } | { readonly kind: 'reopen' };

/** Keys that trip naive object-backed maps, and a few ordinary ones. */
export const MODEL_KEYS = ['a', 'b', 'c d', 'é\n', '__proto__', 'constructor'];
const COLLECTIONS = ['sandboxes', 'templates', 'constructor', '__proto__'];

/** A random change of one of `collections` (a put, or a delete when the value is null). */
export const changeOf = (collections: readonly string[]): fc.Arbitrary<StoreChange> =>
  fc.record({
    collection: fc.constantFrom(...collections),
    key: fc.constantFrom(...MODEL_KEYS),
    value: fc.oneof(fc.constant(null), fc.jsonValue({ maxDepth: 2 })) as fc.Arbitrary<JsonValue>,
  });
const change = changeOf(COLLECTIONS);
const step: fc.Arbitrary<Step> = fc.oneof(
  { weight: 6, arbitrary: fc.record({ kind: fc.constant('commit'), changes: fc.array(change) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('reopen') }) },
) as fc.Arbitrary<Step>;

export function applyToModel(model: StoreModel, changes: readonly StoreChange[]): void {
  for (const { collection, key, value } of changes) {
    // The store holds what JSON carries (-0 becomes 0, and so on).
    const stored = JSON.parse(JSON.stringify(value)) as JsonValue;
    if (!model.has(collection)) model.set(collection, new Map());
    if (stored === null) model.get(collection)!.delete(key);
    else model.get(collection)!.set(key, stored);
  }
}

/** The store holds exactly what the model says, read with both list and get. */
export async function expectMatches(
  store: Store,
  model: StoreModel,
  collections: readonly string[] = COLLECTIONS,
): Promise<void> {
  for (const name of collections) {
    expect(new Map(await store.list(name))).toEqual(model.get(name) ?? new Map());
    for (const key of MODEL_KEYS)
      expect(await store.get(name, key)).toEqual(model.get(name)?.get(key));
  }
}

export function describeStoreContract(name: string, open: () => Promise<StoreSubject>): void {
  describe(`${name} (the Store contract)`, () => {
    const subjects: StoreSubject[] = [];
    afterEach(async () => {
      await Promise.all(subjects.splice(0).map((subject) => subject.cleanup()));
    });
    async function fresh(): Promise<StoreSubject> {
      const subject = await open();
      subjects.push(subject);
      return subject;
    }

    it('returns after reopen exactly what was committed, puts and deletes across collections', async () => {
      const subject = await fresh();
      const { store } = subject;
      await store.commit([put('sandboxes', 's1', { state: 'running', n: 1 })]);
      await store.commit([put('templates', 't1', ['x', 'é', 2]), put('sandboxes', 's2', 'two')]);
      await store.commit([del('sandboxes', 's1'), put('templates', 't2', null), put('a', 'b', 0)]);
      await store.commit([put('sandboxes', 's2', { replaced: true })]);
      await store.commit([]);
      const expected = {
        sandboxes: [['s2', { replaced: true }]],
        templates: [['t1', ['x', 'é', 2]]],
        a: [['b', 0]],
        missing: [],
      };
      expect(await contents(store, Object.keys(expected))).toEqual(expected);
      const again = await subject.reopen();
      expect(await contents(again, Object.keys(expected))).toEqual(expected);
      expect(await again.get('sandboxes', 's1')).toBeUndefined();
      expect(await again.get('missing', 's1')).toBeUndefined();
    });

    it('applies the changes of one commit in order: the last change to a key wins', async () => {
      const { store } = await fresh();
      await store.commit([put('c', 'gone', 1), put('c', 'back', 1)]);
      await store.commit([
        put('c', 'twice', 1),
        put('c', 'twice', 2),
        del('c', 'gone'),
        del('c', 'back'),
        put('c', 'back', 'again'),
        put('c', 'new', 1),
        del('c', 'new'),
        del('c', 'never'),
      ]);
      expect(await contents(store, ['c'])).toEqual({
        c: [
          ['back', 'again'],
          ['twice', 2],
        ],
      });
    });

    it('keeps what JSON carries, never the caller’s objects', async () => {
      const { store } = await fresh();
      const record = { tags: ['a'], nested: { n: 1 }, zero: -0, text: 'line\n\u2028 ✓ "q"' };
      await store.commit([put('c', 'k', record)]);
      record.tags.push('b');
      record.nested.n = 2;
      const expected = { tags: ['a'], nested: { n: 1 }, zero: 0, text: 'line\n\u2028 ✓ "q"' };
      const read = await store.get('c', 'k');
      expect(read).toEqual(expected);
      expect(Object.is((read as { zero: number }).zero, 0)).toBe(true);
      expect(await store.list('c')).toEqual([['k', expected]]);
    });

    it('treats any string as a collection or key, keeping them apart', async () => {
      const subject = await fresh();
      const names = ['__proto__', 'constructor', '', 'a:b', 'a', 'é\n', ' '];
      await subject.store.commit(
        names.flatMap((collection) => names.map((key) => put(collection, key, [collection, key]))),
      );
      const check = async (store: Store) => {
        for (const collection of names) {
          const expected = new Map(names.map((key) => [key, [collection, key]]));
          expect(new Map(await store.list(collection))).toEqual(expected);
          expect(await store.get(collection, 'b:c')).toBeUndefined();
        }
      };
      await check(subject.store);
      await check(await subject.reopen());
    });

    it('lands every one of 200 concurrent commits', async () => {
      const subject = await fresh();
      const keys = Array.from({ length: 200 }, (_, i) => `k${i}`);
      await Promise.all(keys.map((key, i) => subject.store.commit([put('many', key, i)])));
      const expected = new Map(keys.map((key, i) => [key, i]));
      expect(new Map(await subject.store.list('many'))).toEqual(expected);
      expect(new Map(await (await subject.reopen()).list('many'))).toEqual(expected);
    });

    it('rejects commits after close with StoreUnavailableError', async () => {
      const { store } = await fresh();
      await store.commit([put('c', 'k', 1)]);
      await store.close();
      await expect(store.commit([put('c', 'k', 2)])).rejects.toThrow(StoreUnavailableError);
      await expect(store.commit([])).rejects.toThrow(StoreUnavailableError);
      await store.close();
    });

    it('agrees with a Map model after random commits and reopens', async () => {
      await fc.assert(
        fc.asyncProperty(fc.array(step, { maxLength: 25 }), async (steps) => {
          const subject = await open();
          try {
            const model: StoreModel = new Map();
            let store = subject.store;
            for (const s of steps) {
              if (s.kind === 'commit') {
                await store.commit(s.changes);
                applyToModel(model, s.changes);
              } else {
                store = await subject.reopen();
              }
              await expectMatches(store, model);
            }
          } finally {
            await subject.cleanup();
          }
        }),
        { numRuns: 40 },
      );
    });
  });
}
