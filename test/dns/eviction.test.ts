import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AnswerCache, UpstreamClient } from '../../src/dns/index.js';
import { LearnedAddressTable } from '../../src/enforce/index.js';
import { type CanonicalName, parseIP } from '../../src/policy/index.js';
import { FakeDns } from '../support/fake-dns.js';

const ip = (text: string) => {
  const parsed = parseIP(text);
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.value;
};
const name = (text: string) => text as CanonicalName;

describe('answer cache bound (second chance)', () => {
  let upstream: FakeDns;
  beforeAll(async () => {
    upstream = await new FakeDns(
      new Map(
        ['x.test', 'y.test', 'z.test'].map((n, i) => [n, { A: [`93.184.216.${i + 1}`], ttl: 600 }]),
      ),
    ).start();
  });
  afterAll(() => upstream.stop());

  it('keeps an entry used since it was stored and evicts the unused one', async () => {
    const client = new UpstreamClient([{ host: '127.0.0.1', port: upstream.port }], {
      timeoutMs: 1000,
      attemptTimeoutMs: 500,
    });
    const cache = new AnswerCache(client, {
      capacity: 2,
      maxTtl: 86400,
      maxNegativeTtl: 3600,
      now: () => 1000,
    });
    await cache.resolve('x.test', 1);
    await cache.resolve('y.test', 1);
    cache.resolve('x.test', 1); // a hit: x gets its second chance
    await cache.resolve('z.test', 1); // full: y (unused) goes, not x
    expect(cache.size).toBe(2);
    upstream.log.length = 0;
    expect(cache.resolve('x.test', 1)).not.toBeInstanceOf(Promise);
    await cache.resolve('y.test', 1);
    expect(upstream.asked('y.test')).toHaveLength(1);
  });
});

describe('learned address bound', () => {
  it('makes room by dropping the entry learned or extended longest ago', () => {
    let now = 0;
    const table = new LearnedAddressTable(() => now, 2);
    table.learn(ip('93.184.216.31'), name('a.test'), 100);
    table.learn(ip('93.184.216.32'), name('b.test'), 100);
    now = 10_000;
    table.learn(ip('93.184.216.31'), name('a.test'), 100); // extended: now the most recent
    table.learn(ip('93.184.216.33'), name('c.test'), 100); // full: 93.184.216.32 goes
    expect(table.size).toBe(2);
    expect(table.names(ip('93.184.216.32'))).toEqual([]);
    expect(table.names(ip('93.184.216.31'))).toEqual(['a.test']);
    expect(table.names(ip('93.184.216.33'))).toEqual(['c.test']);
  });

  it('never shortens an entry when a later answer carries a lower TTL', () => {
    let now = 0;
    const table = new LearnedAddressTable(() => now, 10);
    table.learn(ip('93.184.216.31'), name('a.test'), 300);
    table.learn(ip('93.184.216.31'), name('b.test'), 30);
    now = 200_000;
    expect(table.names(ip('93.184.216.31'))).toEqual(['a.test']);
  });
});
