/**
 * The Redis store against the Redis on 127.0.0.1:6379 (the global set-up starts one on CI): the
 * Store contract, then what only Redis has: the key layout, transactions as another client sees
 * them, a masked password, and failing fast, then recovering, while the connection is cut. Cuts
 * go through a relay the test controls, so the machine's Redis keeps running.
 *
 * Each test writes under its own key prefix and deletes it afterwards: test files run in
 * parallel against the one Redis.
 */
import { randomUUID } from 'node:crypto';
import { type AddressInfo, createServer } from 'node:net';
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  RedisStore,
  type RedisStoreOptions,
  StoreUnavailableError,
} from '../../src/store/index.js';
import { REDIS_PORT, RedisRelay, redisProblem } from '../support/redis.js';
import { del, describeStoreContract, put } from './store-contract.js';

const REDIS_URL = `redis://127.0.0.1:${REDIS_PORT}`;

const problem = await redisProblem();
if (problem !== undefined) {
  console.warn(`redis-store tests skipped: no Redis on 127.0.0.1:${REDIS_PORT} (${problem})`);
}

/** A second connection: it looks at what the store wrote and removes it afterwards. */
let admin: Redis;
/** Key prefixes in use, deleted after each test. */
const prefixes: string[] = [];
const opened: RedisStore[] = [];

function freshPrefix(): string {
  const prefix = `moat-test:${randomUUID()}:`;
  prefixes.push(prefix);
  return prefix;
}

async function openStore(options: RedisStoreOptions = {}, url = REDIS_URL): Promise<RedisStore> {
  const store = await RedisStore.open(url, { ...options, prefix: options.prefix ?? freshPrefix() });
  opened.push(store);
  return store;
}

async function removeKeys(prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await admin.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    if (keys.length > 0) await admin.del(...keys);
    cursor = next;
  } while (cursor !== '0');
}

/** The keys under `prefix`, sorted. */
async function keysUnder(prefix: string): Promise<string[]> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await admin.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    keys.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  return keys.sort();
}

/** How long `promise` takes to settle (milliseconds). */
async function timeToSettle(promise: Promise<unknown>): Promise<number> {
  const started = performance.now();
  await promise.catch(() => {});
  return performance.now() - started;
}

