/**
 * The secrets API and `network.rules` through the real `e2b` SDK, against a real `moat serve`
 * child (file store): the SDK's Secret class end to end, rules on create and update, forks,
 * and a restart on the same data folder. Then what an attacker with the API, the logs or a copy
 * of the data folder looks for: a secret's value, which must be in none of them.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  ALL_TRAFFIC,
  Sandbox,
  type SandboxOpts,
  Secret,
  SecretError,
  SecretNotFoundError,
} from 'e2b';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { removeMoatFolder } from '../../bench/lib/scratch.js';
import { loadSecretsKey, SecretVault } from '../../src/secrets/index.js';
import { FileStore } from '../../src/store/index.js';
import { ApiClient } from '../support/api-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { REDIS_PORT, redisProblem } from '../support/redis.js';
import { loopbackServeArgs, ServeChild, type Started } from '../support/serve-child.js';

const API_KEY = 'secrets-test-key-0123456789abcdef';
/** What an attacker looks for: secret values that must never come back out. */
const VALUE = `sk-live-${randomBytes(18).toString('hex')}`;
const NEW_VALUE = `sk-live-${randomBytes(18).toString('hex')}`;

const zone = new FakeDns(new Map());
const dataDir = mkdtempSync(path.join(os.tmpdir(), 'moat-secrets-'));
let child: ServeChild;
let at: Started;
let api: ApiClient;
/** Every reply body the raw client saw, searched for values at the end. */
const seen: string[] = [];

const connection = () => ({
  apiUrl: `http://${at.api}`,
  sandboxUrl: `http://${at.sandbox}`,
  apiKey: API_KEY,
  domain: 'moat.test',
});

async function start(): Promise<void> {
  child = new ServeChild(
    loopbackServeArgs(dataDir, zone.port, ['--api-keys', API_KEY, '--log-level', 'debug']),
  );
  at = await child.started();
  api = new ApiClient(`http://${at.api}`, API_KEY);
}

/** A raw call whose reply is kept for the final search. */
async function call(method: string, url: string, body?: unknown) {
  const reply = await api.call(method, url, body === undefined ? {} : { body });
  seen.push(
    `${method} ${url} -> ${reply.status} ${JSON.stringify([...reply.headers])} ${reply.text}`,
  );
  return reply;
}

const sandboxes: Sandbox[] = [];
async function sandbox(options: SandboxOpts) {
  const created = await Sandbox.create({ ...connection(), timeoutMs: 120_000, ...options });
  sandboxes.push(created);
  return created;
}

beforeAll(async () => {
  await zone.start();
  await start();
}, 30_000);

afterAll(async () => {
  await Promise.all(sandboxes.map((s) => s.kill().catch(() => undefined)));
  await ServeChild.killAll();
  await zone.stop();
  removeMoatFolder(dataDir);
});

