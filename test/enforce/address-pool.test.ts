import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.js';
import { AddressPool } from '../../src/enforce/index.js';
import { parseCIDR } from '../../src/policy/index.js';

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
      'source address pool 127.77.0.0/29 is exhausted (6 addresses in use)',
    );
  });

  it('reuses a released address', () => {
    const pool = new AddressPool(range('127.77.0.0/30'));
    const first = pool.allocate();
    pool.allocate();
    pool.release(first);
    expect(pool.allocate().text).toBe(first.text);
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
