import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.js';
import { AddressPool } from '../../src/enforce/index.js';
import { parseCIDR, parseIP } from '../../src/policy/index.js';

const range = (text: string) => {
  const parsed = parseCIDR(text);
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.value;
};

describe('source address pool', () => {
  it('hands out distinct addresses, never the network or broadcast address', () => {
    const pool = new AddressPool(range('127.77.0.0/29'));
    const handed = Array.from({ length: 6 }, () => pool.allocate().text);
    expect(handed).toEqual([
      '127.77.0.1',
      '127.77.0.2',
      '127.77.0.3',
      '127.77.0.4',
      '127.77.0.5',
      '127.77.0.6',
    ]);
    expect(() => pool.allocate()).toThrow(
      'source address pool 127.77.0.0/29 is exhausted (6 sandboxes hold addresses from it)',
    );
  });

  it('reuses a released address', () => {
    const pool = new AddressPool(range('127.77.0.0/30'));
    const first = pool.allocate();
    pool.allocate();
    pool.release(first);
    expect(pool.allocate().text).toBe(first.text);
  });

  it('in link mode hands out the sandbox end of one /30 per sandbox, keeping the first for the gateway', () => {
    const pool = new AddressPool(range('10.213.0.0/28'), { block: 4 });
    expect(pool.capacity).toBe(3);
    const handed = Array.from({ length: 3 }, () => pool.allocate());
    expect(handed.map((a) => a.text)).toEqual(['10.213.0.6', '10.213.0.10', '10.213.0.14']);
    expect(handed.map((a) => pool.slotOf(a))).toEqual([1, 2, 3]);
    expect(handed.map((a) => AddressPool.offset(a, -1).text)).toEqual([
      '10.213.0.5',
      '10.213.0.9',
      '10.213.0.13',
    ]);
    expect(() => pool.allocate()).toThrow(/is exhausted \(3 sandboxes/);
    // Host ends, the gateway block and foreign addresses are not sandbox addresses.
    for (const text of ['10.213.0.5', '10.213.0.2', '10.213.0.7', '10.213.1.6']) {
      const parsed = parseIP(text);
      expect(parsed.ok && pool.reserve(parsed.value)).toBe(false);
    }
    pool.release(handed[1]!);
    expect(pool.allocate().text).toBe('10.213.0.10');
  });

  it('is configured by --source-pool (default 127.77.0.0/16) and rejects what cannot work', () => {
    // An explicit upstream keeps the test off this machine's /etc/resolv.conf.
    const upstream = { 'dns-upstream': '127.0.0.1:53' };
    const fallback = loadConfig({ flags: upstream });
    expect(fallback.ok && fallback.value.sourcePool.text).toBe('127.77.0.0/16');
    const custom = loadConfig({ flags: upstream, env: { MOAT_SOURCE_POOL: '127.88.0.0/24' } });
    expect(custom.ok && custom.value.sourcePool.text).toBe('127.88.0.0/24');
    for (const bad of ['fd00::/64', '127.0.0.1/32', 'banana']) {
      const result = loadConfig({ flags: { ...upstream, 'source-pool': bad } });
      expect(result.ok ? 'accepted' : result.error).toMatch(/^--source-pool: /);
    }
  });
});
