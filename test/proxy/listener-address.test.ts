/**
 * The address ingress dials for a listener, from the kernel's /proc/net/tcp* form: a listener's
 * own address (a wildcard as its family's loopback), so that another sandbox's socket of the
 * other family on the same port is never the one reached.
 */
import net from 'node:net';
import os from 'node:os';
import { describe, expect, it } from 'vitest';
import { dialAddress } from '../../src/runtime/listening-ports.js';

/** An address in the kernel's form: 32-bit words in host order, as hex. */
function kernelHex(address: string): string {
  const bytes = net.isIPv4(address)
    ? address.split('.').map(Number)
    : (() => {
        const [head = '', tail = ''] = address.split('::');
        const groups = (part: string) => (part === '' ? [] : part.split(':'));
        const fill = 8 - groups(head).length - groups(tail).length;
        const all = [...groups(head), ...Array<string>(fill).fill('0'), ...groups(tail)];
        return all.flatMap((g) => [parseInt(g, 16) >> 8, parseInt(g, 16) & 255]);
      })();
  let hex = '';
  for (let at = 0; at < bytes.length; at += 4) {
    const word = bytes.slice(at, at + 4);
    if (os.endianness() === 'LE') word.reverse();
    hex += word.map((b) => b.toString(16).padStart(2, '0').toUpperCase()).join('');
  }
  return hex;
}

describe('dialAddress', () => {
  it.each([
    ['127.0.0.1', '127.0.0.1'],
    ['0.0.0.0', '127.0.0.1'],
    ['10.1.2.3', '10.1.2.3'],
    ['::', '::1'],
    ['::1', '0:0:0:0:0:0:0:1'],
    ['::ffff:7f00:1', '127.0.0.1'],
    ['fd00::5', 'fd00:0:0:0:0:0:0:5'],
  ])('a listener on %s is dialed at %s', (bound, dialed) => {
    expect(dialAddress(kernelHex(bound))).toBe(dialed);
  });

  it('the kernel spells 127.0.0.1 as this host orders bytes', () => {
    expect(kernelHex('127.0.0.1')).toBe(os.endianness() === 'LE' ? '0100007F' : '7F000001');
  });

  it.each(['', '0100007', 'ZZZZZZZZ0000'])('refuses %j', (hex) => {
    expect(dialAddress(hex)).toBeUndefined();
  });
});
