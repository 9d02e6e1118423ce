import type { ZoneEntry } from './fake-dns.js';

/**
 * The fake upstream's zone shared by the DNS tests: allowed names (with CNAME chains, answers
 * pointing into the internal list, an answer too big for UDP, a short TTL) and a denied name.
 * Addresses are data only; nothing dials them.
 */
export const TEST_ZONE = new Map<string, ZoneEntry>([
  [
    'api.allowed.test',
    { A: ['93.184.216.7', '93.184.216.8'], AAAA: ['2606:2800:220:1::7'], ttl: 120 },
  ],
  ['www.allowed.test', { CNAME: 'edge.cdn.test', ttl: 300 }],
  ['edge.cdn.test', { A: ['93.184.216.9'], ttl: 45 }],
  ['rebind.allowed.test', { A: ['10.0.0.5', '93.184.216.10'], ttl: 60 }],
  ['internal.allowed.test', { A: ['127.0.0.1', '169.254.169.254'], ttl: 60 }],
  ['big.allowed.test', { A: Array.from({ length: 60 }, (_, i) => `93.184.217.${i + 1}`), ttl: 60 }],
  ['short.allowed.test', { A: ['93.184.216.11'], ttl: 5 }],
  ['secret.denied.test', { A: ['93.184.216.66'], ttl: 60 }],
  ['open.test', { A: ['93.184.216.20'], ttl: 60 }],
  // Two names on one address (a CDN), with different TTLs.
  ['one.shared.allowed.test', { A: ['93.184.216.30'], ttl: 3600 }],
  ['two.shared.allowed.test', { A: ['93.184.216.30'], ttl: 60 }],
]);
