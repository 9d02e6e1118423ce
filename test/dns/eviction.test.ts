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

describe('learned addresses and the firewall', () => {
  it('tells the firewall an eighth of the TTL more, at most 5 s', () => {
    const table = new LearnedAddressTable(() => 0, 10);
    expect(table.learn(ip('93.184.216.31'), name('a.test'), 1)).toBe(1_125);
    expect(table.learn(ip('93.184.216.32'), name('a.test'), 8)).toBe(9_000);
    expect(table.learn(ip('93.184.216.33'), name('a.test'), 300)).toBe(305_000);
    expect(table.entries().map((e) => e.expiresAt)).toEqual([1_125, 9_000, 305_000]);
  });

  it('needs no firewall change for repeats of a cached answer, whose expiry only wobbles', () => {
    let now = 0;
    const table = new LearnedAddressTable(() => now, 10);
    // A cached answer stored at 0 with TTL 300: each hit ages it in whole seconds.
    expect(table.learn(ip('93.184.216.31'), name('a.test'), 300)).toBe(305_000);
    const changes: number[] = [];
    for (now = 100; now < 299_000; now += 1_003) {
      const told = table.learn(ip('93.184.216.31'), name('a.test'), 300 - Math.floor(now / 1000));
      if (typeof told === 'number') changes.push(told);
    }
    expect(changes).toEqual([]);
    expect(table.names(ip('93.184.216.31'))).toEqual(['a.test']);
  });

  it('moves the firewall on only when the expiry passes what it was told', () => {
    let now = 0;
    const table = new LearnedAddressTable(() => now, 10);
    // A TTL clamped to the 30 s minimum: every query pushes the expiry on.
    expect(table.learn(ip('93.184.216.31'), name('a.test'), 30)).toBe(33_750);
    now = 3_000;
    expect(table.learn(ip('93.184.216.31'), name('a.test'), 30)).toBeUndefined();
    now = 4_000;
    expect(table.learn(ip('93.184.216.31'), name('a.test'), 30)).toBe(37_750);
    expect(table.entries()).toEqual([
      { address: ip('93.184.216.31'), expiresAt: 37_750, names: ['a.test'] },
    ]);
  });

  it('tells the firewall again about an address whose expiry passed, margin or not', () => {
    let now = 0;
    const table = new LearnedAddressTable(() => now, 10);
    expect(table.learn(ip('93.184.216.31'), name('a.test'), 40)).toBe(45_000);
    // Expired, within the margin; a rewrite of the firewall from entries() leaves it out.
    now = 40_500;
    expect(table.entries()).toEqual([]);
    expect(table.learn(ip('93.184.216.31'), name('a.test'), 3)).toBe(43_875);
    expect(table.entries()).toEqual([
      { address: ip('93.184.216.31'), expiresAt: 43_875, names: ['a.test'] },
    ]);
  });

  it('tells the firewall again after it missed an address', () => {
    let now = 0;
    const table = new LearnedAddressTable(() => now, 10);
    expect(table.learn(ip('93.184.216.31'), name('a.test'), 30)).toBe(33_750);
    table.firewallMissed([ip('93.184.216.31'), ip('93.184.216.99')]);
    now = 100;
    expect(table.learn(ip('93.184.216.31'), name('a.test'), 30)).toBe(33_850);
  });

  it('tells the firewall about a name new to an address (its ports may differ), not about a repeat', () => {
    const table = new LearnedAddressTable(() => 0, 10);
    expect(table.learn(ip('93.184.216.31'), name('web.test'), 300)).toBe(305_000);
    expect(table.learn(ip('93.184.216.31'), name('web.test'), 60)).toBeUndefined();
    expect(table.learn(ip('93.184.216.31'), name('ssh.test'), 60)).toBe(305_000);
    expect(table.learn(ip('93.184.216.31'), name('ssh.test'), 60)).toBeUndefined();
  });

  it('takes a dropped name’s time out of the firewall too', () => {
    const table = new LearnedAddressTable(() => 0, 10);
    table.learn(ip('93.184.216.31'), name('long.test'), 3_600);
    table.learn(ip('93.184.216.31'), name('short.test'), 60);
    table.retain(
      (kept) => kept === 'short.test',
      () => false,
    );
    expect(table.entries()).toEqual([
      { address: ip('93.184.216.31'), expiresAt: 65_000, names: ['short.test'] },
    ]);
  });

  // An attacker inside who resolves names of its own zone to a denied name's address, or
  // resolves many addresses, must not make Moat forget that the address is denied.
  it('keeps a name that denies its address when other names of the address crowd it', () => {
    let now = 0;
    const table = new LearnedAddressTable(() => now, 10);
    table.learn(ip('93.184.216.31'), name('smtp.test'), 60, true);
    for (let i = 0; i < 40; i++) {
      now += 10;
      table.learn(ip('93.184.216.31'), name(`x${i}.attacker.test`), 3_600);
    }
    const held = table.names(ip('93.184.216.31'));
    expect(held).toContain('smtp.test');
    expect(held).toHaveLength(16);
  });

  it('passes over addresses held for denials when full, and learns nothing once only denials are left', () => {
    let now = 0;
    const table = new LearnedAddressTable(() => now, 3);
    table.learn(ip('93.184.216.31'), name('smtp.test'), 60, true);
    table.learn(ip('93.184.216.32'), name('a.test'), 60);
    table.learn(ip('93.184.216.33'), name('b.test'), 60);
    // Full: the oldest, a denial, is passed over; a.test's address goes.
    expect(table.learn(ip('93.184.216.34'), name('c.test'), 60)).toBe(65_000);
    expect(table.names(ip('93.184.216.31'))).toEqual(['smtp.test']);
    expect(table.names(ip('93.184.216.32'))).toEqual([]);
    table.learn(ip('93.184.216.35'), name('smtp.test'), 60, true);
    table.learn(ip('93.184.216.36'), name('smtp.test'), 60, true);
    expect(table.learn(ip('93.184.216.37'), name('d.test'), 60)).toBe('full');
    expect(table.names(ip('93.184.216.31'))).toEqual(['smtp.test']);
    // Expired denials make room again.
    now = 61_000;
    expect(table.learn(ip('93.184.216.37'), name('d.test'), 60)).toBe(126_000);
  });

  it('keeps, at a new policy, the names it denies addresses for, and says again which deny', () => {
    const table = new LearnedAddressTable(() => 0, 10);
    table.learn(ip('93.184.216.31'), name('smtp.test'), 60);
    table.learn(ip('93.184.216.32'), name('open.test'), 60);
    // The new policy allows neither name and denies smtp.test.
    const denies = (n: string) => n === 'smtp.test';
    expect(table.retain(denies, denies)).toBe(1);
    expect(table.names(ip('93.184.216.31'))).toEqual(['smtp.test']);
    for (let i = 0; i < 20; i++)
      table.learn(ip('93.184.216.31'), name(`x${i}.attacker.test`), 3_600);
    expect(table.names(ip('93.184.216.31'))).toContain('smtp.test');
  });
});