describe('the SDK Secret class', () => {
  it('creates, lists page by page, gets by ID and by name, updates and deletes', async () => {
    const names = ['alpha', 'Beta', 'gamma-1', 'delta_2', 'epsilon'];
    const created = [];
    for (const name of names)
      created.push(
        await Secret.create(name, VALUE, { ...connection(), metadata: { owner: name } }),
      );
    expect(created.map((s) => s.name)).toEqual(['alpha', 'beta', 'gamma-1', 'delta_2', 'epsilon']);
    for (const info of created) {
      expect(info.secretId).toMatch(/^sec_[0-9a-f]{24}$/);
      expect(info.version).toBe(1);
      expect(info.createdAt.getTime()).toBe(info.updatedAt.getTime());
    }
    expect(created[1]!.metadata).toEqual({ owner: 'Beta' });

    const paginator = Secret.list({ ...connection(), limit: 2 });
    const pages: string[][] = [];
    for (let i = 0; i < 10 && paginator.hasNext; i++)
      pages.push((await paginator.nextItems()).map((s) => s.name));
    expect(pages.map((p) => p.length)).toEqual([2, 2, 1]);
    expect(pages.flat()).toEqual(created.map((s) => s.name));

    const beta = created[1]!;
    expect(await Secret.getInfo(beta.secretId, connection())).toEqual(beta);
    expect(await Secret.getInfo('BETA', connection())).toEqual(beta);
    expect(await Secret.exists('beta', connection())).toBe(true);

    const updated = await Secret.update('beta', NEW_VALUE, {
      ...connection(),
      metadata: { v: '2' },
    });
    expect(updated).toMatchObject({
      secretId: beta.secretId,
      name: 'beta',
      version: 2,
      metadata: { v: '2' },
    });
    expect(updated.createdAt).toEqual(beta.createdAt);
    // Metadata left out of an update stays as it was.
    expect((await Secret.update(beta.secretId, NEW_VALUE, connection())).metadata).toEqual({
      v: '2',
    });

    expect(await Secret.destroy(beta.secretId, connection())).toBe(true);
    expect(await Secret.destroy('beta', connection())).toBe(false);
    expect(await Secret.exists('beta', connection())).toBe(false);
    await expect(Secret.getInfo('beta', connection())).rejects.toBeInstanceOf(SecretNotFoundError);
    await expect(Secret.update('beta', VALUE, connection())).rejects.toBeInstanceOf(
      SecretNotFoundError,
    );
    await expect(
      Secret.getInfo('sec_000000000000000000000000', connection()),
    ).rejects.toBeInstanceOf(SecretNotFoundError);
  });

  it('refuses bad names, reserved names, duplicates and values a header cannot carry', async () => {
    await expect(Secret.create('alpha', VALUE, connection())).rejects.toThrow(
      /409: a secret named "alpha" already exists/,
    );
    await expect(Secret.create('ALPHA', VALUE, connection())).rejects.toBeInstanceOf(SecretError);
    for (const name of ['a b', 'a.b', 'ü', 'a'.repeat(129)]) {
      const reply = await call('POST', '/secrets', { name, value: VALUE });
      expect(reply.status, name).toBe(400);
    }
    for (const name of ['sec_mine', 'SEC_mine']) {
      const reply = await call('POST', '/secrets', { name, value: VALUE });
      expect(reply.status).toBe(400);
      expect(reply.text).toMatch(/reserved for secret IDs/);
    }
    for (const value of [`${VALUE}\r\nX-Injected: 1`, `${VALUE}\u0000`, '']) {
      const reply = await call('POST', '/secrets', { name: 'bad-value', value });
      expect(reply.status).toBe(400);
    }
    expect((await call('POST', '/secrets/alpha', { value: `${VALUE}\n` })).status).toBe(400);
    expect((await call('POST', '/secrets', { name: 'x', value: VALUE, extra: 1 })).status).toBe(
      400,
    );
    const unkeyed = await api.call('GET', '/secrets', { key: null });
    expect(unkeyed.status).toBe(401);
    const wrongKey = await api.call('POST', '/secrets', {
      key: 'wrong-key-0123456789abcdef',
      body: { name: 'stolen', value: VALUE },
    });
    expect(wrongKey.status).toBe(401);
    expect(await Secret.exists('stolen', connection())).toBe(false);
  });

  it('answers a malformed cursor with 400, and a too-large limit with at most 100', async () => {
    expect((await call('GET', '/secrets?nextToken=garbage')).status).toBe(400);
    const all = await call('GET', '/secrets?limit=1000');
    expect(all.status).toBe(200);
    expect((all.body as unknown[]).length).toBe(4);
  });
});

