/**
 * Upstream answers made byte by byte: what the client reads must be what Moat checked and
 * learned, or nothing at all. A hostile zone behind an honest resolver can send any of these.
 */
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { compilePolicy, parseIP, parseNetworkConfig } from '../../src/policy/index.js';
import { type DnsHarness, startInterceptor, udpQuery } from '../support/dns-client.js';
import { FakeDns } from '../support/fake-dns.js';

const SANDBOX = 'isandbox0000000000002';
const SOURCE = '127.77.0.3';
const A = 1;
const AAAA = 28;
const CNAME = 5;
const SOA = 6;
const FLAGS_OK = 0x8180;
const FLAG_TC = 0x0200;

const policy = (config: object) => {
  const parsed = parseNetworkConfig(config);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
  return compilePolicy(parsed.value);
};

/** A name in wire form from raw labels (any bytes, "." included). */
const labels = (...parts: Buffer[]) =>
  Buffer.concat([
    ...parts.map((p) => Buffer.concat([Buffer.from([p.length]), p])),
    Buffer.from([0]),
  ]);
const text = (name: string) => labels(...name.split('.').map((l) => Buffer.from(l, 'latin1')));
/** A pointer to the question's name. */
const QUESTION_NAME = Buffer.from([0xc0, 12]);

function record(
  owner: Buffer,
  type: number,
  ttl: number,
  data: Buffer,
  length = data.length,
  rclass = 1, // IN
) {
  const fixed = Buffer.alloc(10);
  fixed.writeUInt16BE(type, 0);
  fixed.writeUInt16BE(rclass, 2);
  fixed.writeUInt32BE(ttl, 4);
  fixed.writeUInt16BE(length, 8);
  return Buffer.concat([owner, fixed, data]);
}

/** A reply to `query` (Moat's upstream query: one uncompressed question) with these records. */
function reply(query: Buffer, flags: number, answers: Buffer[], authorities: Buffer[] = []) {
  const questionEnd = 12 + query.subarray(12).indexOf(0) + 1 + 4;
  const head = Buffer.from(query.subarray(0, 12));
  head.writeUInt16BE(flags, 2);
  head.writeUInt16BE(answers.length, 6);
  head.writeUInt16BE(authorities.length, 8);
  head.writeUInt16BE(0, 10);
  return Buffer.concat([head, query.subarray(12, questionEnd), ...answers, ...authorities]);
}

function soa(ttl: number, minimum: number): Buffer {
  const numbers = Buffer.alloc(20);
  numbers.writeUInt32BE(1, 0);
  for (let i = 1; i < 4; i++) numbers.writeUInt32BE(60, 4 * i);
  numbers.writeUInt32BE(minimum, 16);
  return record(
    text('test'),
    SOA,
    ttl,
    Buffer.concat([text('ns.test'), text('admin.test'), numbers]),
  );
}

let upstream: FakeDns;
let dns: DnsHarness;

beforeAll(async () => {
  upstream = await new FakeDns(new Map()).start();
});
afterAll(() => upstream.stop());
beforeEach(async () => {
  upstream.log.length = 0;
  upstream.handcrafted.clear();
  dns = await startInterceptor(upstream.port, { timeoutMs: 400 });
  const parsed = parseIP(SOURCE);
  if (!parsed.ok) throw new Error(parsed.error);
  dns.table.register(
    SANDBOX,
    { sourceAddress: parsed.value, egressSecret: 's3cret' },
    policy({ allowOut: ['*.allowed.test'], denyOut: ['0.0.0.0/0'] }),
  );
});
afterEach(() => dns.stop());