describe.skipIf(problem !== undefined)('RedisStore', () => {
  beforeAll(() => {
    admin = new Redis(REDIS_URL);
  });
  afterEach(async () => {
    await Promise.all(opened.splice(0).map((store) => store.close()));
    await RedisRelay.closeAll();
    await Promise.all(prefixes.splice(0).map(removeKeys));
  });
  afterAll(async () => {
    await admin.quit();
  });

  describeStoreContract('RedisStore', async () => {
    const prefix = freshPrefix();
    let store = await RedisStore.open(REDIS_URL, { prefix });
    return {
      store,
      async reopen() {
        await store.close();
        store = await RedisStore.open(REDIS_URL, { prefix });
        return store;
      },
      async cleanup() {
        await store.close();
        await removeKeys(prefix);
      },
    };
  });

  describe('layout', () => {
    it('keeps each collection as one hash of JSON text under the prefix', async () => {
      const prefix = freshPrefix();
      const store = await openStore({ prefix });
      await store.commit([
        put('sandboxes', 's1', { state: 'running' }),
        put('sandboxes', 's2', 'two'),
        put('templates', 't1', [1, null]),
      ]);
      await store.commit([del('sandboxes', 's2')]);
      expect(await keysUnder(prefix)).toEqual([`${prefix}sandboxes`, `${prefix}templates`]);
      expect(await admin.hgetall(`${prefix}sandboxes`)).toEqual({ s1: '{"state":"running"}' });
      expect(await admin.hgetall(`${prefix}templates`)).toEqual({ t1: '[1,null]' });
    });

    it('names the hash and field of a record that is not JSON', async () => {
      const prefix = freshPrefix();
      const store = await openStore({ prefix });
      await admin.hset(`${prefix}sandboxes`, 's1', 'not json');
      const message = `field "s1" of ${prefix}sandboxes is not JSON`;
      await expect(store.get('sandboxes', 's1')).rejects.toThrow(message);
      await expect(store.list('sandboxes')).rejects.toThrow(message);
    });

    it('refuses a key that is not a hash with StoreUnavailableError naming it; Redis keeps the rest of that commit', async () => {
      const prefix = freshPrefix();
      const store = await openStore({ prefix });
      await admin.set(`${prefix}foreign`, 'a string');
      const failure = store.commit([put('fine', 'k', 1), put('foreign', 'k', 1)]);
      await expect(failure).rejects.toThrow(StoreUnavailableError);
      await expect(failure).rejects.toThrow(
        `applied only part of a commit: ${prefix}foreign refused it (WRONGTYPE`,
      );
      // MULTI/EXEC does not roll back a command that fails inside it.
      expect(await store.get('fine', 'k')).toBe(1);
      await expect(store.list('foreign')).rejects.toThrow(
        new RegExp(`^could not list foreign from Redis at ${REDIS_URL}: WRONGTYPE`),
      );
    });
  });

  it('commits with MULTI/EXEC: another client never sees half a commit', async () => {
    const prefix = freshPrefix();
    const store = await openStore({ prefix });
    // Values larger than one Redis read (16 KiB), so two writes outside a transaction would
    // reach Redis in separate reads and another client could run in between.
    const value = (i: number) => `${i}:${'x'.repeat(40_000)}`;
    await store.commit([put('left', 'k', value(0)), put('right', 'k', value(0))]);
    let writing = true;
    const writes = (async () => {
      for (let i = 1; i <= 150; i++) {
        await Promise.all([
          store.commit([put('left', 'k', value(2 * i)), put('right', 'k', value(2 * i))]),
          store.commit([put('left', 'k', value(2 * i + 1)), put('right', 'k', value(2 * i + 1))]),
        ]);
      }
      writing = false;
    })();
    let reads = 0;
    while (writing) {
      const [[, left], [, right]] = (await admin
        .multi()
        .hget(`${prefix}left`, 'k')
        .hget(`${prefix}right`, 'k')
        .exec()) as [[null, string], [null, string]];
      expect(left.split(':')[0]).toBe(right.split(':')[0]);
      reads += 1;
    }
    await writes;
    expect(reads).toBeGreaterThan(10);
  });

  it('shows the location with the password masked, in errors too', async () => {
    // This Redis has no password: its default user accepts any.
    const store = await openStore({}, 'redis://:pw-1@127.0.0.1:6379/0?password=in-query');
    expect(store.location).toBe('redis://:***@127.0.0.1:6379/0?password=***');
    await store.commit([put('c', 'k', 1)]);

    const failure = RedisStore.open('redis://nobody:pw-2@127.0.0.1:6379', {
      connectTimeoutMs: 300,
    });
    await expect(failure).rejects.toThrow(StoreUnavailableError);
    await expect(failure).rejects.toThrow(
      `could not connect to Redis at redis://nobody:***@127.0.0.1:6379 within 300 ms (WRONGPASS`,
    );
    await expect(failure).rejects.not.toThrow('pw-2');
  });

  it('rejects a URL that is not redis:// without echoing it', async () => {
    const failure = RedisStore.open('http://:secret@127.0.0.1:6379');
    await expect(failure).rejects.toThrow('the Redis URL must start with redis:// or rediss://');
    await expect(failure).rejects.not.toThrow('secret');
    await expect(RedisStore.open(':secret@127.0.0.1')).rejects.toThrow(
      /^the Redis URL is not a valid URL; expected redis:\/\//,
    );
  });

  it('fails fast when nothing listens, then stops trying', async () => {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    await new Promise((resolve) => server.close(resolve));
    const failure = RedisStore.open(`redis://127.0.0.1:${port}`, { connectTimeoutMs: 300 });
    expect(await timeToSettle(failure)).toBeLessThan(1000);
    await expect(failure).rejects.toThrow(
      new StoreUnavailableError(
        `could not connect to Redis at redis://127.0.0.1:${port} within 300 ms (connect ECONNREFUSED 127.0.0.1:${port}); check that Redis runs there and the URL is right`,
      ),
    );

    // Through a relay that counts attempts: none after open gave up.
    const relay = await RedisRelay.start();
    relay.cut();
    await expect(RedisStore.open(relay.url, { connectTimeoutMs: 300 })).rejects.toThrow(
      StoreUnavailableError,
    );
    const attempts = relay.accepted;
    expect(attempts).toBeGreaterThan(0);
    await new Promise((resolve) => setTimeout(resolve, 1000));
    expect(relay.accepted).toBe(attempts);
  });

  it('fails fast while the connection is cut and recovers by itself when it returns', async () => {
    const relay = await RedisRelay.start();
    const errors: Error[] = [];
    const store = await openStore({ onError: (error) => errors.push(error) }, relay.url);
    await store.commit([put('c', 'before', 1)]);

    relay.cut();
    const commit = store.commit([put('c', 'during', 1)]);
    expect(await timeToSettle(commit)).toBeLessThan(500);
    await expect(commit).rejects.toThrow(StoreUnavailableError);
    await expect(commit).rejects.toThrow(`could not commit to Redis at ${relay.url}`);
    await expect(store.get('c', 'before')).rejects.toThrow(
      `could not read c/before from Redis at ${relay.url}: it is unreachable (`,
    );
    await expect(store.list('c')).rejects.toThrow(StoreUnavailableError);
    // Reconnection attempts keep failing meanwhile; the log hears of it once.
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(errors.length).toBeGreaterThan(0);
    expect(errors.every((error) => error instanceof StoreUnavailableError)).toBe(true);
    expect(new Set(errors.map((error) => error.message)).size).toBe(errors.length);
    expect(errors[0]!.message).toContain(`Redis at ${relay.url}: `);

    relay.restore();
    await vi.waitFor(() => store.commit([put('c', 'after', 1)]), { timeout: 5000, interval: 50 });
    expect(new Map(await store.list('c'))).toEqual(
      new Map([
        ['before', 1],
        ['after', 1],
      ]),
    );
  });

  it('drops a connection that stops answering instead of waiting on it, then recovers', async () => {
    const relay = await RedisRelay.start();
    const store = await openStore({ connectTimeoutMs: 400 }, relay.url);
    await store.commit([put('c', 'before', 1)]);

    relay.stall();
    const commit = store.commit([put('c', 'during', 1)]);
    expect(await timeToSettle(commit)).toBeLessThan(1500);
    await expect(commit).rejects.toThrow(StoreUnavailableError);
    await expect(commit).rejects.toThrow('Socket timeout');

    relay.restore();
    await vi.waitFor(() => store.commit([put('c', 'after', 1)]), { timeout: 5000, interval: 50 });
    expect(await store.get('c', 'before')).toBe(1);
    expect(await store.get('c', 'during')).toBeUndefined();
  });

  it('closes at once while the connection is cut, and closing twice is harmless', async () => {
    const relay = await RedisRelay.start();
    const store = await openStore({}, relay.url);
    relay.cut();
    expect(await timeToSettle(store.close())).toBeLessThan(500);
    await store.close();
    await expect(store.get('c', 'k')).rejects.toThrow(
      new StoreUnavailableError(`the Redis store at ${relay.url} is closed`),
    );
  });
});