describe('network.rules through the SDK', () => {
  let withRules: Sandbox;
  const rules = {
    'API.Rules.test': [
      {
        transform: {
          headers: { Authorization: 'Bearer ${e2b.secrets.Alpha}', 'X-Literal': 'plain-text' },
        },
      },
    ],
    '*.rules.test': [{ transform: { headers: { 'X-Key': '${e2b.secrets.gamma-1}' } } }],
  };
  const stored = {
    'api.rules.test': rules['API.Rules.test'],
    '*.rules.test': rules['*.rules.test'],
  };

  it('creates a sandbox with rules; getInfo shows them as stored (keys canonical, placeholders kept)', async () => {
    withRules = await sandbox({
      network: { allowOut: ['api.rules.test'], denyOut: [ALL_TRAFFIC], rules },
    });
    const info = await withRules.getInfo();
    expect(info.network?.rules).toEqual(stored);
    expect(info.network?.allowOut).toEqual(['api.rules.test']);
  });

  it('replaces the rules on update, and clears them when an update leaves them out', async () => {
    const next = {
      'other.test': [{ transform: { headers: { 'X-New': '${e2b.secrets.epsilon}' } } }],
    };
    await withRules.updateNetwork({ rules: next });
    expect((await withRules.getInfo()).network?.rules).toEqual(next);
    await withRules.updateNetwork({});
    expect((await withRules.getInfo()).network?.rules).toBeUndefined();
    await withRules.updateNetwork({ allowOut: ['api.rules.test'], denyOut: [ALL_TRAFFIC], rules });
    expect((await withRules.getInfo()).network?.rules).toEqual(stored);
  });

  it('refuses an unknown secret, identity tokens and bad headers, naming key and header, never the value', async () => {
    const refuse = async (network: object, message: RegExp) => {
      await expect(sandbox({ network: network as SandboxOpts['network'] })).rejects.toThrow(
        message,
      );
      const reply = await call('PUT', `/sandboxes/${withRules.sandboxId}/network`, network);
      expect(reply.status).toBe(400);
      expect((reply.body as { message: string }).message).toMatch(message);
      expect(reply.text).not.toContain(VALUE);
    };
    const one = (key: string, name: string, value: string) => ({
      rules: { [key]: [{ transform: { headers: { [name]: value } } }] },
    });
    await refuse(
      one('a.rules.test', 'Authorization', 'Bearer ${e2b.secrets.missing}'),
      /network\.rules\["a\.rules\.test"\] header "Authorization" names the secret "missing", which does not exist/,
    );
    await refuse(
      one('a.rules.test', 'Authorization', '${e2b.identity.tokens.aws}'),
      /a\.rules\.test.*header "Authorization" asks for workload identity tokens.*--identity-issuer/,
    );
    await refuse(
      one('a.rules.test', 'X-Key', `${VALUE}\r\nHost: evil.test`),
      /a\.rules\.test .*header "X-Key".*control character/,
    );
    await refuse(
      one('a.rules.test', 'Bad Header', VALUE),
      /header "Bad Header" is not an HTTP header name/,
    );
    await refuse(
      one('a.rules.test', 'Host', VALUE),
      /header "Host" frames the request or names its destination/,
    );
    await refuse(one('*', 'X-Key', VALUE), /bare "\*" is not a key/);
    await refuse(one('a.rules.test', 'X-Key', `${VALUE}\${oops`), /does not begin a placeholder/);
    // The refused updates left the stored rules as they were.
    expect((await withRules.getInfo()).network?.rules).toEqual(stored);
  });

  it('copies rules to forks', async () => {
    const reply = await call('POST', `/sandboxes/${withRules.sandboxId}/fork`, { count: 1 });
    expect(reply.status, reply.text).toBe(201);
    const forkID = (reply.body as Array<{ sandbox: { sandboxID: string } }>)[0]!.sandbox.sandboxID;
    const detail = await call('GET', `/sandboxes/${forkID}`);
    expect((detail.body as { network: { rules: unknown } }).network.rules).toEqual(stored);
    await call('DELETE', `/sandboxes/${forkID}`);
  });
});