describe('answers from a hostile upstream', () => {
  it('refuses an answer whose names would not encode back to themselves (a label holding ".")', async () => {
    // The CNAME target's first label is "b.". Re-encoded as text it would end the name early,
    // and the bytes of its next two labels would read as a record: A 127.0.0.1, never checked.
    const typeClassTtlLength = Buffer.from([0x10, 0x00, 0x01, 0x61, 0x62, 0x63, 0x64, 0x00, 0x01]);
    const hiddenRecord = Buffer.from([1, 0x62, 0, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 127, 0, 0, 1]);
    const target = labels(
      Buffer.from('b.'),
      typeClassTtlLength,
      hiddenRecord,
      Buffer.from('evil'),
      Buffer.from('test'),
    );
    upstream.handcrafted.set('api.allowed.test', (query) =>
      reply(query, FLAGS_OK, [
        record(QUESTION_NAME, CNAME, 60, target),
        record(target, A, 60, Buffer.from([93, 184, 216, 7])),
        record(target, A, 60, Buffer.from([93, 184, 216, 8])),
      ]),
    );
    const answer = await udpQuery(dns.port, SOURCE, 'api.allowed.test');
    expect(answer.rcode).toBe('SERVFAIL');
    expect(answer.answers ?? []).toEqual([]);
    expect(dns.table.get(SANDBOX)!.learned.size).toBe(0);
  });

  it('refuses A and AAAA records that do not hold exactly one address', async () => {
    const cases: Array<[string, Buffer]> = [
      // Two bytes: read as four, the missing two would come from beyond the record.
      ['short.allowed.test', record(QUESTION_NAME, A, 60, Buffer.from([127, 0]))],
      // Five bytes: the fifth would be read as the start of the next record.
      ['long.allowed.test', record(QUESTION_NAME, A, 60, Buffer.from([93, 184, 216, 7, 1]))],
      // A length field that runs past the message.
      ['huge.allowed.test', record(QUESTION_NAME, A, 60, Buffer.from([1, 2, 3, 4]), 0xffff)],
      ['six.allowed.test', record(QUESTION_NAME, AAAA, 60, Buffer.from([0x20, 1, 0x0d, 0xb8]))],
      // dns-packet picks its reader by type whatever the class, and reads class 0x8001 (IN with
      // mDNS's cache-flush bit) as IN: the length is checked for every class.
      // (Two bytes after it, so that reading four stays inside the message.)
      [
        'flush.allowed.test',
        Buffer.concat([
          record(QUESTION_NAME, A, 60, Buffer.from([127, 0]), 2, 0x8001),
          Buffer.from([0, 1]),
        ]),
      ],
      ['chaos.allowed.test', record(QUESTION_NAME, A, 60, Buffer.from([127, 0]), 2, 3)],
    ];
    for (const [name, bad] of cases) {
      upstream.handcrafted.set(name, (query) =>
        reply(query, FLAGS_OK, [record(QUESTION_NAME, A, 60, Buffer.from([93, 184, 216, 9])), bad]),
      );
      const answer = await udpQuery(
        dns.port,
        SOURCE,
        name,
        name === 'six.allowed.test' ? 'AAAA' : 'A',
      );
      expect(answer.rcode, name).toBe('SERVFAIL');
    }
    expect(dns.table.get(SANDBOX)!.learned.size).toBe(0);
  });

  it('passes on and learns only records of class IN exactly (not IN with the mDNS flush bit)', async () => {
    upstream.handcrafted.set('flushed.allowed.test', (query) =>
      reply(query, FLAGS_OK, [
        record(QUESTION_NAME, A, 60, Buffer.from([93, 184, 216, 9]), 4, 0x8001),
        record(QUESTION_NAME, A, 60, Buffer.from([93, 184, 216, 10])),
      ]),
    );
    const answer = await udpQuery(dns.port, SOURCE, 'flushed.allowed.test');
    expect(answer.rcode).toBe('NOERROR');
    expect(answer.answers?.map((a) => [a.type, a.data])).toEqual([['A', '93.184.216.10']]);
    expect(dns.table.get(SANDBOX)!.learned.size).toBe(1);
  });

  it('counts an answer still truncated over TCP as a failure, and never caches it', async () => {
    upstream.handcrafted.set('big.allowed.test', (query, transport) =>
      transport === 'udp'
        ? reply(query, FLAGS_OK | FLAG_TC, [])
        : reply(query, FLAGS_OK | FLAG_TC, [
            record(QUESTION_NAME, A, 60, Buffer.from([93, 184, 1, 1])),
          ]),
    );
    const first = await udpQuery(dns.port, SOURCE, 'big.allowed.test');
    expect(first.rcode).toBe('SERVFAIL');
    const transports = upstream.asked('big.allowed.test').map((q) => q.transport);
    expect(transports.slice(0, 2)).toEqual(['udp', 'tcp']);
    const asked = transports.length;
    expect((await udpQuery(dns.port, SOURCE, 'big.allowed.test')).rcode).toBe('SERVFAIL');
    expect(upstream.asked('big.allowed.test').length).toBeGreaterThan(asked);
  });

  // RFC 2308: a negative answer, NXDOMAIN or NODATA (a CNAME chain ending in nothing of the
  // asked type), lives min(SOA TTL, SOA MINIMUM, the TTL of any CNAME that led to it), and the
  // client is told the same in the SOA's TTL. Each case gives 5 s from a different field.
  it.each([
    // NXDOMAIN behind a CNAME of 5 s (§5): no longer than the CNAME.
    {
      name: 'gone.allowed.test',
      flags: FLAGS_OK | 3,
      rcode: 'NXDOMAIN',
      cname: 5,
      soa: [3600, 3600],
    },
    // NOERROR with only a CNAME: NODATA, not a positive answer living for the CNAME's 3600 s.
    { name: 'nodata.allowed.test', flags: FLAGS_OK, rcode: 'NOERROR', cname: 3600, soa: [3600, 5] },
  ])('keeps a negative answer behind a CNAME as a negative answer: $rcode', async (c) => {
    upstream.handcrafted.set(c.name, (query) =>
      reply(
        query,
        c.flags,
        [record(QUESTION_NAME, CNAME, c.cname, text('target.cdn.test'))],
        [soa(c.soa[0]!, c.soa[1]!)],
      ),
    );
    const first = await udpQuery(dns.port, SOURCE, c.name);
    expect(first.rcode).toBe(c.rcode);
    expect(first.authorities?.[0]).toMatchObject({ type: 'SOA', ttl: 5 });
    dns.clock.now += 4_000;
    await udpQuery(dns.port, SOURCE, c.name);
    expect(upstream.asked(c.name)).toHaveLength(1);
    dns.clock.now += 2_000;
    await udpQuery(dns.port, SOURCE, c.name);
    expect(upstream.asked(c.name)).toHaveLength(2);
  });
});
