/**
 * One node on the Redis on 127.0.0.1:6379, through a relay the test cuts, in-process so the test
 * calls its parts directly: what the node cannot read while the store is out of reach is an
 * error (503), never "nothing to do" or "not running".
 */
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { sandboxListenerOf } from '../../src/app/cluster-node.js';
import { SandboxError } from '../../src/sandbox/index.js';
import { type ApiMoat, startApiMoat } from '../support/api-client.js';
import { REDIS_PORT, RedisRelay, redisProblem } from '../support/redis.js';

const problem = await redisProblem();
if (problem !== undefined)
  console.warn(`store outage tests skipped: no Redis on 127.0.0.1:${REDIS_PORT} (${problem})`);

const NODE = 'node-outage';
/** A well-formed sandbox ID the store does not hold. */
const UNKNOWN = `i${'0'.repeat(20)}`;

/** What `promise` rejected with (the test fails when it resolves). */
async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    (value) => expect.fail(`resolved with ${JSON.stringify(value)}`),
    (error: unknown) => error,
  );
}

describe.skipIf(problem !== undefined)('a node whose store is out of reach', () => {
  const prefix = `moat-test:${randomUUID()}:`;
  const logs: string[] = [];
  let relay: RedisRelay;
  let node: ApiMoat;

  beforeAll(async () => {
    relay = await RedisRelay.start();
    node = await startApiMoat(
      new Map(),
      { store: relay.url, 'store-prefix': prefix, 'node-id': NODE },
      logs,
    );
  }, 30_000);

  afterAll(async () => {
    relay?.restore();
    await node?.stop();
    await RedisRelay.closeAll();
    const admin = new Redis(REDIS_PORT, '127.0.0.1');
    const keys = await admin.keys(`${prefix}*`);
    if (keys.length > 0) await admin.del(...keys);
    admin.disconnect();
  });

  const elsewhere = () => sandboxListenerOf(NODE, () => node.moat.cluster, node.moat.sandboxes);

  it('skips an announced change for a sandbox the store does not hold, and says so', async () => {
    expect(await node.moat.sandboxes.reload(UNKNOWN)).toBe(false);
    const skipped = logs
      .map((line) => JSON.parse(line) as { msg: string; sandboxID?: string; reason?: string })
      .find((line) => line.msg === 'announced network change not applied here');
    expect(skipped).toMatchObject({ sandboxID: UNKNOWN, reason: expect.any(String) });
    // No live node hosts it: the sandbox listener answers "not running", relaying nowhere.
    expect(await elsewhere()(UNKNOWN)).toBeUndefined();
  });

  it('answers 503 for an announced change and a relayed request while the store is cut', async () => {
    relay.cut();
    try {
      for (const attempt of [node.moat.sandboxes.reload(UNKNOWN), elsewhere()(UNKNOWN)]) {
        const error = await rejection(attempt);
        expect(error).toBeInstanceOf(SandboxError);
        expect((error as SandboxError).status).toBe(503);
      }
    } finally {
      relay.restore();
    }
    // Once the store answers again, "not there" is an answer again.
    await vi.waitFor(async () => expect(await elsewhere()(UNKNOWN)).toBeUndefined(), {
      timeout: 5000,
      interval: 50,
    });
  });

  it('hears announced changes again once the store is back', async () => {
    relay.cut();
    relay.restore();
    const admin = new Redis(REDIS_PORT, '127.0.0.1');
    const announced = `i${'1'.repeat(20)}`;
    const heard = () =>
      logs.some(
        (line) =>
          line.includes('announced network change not applied here') && line.includes(announced),
      );
    try {
      // Announced again until heard: the node's subscription comes back on its own time.
      await vi.waitFor(
        async () => {
          await admin.publish(
            `${prefix}policy`,
            JSON.stringify({ node: NODE, sandboxID: announced }),
          );
          expect(heard()).toBe(true);
        },
        { timeout: 10_000, interval: 200 },
      );
    } finally {
      admin.disconnect();
    }
  });
});

describe.skipIf(problem !== undefined)('a node whose resubscription gets no reply', () => {
  it('stops without an unhandled rejection (which would end the process)', async () => {
    const unhandled: unknown[] = [];
    const collect = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', collect);
    const prefix = `moat-test:${randomUUID()}:`;
    const relay = await RedisRelay.start();
    const node = await startApiMoat(
      new Map(),
      { store: relay.url, 'store-prefix': prefix, 'node-id': 'node-resubscribe' },
      [],
    );
    try {
      // Both connections drop and come back; the subscribing one asks for its channel again,
      // and the answer never comes before Moat stops.
      const held = relay.holdRepliesAfter('subscribe');
      relay.cut();
      relay.restore();
      await held;
      await node.stop();
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', collect);
      const admin = new Redis(REDIS_PORT, '127.0.0.1');
      const keys = await admin.keys(`${prefix}*`);
      if (keys.length > 0) await admin.del(...keys);
      admin.disconnect();
    }
  });
});
