/**
 * The proxy-mode listener guard's nft text: named by the id range it refuses, and the tables a
 * killed Moat left over an overlapping range go in the same transaction as the new one.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  listenerGuardRuleset,
  listenerGuardTable,
  overlappingListenerGuards,
} from '../../src/enforce/index.js';

const ids = { first: 2_415_919_104, last: 2_416_181_247 };

describe('overlappingListenerGuards', () => {
  it.each([
    ['the same range (its own table, replaced anyway)', ids.first, ids.last, false],
    ['a range inside', ids.first + 65_536, ids.first + 131_071, true],
    ['a range around', ids.first - 65_536, ids.last + 65_536, true],
    ['a range ending on the first id', ids.first - 65_536, ids.first, true],
    ['a range starting on the last id', ids.last, ids.last + 65_536, true],
    ['a range just below', ids.first - 65_536, ids.first - 1, false],
    ['a range just above', ids.last + 1, ids.last + 65_536, false],
  ])('%s: %s', (_, first, last, stale) => {
    const listing = `table inet other\ntable inet moat_guard_${first}_${last}\ntable inet moat_x\n`;
    expect(overlappingListenerGuards(listing, ids)).toEqual(
      stale ? [`moat_guard_${first}_${last}`] : [],
    );
  });

  it('ignores tables that only look alike (other names, families, trailing text)', () => {
    const listing = [
      `table ip moat_guard_${ids.first}_${ids.last + 1}`,
      `table inet moat_guard_${ids.first}_${ids.last}x`,
      `table inet moat_guard_dfbac2d250fd`,
      `table inet xmoat_guard_${ids.first}_${ids.last + 1}`,
    ].join('\n');
    expect(overlappingListenerGuards(listing, ids)).toEqual([]);
  });

  it('finds exactly the overlapping ranges among any listing (property)', () => {
    const range = fc
      .tuple(fc.nat(2 ** 32 - 2), fc.nat(2 ** 20))
      .map(([first, span]) => ({ first, last: first + span }));
    fc.assert(
      fc.property(range, fc.array(range, { maxLength: 8 }), (mine, others) => {
        const listing = others.map((r) => `table inet ${listenerGuardTable(r)}`).join('\n');
        const expected = others
          .filter((r) => r.first <= mine.last && r.last >= mine.first)
          .map((r) => listenerGuardTable(r))
          .filter((table) => table !== listenerGuardTable(mine));
        expect(overlappingListenerGuards(listing, mine)).toEqual(expected);
      }),
    );
  });
});

describe('listenerGuardRuleset', () => {
  it('removes the stale tables, then replaces its own in one transaction', () => {
    const text = listenerGuardRuleset({
      ids,
      ports: [41_803, 41_803, 44_591],
      stale: ['moat_guard_1_2'],
    });
    const own = `inet moat_guard_${ids.first}_${ids.last}`;
    expect(text).toBe(
      [
        'add table inet moat_guard_1_2',
        'delete table inet moat_guard_1_2',
        `add table ${own}`,
        `delete table ${own}`,
        `add table ${own}`,
        `add chain ${own} output { type filter hook output priority filter; policy accept; }`,
        `add rule ${own} output meta skuid ${ids.first}-${ids.last} fib daddr type local tcp dport { 41803, 44591 } counter reject with tcp reset`,
      ].join('; '),
    );
  });
});
