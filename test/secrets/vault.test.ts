/**
 * The secret vault over both stores (the file store in a scratch folder, the Redis on
 * 127.0.0.1:6379 under a key prefix of its own), and what an attacker who holds a copy of the
 * store, or write access to it, gets: no value, and no value opened under the wrong record.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { loadSecretsKey, SecretsError, SecretVault } from '../../src/secrets/index.js';
import { FileStore, RedisStore, type Store } from '../../src/store/index.js';
import { REDIS_PORT, redisProblem } from '../support/redis.js';

const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-vault-'));
const opened: Store[] = [];
const prefixes: string[] = [];
const problem = await redisProblem();

afterAll(async () => {
  await Promise.all(opened.map((store) => store.close()));
  if (prefixes.length > 0) {
    const admin = new Redis(REDIS_PORT, '127.0.0.1');
    for (const prefix of prefixes) {
      const keys = await admin.keys(`${prefix}*`);
      if (keys.length > 0) await admin.del(...keys);
    }
    admin.disconnect();
  }
  rmSync(scratch, { recursive: true, force: true });
});

const secretValue = () => `sk-live-${randomBytes(16).toString('hex')}`;

async function keyIn(folder: string) {
  return loadSecretsKey(undefined, folder);
}

async function fileStore(): Promise<Store> {
  const store = await FileStore.open(mkdtempSync(path.join(scratch, 'store-')));
  opened.push(store);
  return store;
}

async function redisStore(prefix = `moat-test:${randomUUID()}:`): Promise<Store> {
  prefixes.push(prefix);
  const store = await RedisStore.open(`redis://127.0.0.1:${REDIS_PORT}`, { prefix });
  opened.push(store);
  return store;
}

const stores: Array<[string, () => Promise<Store>, boolean]> = [
  ['file', fileStore, false],
  ['redis', () => redisStore(), problem !== undefined],
];

describe.each(stores)('the vault over the %s store', (_kind, open, skip) => {
  it.skipIf(skip)('keeps current values by name, versions and metadata', async () => {
    const vault = new SecretVault({ store: await open(), key: await keyIn(scratch) });
    const [first, second] = [secretValue(), secretValue()];
    const info = await vault.create('Token', first, { team: 'a' });
    expect(info).toMatchObject({ name: 'token', currentVersion: 1, metadata: { team: 'a' } });
    expect(await vault.value('TOKEN')).toBe(first);
    expect(await vault.exists('token')).toBe(true);
    const next = await vault.update(info.secretID, second);
    expect(next).toMatchObject({ currentVersion: 2, metadata: { team: 'a' } });
    expect(await vault.value('token')).toBe(second);
    expect(await vault.info('token')).toEqual(next);
    // Names JavaScript objects treat specially are names like any other.
    await vault.create('__proto__', first);
    await vault.create('constructor', first);
    expect(await vault.value('__proto__')).toBe(first);
    expect((await vault.list()).map((s) => s.name).sort()).toEqual([
      '__proto__',
      'constructor',
      'token',
    ]);
    expect(await vault.values()).toEqual(
      new Map([
        ['token', second],
        ['__proto__', first],
        ['constructor', first],
      ]),
    );
    await vault.delete('token');
    expect(await vault.value('token')).toBeUndefined();
    await expect(vault.info(info.secretID)).rejects.toMatchObject({ status: 404 });
  });

  it.skipIf(skip)('lets one of many concurrent creates of a name succeed', async () => {
    const vault = new SecretVault({ store: await open(), key: await keyIn(scratch) });
    const results = await Promise.allSettled(
      Array.from({ length: 8 }, () => vault.create('race', secretValue())),
    );
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    for (const r of results.filter((r) => r.status === 'rejected'))
      expect((r as PromiseRejectedResult).reason).toMatchObject({ status: 409 });
  });

  it.skipIf(skip)(
    'does not open a value under another key, or moved to another record',
    async () => {
      const store = await open();
      const vault = new SecretVault({ store, key: await keyIn(scratch) });
      const [a, b] = [secretValue(), secretValue()];
      await vault.create('a', a);
      await vault.create('b', b);
      const otherFolder = mkdtempSync(path.join(scratch, 'other-key-'));
      const stranger = new SecretVault({ store, key: await keyIn(otherFolder) });
      const refusal = await stranger.value('a').catch((error: unknown) => error);
      expect(refusal).toBeInstanceOf(SecretsError);
      expect((refusal as Error).message).toMatch(
        /sealed with key [0-9a-f]{16}.*same --secrets-key-file/,
      );
      expect((refusal as Error).message).not.toContain(a);
      // Someone with write access to the store copies b's sealed value into a's record.
      const recordA = (await store.get('secrets', 'a')) as Record<string, unknown>;
      const recordB = (await store.get('secrets', 'b')) as Record<string, unknown>;
      await store.commit([
        { collection: 'secrets', key: 'a', value: { ...recordA, sealed: recordB.sealed } as never },
      ]);
      await expect(vault.value('a')).rejects.toThrow(/does not open with this Moat's secrets key/);
    },
  );
});

describe("the leak guard's values", () => {
  it('are read from the store once, and afresh after each change this vault makes', async () => {
    const store = await fileStore();
    let lists = 0;
    const counted: Store = Object.assign(Object.create(store) as Store, {
      list: (collection: string) => {
        lists++;
        return store.list(collection);
      },
    });
    const vault = new SecretVault({ store: counted, key: await keyIn(scratch) });
    const [first, second] = [secretValue(), secretValue()];
    expect(await vault.values()).toEqual(new Map());
    await vault.create('token', first);
    const before = lists;
    expect(await vault.values()).toEqual(new Map([['token', first]]));
    for (let i = 0; i < 50; i++) await vault.values();
    expect(lists - before).toBe(1);
    await vault.update('token', second);
    expect(await vault.values()).toEqual(new Map([['token', second]]));
    await vault.delete('token');
    expect(await vault.values()).toEqual(new Map());
  });

  it('taken while a change commits are not served after it', async () => {
    const vault = new SecretVault({ store: await fileStore(), key: await keyIn(scratch) });
    const value = secretValue();
    await Promise.all([vault.values(), vault.create('late', value)]);
    expect(await vault.values()).toEqual(new Map([['late', value]]));
  });
});

describe.skipIf(problem !== undefined)('two nodes sharing one Redis', () => {
  it("sees another node's update on its next read, and a Redis dump holds no value", async () => {
    const prefix = `moat-test:${randomUUID()}:`;
    const key = await keyIn(scratch);
    const nodeA = new SecretVault({ store: await redisStore(prefix), key });
    const nodeB = new SecretVault({ store: await redisStore(prefix), key });
    const [first, second] = [secretValue(), secretValue()];
    await nodeA.create('shared', first);
    expect(await nodeB.value('shared')).toBe(first);
    await nodeB.update('shared', second);
    expect(await nodeA.value('shared')).toBe(second);
    await nodeB.delete('shared');
    expect(await nodeA.exists('shared')).toBe(false);
    // A's decrypted copies are kept until told of B's change (the cluster channel's job).
    expect(await nodeA.values()).toEqual(new Map());
    await nodeB.create('later', second);
    expect(await nodeA.values()).toEqual(new Map());
    nodeA.invalidate();
    expect(await nodeA.values()).toEqual(new Map([['later', second]]));
    await nodeB.delete('later');
    await nodeA.create('kept', first);

    const admin = new Redis(REDIS_PORT, '127.0.0.1');
    try {
      const dump: string[] = [];
      for (const name of await admin.keys(`${prefix}*`)) {
        const type = await admin.type(name);
        if (type === 'hash') dump.push(JSON.stringify(await admin.hgetall(name)));
        else if (type === 'string') dump.push((await admin.get(name)) ?? '');
      }
      expect(dump.join('\n')).toContain('kept');
      expect(dump.join('\n')).not.toContain(first);
      expect(dump.join('\n')).not.toContain(second);
    } finally {
      admin.disconnect();
    }
  });
});

describe('the secrets key file', () => {
  it('is generated once with mode 0600 and read back the same', async () => {
    const folder = mkdtempSync(path.join(scratch, 'key-'));
    const made = await keyIn(folder);
    expect(made.generated).toBe(true);
    expect(statSync(made.source).mode & 0o777).toBe(0o600);
    const again = await keyIn(folder);
    expect(again).toMatchObject({ generated: false, id: made.id });
    expect(again.key.equals(made.key)).toBe(true);
    expect(readFileSync(made.source, 'utf8')).toMatch(/^[0-9a-f]{64}\n$/);
  });

  it('refuses a configured file that is missing or is not 64 hex digits, without quoting it', async () => {
    const folder = mkdtempSync(path.join(scratch, 'key-'));
    await expect(loadSecretsKey(path.join(folder, 'none'), folder)).rejects.toThrow(
      /cannot read the secrets key file/,
    );
    const bad = path.join(folder, 'bad');
    writeFileSync(bad, 'not-a-key-but-a-secret-xyz');
    const refusal = await loadSecretsKey(bad, folder).catch((error: Error) => error.message);
    expect(refusal).toMatch(/must hold 32 bytes as 64 hex digits/);
    expect(refusal).not.toContain('not-a-key-but-a-secret-xyz');
  });
});
