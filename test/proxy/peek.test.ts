/** Reading the SNI of a ClientHello that arrives in pieces, and what is too many pieces. */
import { describe, expect, it } from 'vitest';
import { peekTlsServerName, startsLikeHttp, tlsRecordStart } from '../../src/proxy/peek.js';
import { clientHello, inRecords } from '../support/tls-records.js';

describe('peekTlsServerName', () => {
  const hello = clientHello('tls.allowed.test');

  it('reads the SNI from one record, from a few, and waits for a record cut short', () => {
    expect(peekTlsServerName(inRecords(hello, 16384))).toEqual({
      status: 'done',
      name: 'tls.allowed.test',
    });
    expect(peekTlsServerName(inRecords(hello, 20))).toMatchObject({ name: 'tls.allowed.test' });
    const whole = inRecords(hello, 20);
    expect(peekTlsServerName(whole.subarray(0, whole.length - 1))).toEqual({
      status: 'incomplete',
    });
  });

  it('refuses a ClientHello spread over more than 16 records (each arrival re-reads them all)', () => {
    const size = Math.floor(hello.length / 17);
    expect(peekTlsServerName(inRecords(hello, size))).toMatchObject({
      status: 'invalid',
      reason: expect.stringContaining('more than 16 TLS records'),
    });
    // Refused as soon as the 17th record begins, before the rest arrives.
    expect(peekTlsServerName(inRecords(hello, 1).subarray(0, 17 * 6))).toMatchObject({
      status: 'invalid',
    });
  });

  it.each([
    ['an alert record', [0x15, 0x03, 0x01, 0x00, 0x02], true],
    ['application data', [0x17, 0x03, 0x03], true],
    ['one byte that could begin a record', [0x15], 'wait'],
    ['two', [0x14, 0x03], 'wait'],
    ['a database message whose length starts with 0x15', [0x15, 0x01, 0x00, 0x00], false],
    ['a version byte out of range', [0x16, 0x03, 0x09], false],
    ['an HTTP method', [...Buffer.from('GET ')], false],
  ] as const)('tells the start of a TLS record: %s', (_, bytes, expected) => {
    expect(tlsRecordStart(Buffer.from(bytes))).toBe(expected);
  });
});

describe('startsLikeHttp', () => {
  const like = (text: string) => startsLikeHttp(Buffer.from(text, 'latin1'), 64);
  it.each([
    ['GET / HTTP/1.1\r\n', true],
    ['get /x HTTP/1.0\n', true],
    ['\r\n\r\nPOST /a HTTP/1.1\r\n', true],
    ['PRI * HTTP/2.0\r\n', true],
    ['SSH-2.0-OpenSSH_9.6\r\n', false],
    ['*1\r\n$4\r\nPING\r\n', false],
    ['EHLO client.example\r\n', false],
    ['SET key value\r\nGET / HTTP/1.1\r\n', false],
    ['\x00\x00\x00\x08\x04\xd2\x16\x2f', false],
    [' GET / HTTP/1.1\r\n', false],
    ['GET', 'wait'],
    ['GET /path HTTP/1.', 'wait'],
    ['\r\n', 'wait'],
    [`GET /${'a'.repeat(80)}`, true],
    ['A'.repeat(80), true],
  ])('%j: %s', (text, expected) => {
    expect(like(text)).toBe(expected);
  });
});