describe('where a value must never appear', () => {
  it('is in no API reply', async () => {
    for (const url of [
      '/secrets',
      '/secrets/alpha',
      '/v2/sandboxes',
      '/openapi.json',
      '/metrics',
    ]) {
      expect((await call('GET', url)).status, url).toBe(200);
    }
    const sandboxIDs = (
      (await call('GET', '/v2/sandboxes')).body as Array<{ sandboxID: string }>
    ).map((s) => s.sandboxID);
    for (const id of sandboxIDs) await call('GET', `/sandboxes/${id}`);
    const text = seen.join('\n');
    expect(text).toContain('alpha');
    expect(text).not.toContain(VALUE);
    expect(text).not.toContain(NEW_VALUE);
  });

  it("is in none of Moat's output, at log level debug", () => {
    expect(child.stdout).toContain('"msg":"moat started"');
    expect(child.output()).not.toContain(VALUE);
    expect(child.output()).not.toContain(NEW_VALUE);
  });

  it('is in no file of the data folder, and opens with the key file after a restart', async () => {
    const stopped = await child.stop('SIGTERM');
    expect(stopped.code).toBe(0);
    expect(child.output()).not.toContain(VALUE);
    for (const value of [VALUE, NEW_VALUE]) {
      // grep exits 1 when nothing matches. Moat's own files: the sandbox file trees (the base
      // image, disk images, layers, templates, roots) hold what sandboxes wrote, never what Moat stores.
      const found = (() => {
        try {
          return execFileSync(
            'grep',
            [
              '-rlF',
              '--binary-files=text',
              '--devices=skip',
              ...['base', 'disks', 'layers', 'templates', 'sandboxes'].map(
                (d) => `--exclude-dir=${d}`,
              ),
              '--',
              value,
              dataDir,
            ],
            {
              encoding: 'utf8',
              timeout: 60_000,
            },
          );
        } catch (error) {
          if ((error as { status?: number }).status === 1) return '';
          throw error;
        }
      })();
      expect(found).toBe('');
    }
    // The key file is the operator's own: readable by Moat's user only.
    const mode = execFileSync('stat', ['-c', '%a', path.join(dataDir, 'secrets-key')], {
      encoding: 'utf8',
    }).trim();
    expect(mode).toBe('600');
    // What the gateway reads: the current value, sealed in the store under the key file's key.
    const store = await FileStore.open(path.join(dataDir, 'store'));
    try {
      const vault = new SecretVault({ store, key: await loadSecretsKey(undefined, dataDir) });
      expect(await vault.value('ALPHA')).toBe(VALUE);
      expect(await vault.value('beta')).toBeUndefined();
      expect([...(await vault.values()).keys()].sort()).toEqual([
        'alpha',
        'delta_2',
        'epsilon',
        'gamma-1',
      ]);
    } finally {
      await store.close();
    }
  }, 90_000);

  it('keeps secrets and rules across the restart', async () => {
    await start();
    expect((await Secret.getInfo('alpha', connection())).version).toBe(1);
    const ids = ((await call('GET', '/v2/sandboxes')).body as Array<{ sandboxID: string }>).map(
      (s) => s.sandboxID,
    );
    const withRules = [];
    for (const id of ids) {
      const detail = (await call('GET', `/sandboxes/${id}`)).body as {
        network: { rules?: Record<string, unknown> };
      };
      if (detail.network.rules !== undefined) withRules.push(Object.keys(detail.network.rules));
    }
    expect(withRules).toEqual([['api.rules.test', '*.rules.test']]);
    expect(child.output()).not.toContain(VALUE);
  }, 60_000);
});

const redisMissing = await redisProblem();

describe.skipIf(redisMissing !== undefined)('the Redis store mode', () => {
  const prefix = `moat-test:${randomUUID()}:`;
  const redisDir = mkdtempSync(path.join(os.tmpdir(), 'moat-secrets-redis-'));
  const keyFile = path.join(redisDir, 'shared-key');
  const args = () =>
    loopbackServeArgs(path.join(redisDir, 'node'), zone.port, [
      ...['--api-keys', API_KEY, '--log-level', 'debug'],
      ...['--store', `redis://127.0.0.1:${REDIS_PORT}`, '--store-prefix', prefix],
      ...['--secrets-key-file', keyFile],
    ]);

  afterAll(async () => {
    const admin = new Redis(REDIS_PORT, '127.0.0.1');
    const keys = await admin.keys(`${prefix}*`);
    if (keys.length > 0) await admin.del(...keys);
    admin.disconnect();
    removeMoatFolder(redisDir);
  });

  it('keeps secrets and a sandbox’s rules in Redis, across a restart, sealed', async () => {
    // The file store's Moat and its sandboxes are done with.
    await Promise.all(sandboxes.splice(0).map((s) => s.kill().catch(() => undefined)));
    await child.stop('SIGTERM');
    writeFileSync(keyFile, `${randomBytes(32).toString('hex')}\n`, { mode: 0o600 });
    child = new ServeChild(args());
    at = await child.started();
    const secret = await Secret.create('redis-token', VALUE, connection());
    const rules = {
      'api.redis.test': [
        { transform: { headers: { Authorization: 'Bearer ${e2b.secrets.redis-token}' } } },
      ],
    };
    const created = await sandbox({ network: { rules } });
    expect((await created.getInfo()).network?.rules).toEqual(rules);
    expect((await child.stop('SIGTERM')).code).toBe(0);

    child = new ServeChild(args());
    at = await child.started();
    expect(await Secret.getInfo(secret.secretId, connection())).toEqual(secret);
    const info = await Sandbox.getInfo(created.sandboxId, connection());
    expect(info.network?.rules).toEqual(rules);

    const admin = new Redis(REDIS_PORT, '127.0.0.1');
    try {
      const dump: string[] = [];
      for (const name of await admin.keys(`${prefix}*`))
        if ((await admin.type(name)) === 'hash')
          dump.push(JSON.stringify(await admin.hgetall(name)));
      expect(dump.join('\n')).toContain('redis-token');
      expect(dump.join('\n')).not.toContain(VALUE);
    } finally {
      admin.disconnect();
    }
    expect(child.output()).not.toContain(VALUE);
  }, 90_000);
});
