/**
 * The local routes the host watch reads (`ip -j route show table all type local`, IPv4 and
 * IPv6): each route's destination as a prefix, whatever else `ip` prints or fails to print.
 */
import { describe, expect, it } from 'vitest';
import { localRoutePrefixes } from '../../src/enforce/host-watch.js';

describe('localRoutePrefixes', () => {
  it.each([
    [
      'a host route',
      '[{"type":"local","dst":"10.213.0.1","dev":"lo","prefsrc":"10.213.0.1"}]',
      ['10.213.0.1/32'],
    ],
    [
      'an AnyIP prefix',
      '[{"type":"local","dst":"198.18.21.128/26","dev":"lo","prefsrc":"198.18.21.1"}]',
      ['198.18.21.128/26'],
    ],
    [
      'an IPv6 host route and prefix',
      '[{"dst":"::1"},{"dst":"2001:db8:7::/64"}]',
      ['::1/128', '2001:db8:7::/64'],
    ],
    ['no local route', '[]', []],
    [
      'entries without a destination, or the default',
      '[{"type":"local"},{"dst":"default"},null,7]',
      [],
    ],
    ['not JSON (an old ip without -j)', 'local 10.0.0.1 dev lo', []],
    ['JSON that is not a list', '{"dst":"10.0.0.1"}', []],
  ])('%s', (_, json, prefixes) => {
    expect(localRoutePrefixes(json)).toEqual(prefixes);
  });
});
