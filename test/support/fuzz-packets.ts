/**
 * Hostile DNS messages for the interceptor fuzz test: a seeded PRNG, generators for random and
 * mutated queries, and an oracle that judges a reply without using the parser under test.
 */
import dnsPacket from 'dns-packet';

/** sfc32: small, fast, seedable; good enough to pick bytes. */
export class Rng {
  private a = 0x9e3779b9;
  private b = 0x243f6a88;
  private c = 0xb7e15162;
  private d: number;

  constructor(seed: number) {
    this.d = seed >>> 0;
    for (let i = 0; i < 16; i++) this.next();
  }

  next(): number {
    const t0 = (this.a + this.b) | 0;
    this.a = this.b ^ (this.b >>> 9);
    this.b = (this.c + (this.c << 3)) | 0;
    this.c = (this.c << 21) | (this.c >>> 11);
    this.d = (this.d + 1) | 0;
    const t = (t0 + this.d) | 0;
    this.c = (this.c + t) | 0;
    return t >>> 0;
  }

  /** An integer in [0, n). */
  int(n: number): number {
    return Math.floor((this.next() / 2 ** 32) * n);
  }

  /** An integer in [lo, hi]. */
  range(lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1);
  }

  bool(p = 0.5): boolean {
    return this.next() / 2 ** 32 < p;
  }

  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)]!;
  }

  bytes(n: number): Buffer {
    const out = Buffer.allocUnsafe(n);
    for (let i = 0; i < n; i++) out[i] = this.next() & 0xff;
    return out;
  }
}

export interface GeneratedPacket {
  /** Which generator made it, for failure reports. */
  readonly kind: string;
  readonly bytes: Buffer;
}

const SUFFIX = '.allowed.test';

/** Names the fuzz policy allows: `*.allowed.test`, every label letters, digits, "-" or "_". */
export const isAllowedName = (name: string): boolean =>
  name.length > SUFFIX.length &&
  name.endsWith(SUFFIX) &&
  name
    .slice(0, -SUFFIX.length)
    .split('.')
    .every((label) => /^[a-z0-9_-]{1,63}$/.test(label));

export const ALLOWED_NAMES = [
  'api.allowed.test',
  'www.allowed.test',
  'big.allowed.test',
  'rebind.allowed.test',
  'internal.allowed.test',
  'short.allowed.test',
  'nope.allowed.test',
  'a.b.c.allowed.test',
  '_dmarc.allowed.test',
  'x-y.allowed.test',
] as const;

export const DENIED_NAMES = [
  'secret.denied.test',
  'edge.cdn.test',
  'open.test',
  'allowed.test',
  'allowed.test.evil.test',
  'xallowed.test',
  'allowed.test.allowed',
  'localhost',
  'test',
  '',
  '1.2.3.4',
  '4.3.2.1.in-addr.arpa',
  'exfil-0123456789abcdef0123456789abcdef.denied.test',
] as const;

const TYPES = [1, 1, 1, 28, 28, 16, 15, 5, 6, 12, 33, 255, 41, 252, 251, 0, 65535] as const;
const LDH = 'abcdefghijklmnopqrstuvwxyz0123456789-_';

function randomLabel(rng: Rng, max = 63): string {
  const length = rng.bool(0.8) ? rng.range(1, 12) : rng.range(1, max);
  let out = '';
  for (let i = 0; i < length; i++) out += LDH[rng.int(LDH.length)];
  return out;
}

function randomName(rng: Rng): string {
  const labels = Array.from({ length: rng.range(1, 4) }, () => randomLabel(rng));
  const suffix = rng.pick(['allowed.test', 'allowed.test', 'denied.test', 'com', 'test', '']);
  return [...labels, suffix].filter((l) => l !== '').join('.');
}

/** A name under allowed.test whose wire form is near (and often past) 255 bytes. */
function longName(rng: Rng): string {
  const target = rng.range(240, 320);
  const labels: string[] = [];
  let wire = 1 + SUFFIX.length;
  while (wire < target) {
    const label = randomLabel(rng, Math.min(63, Math.max(1, target - wire - 1)));
    labels.push(label);
    wire += label.length + 1;
  }
  return labels.join('.') + SUFFIX;
}

/** Encodes a dotted name as wire labels (no compression), optionally with random case (0x20). */
export function wireName(name: string, rng?: Rng): Buffer {
  const parts: Buffer[] = [];
  for (const label of name === '' ? [] : name.split('.')) {
    let text = label;
    if (rng?.bool(0.3)) text = [...label].map((c) => (rng.bool() ? c.toUpperCase() : c)).join('');
    const bytes = Buffer.from(text, 'latin1');
    parts.push(Buffer.from([bytes.length]), bytes);
  }
  parts.push(Buffer.from([0]));
  return Buffer.concat(parts);
}

export interface OptSpec {
  readonly payload: number;
  readonly options?: Buffer;
  /** Owner name bytes (the root, a single 0, unless set). */
  readonly name?: Buffer;
  /** The RDLENGTH field, when it should lie. */
  readonly rdLength?: number;
}

export interface QuerySpec {
  readonly id: number;
  readonly name: Buffer;
  readonly type: number;
  readonly qclass?: number;
  readonly flags?: number;
  readonly opts?: readonly OptSpec[];
}

export function optRecord(opt: OptSpec): Buffer {
  const options = opt.options ?? Buffer.alloc(0);
  const name = opt.name ?? Buffer.from([0]);
  const fixed = Buffer.alloc(10);
  fixed.writeUInt16BE(41, 0);
  fixed.writeUInt16BE(opt.payload, 2);
  fixed.writeUInt16BE(opt.rdLength ?? options.length, 8);
  return Buffer.concat([name, fixed, options]);
}

export function buildQuery(spec: QuerySpec): Buffer {
  const header = Buffer.alloc(12);
  header.writeUInt16BE(spec.id, 0);
  header.writeUInt16BE(spec.flags ?? 0x0100, 2);
  header.writeUInt16BE(1, 4);
  header.writeUInt16BE(spec.opts?.length ?? 0, 10);
  const tail = Buffer.alloc(4);
  tail.writeUInt16BE(spec.type, 0);
  tail.writeUInt16BE(spec.qclass ?? 1, 2);
  return Buffer.concat([header, spec.name, tail, ...(spec.opts ?? []).map(optRecord)]);
}

const ECS_OPTION = Buffer.from([0, 8, 0, 7, 0, 1, 24, 0, 93, 184, 1]);

/** A well-formed query: policy-relevant names, assorted types, flags and EDNS. */
export function validQuery(rng: Rng): Buffer {
  const roll = rng.int(100);
  const name =
    roll < 45
      ? rng.pick(ALLOWED_NAMES)
      : roll < 70
        ? rng.pick(DENIED_NAMES)
        : roll < 92
          ? randomName(rng)
          : longName(rng);
  const opts: OptSpec[] = [];
  if (rng.bool(0.4)) {
    const payload = rng.pick([512, 1232, 4096, 0, 1, 511, 513, 1400, 65535]);
    const options = rng.pick([undefined, ECS_OPTION, rng.bytes(rng.int(40))]);
    opts.push(options === undefined ? { payload } : { payload, options });
  }
  let flags = rng.bool(0.85) ? 0x0100 : 0;
  if (rng.bool(0.1)) flags |= 0x0010; // CD
  if (rng.bool(0.1)) flags |= 0x0020; // AD
  return buildQuery({
    id: rng.int(65536),
    name: wireName(name, rng),
    type: rng.bool(0.9) ? rng.pick(TYPES) : rng.int(65536),
    qclass: rng.bool(0.92) ? 1 : rng.pick([3, 4, 254, 255, 0, 65535]),
    flags,
    opts,
  });
}

function flipBits(base: Buffer, rng: Rng, from: number): Buffer {
  const out = Buffer.from(base);
  if (out.length <= from) return out;
  for (let n = rng.range(1, 8); n > 0; n--) {
    const i = rng.range(from, out.length - 1);
    out[i] = out[i]! ^ (1 << rng.int(8));
  }
  return out;
}

const header = (rng: Rng, counts: [number, number, number, number], flags = 0x0100): Buffer => {
  const out = Buffer.alloc(12);
  out.writeUInt16BE(rng.int(65536), 0);
  out.writeUInt16BE(flags, 2);
  for (const [i, count] of counts.entries()) out.writeUInt16BE(count, 4 + 2 * i);
  return out;
};

const typeClass = (type = 1, qclass = 1) =>
  Buffer.from([type >> 8, type & 255, qclass >> 8, qclass]);

/** Questions (and additional records) that use compression pointers: loops, forward, wild. */
function pointerPacket(rng: Rng): Buffer {
  const variant = rng.int(9);
  const hdr = header(rng, [1, 0, 0, variant >= 7 ? rng.range(1, 3) : 0]);
  switch (variant) {
    case 0: // the question name points at itself
      return Buffer.concat([hdr, Buffer.from([0xc0, 12]), typeClass()]);
    case 1: // two pointers pointing at each other
      return Buffer.concat([hdr, Buffer.from([0xc0, 14, 0xc0, 12]), typeClass()]);
    case 2: // a label, then a pointer back to the start of the name
      return Buffer.concat([hdr, Buffer.from([3, 97, 112, 105, 0xc0, 12]), typeClass()]);
    case 3: // a forward pointer to a valid name after the question
      return Buffer.concat([
        hdr,
        Buffer.from([0xc0, 18]),
        typeClass(),
        wireName('api.allowed.test'),
      ]);
    case 4: // a pointer anywhere, with the reserved 0x40/0x80 forms too
      return Buffer.concat([
        hdr,
        Buffer.from([rng.pick([0xc0, 0xc1, 0xff, 0x40, 0x80, 0xbf]), rng.int(256)]),
        typeClass(),
        rng.bytes(rng.int(20)),
      ]);
    case 5: // a pointer at the very end: no offset byte
      return Buffer.concat([
        hdr,
        wireName('api.allowed.test').subarray(0, -1),
        Buffer.from([0xc0]),
      ]);
    case 6: // a pointer into the header
      return Buffer.concat([hdr, Buffer.from([0xc0, rng.int(12)]), typeClass()]);
    default: {
      // a valid question, then additional records whose names are pointer loops
      const question = Buffer.concat([wireName(rng.pick(ALLOWED_NAMES)), typeClass()]);
      const at = 12 + question.length;
      const records: Buffer[] = [];
      for (let i = 0; i < hdr.readUInt16BE(10); i++) {
        const name = rng.pick([
          Buffer.from([0xc0 | (at >> 8), at & 255]),
          Buffer.from([0xc0, 12]),
          Buffer.from([1, 97, 0xc0, at & 255]),
        ]);
        records.push(optRecord({ payload: 1232, name }));
      }
      return Buffer.concat([hdr, question, ...records]);
    }
  }
}

/** A valid query whose header claims huge or wrong counts. */
function hugeCounts(rng: Rng): Buffer {
  const out = validQuery(rng);
  const fields = [4, 6, 8, 10].filter(() => rng.bool(0.5));
  if (fields.length === 0) fields.push(rng.pick([4, 6, 8, 10]));
  for (const at of fields) out.writeUInt16BE(rng.bool(0.7) ? 0xffff : rng.int(65536), at);
  return out;
}

/** A query with a lying, doubled or misplaced OPT record. */
function bogusOpt(rng: Rng): Buffer {
  const base = {
    id: rng.int(65536),
    name: wireName(rng.pick([...ALLOWED_NAMES, ...DENIED_NAMES])),
    type: rng.pick(TYPES),
  };
  const options = rng.bytes(rng.int(30));
  switch (rng.int(7)) {
    case 0:
      return buildQuery({ ...base, opts: [{ payload: 4096, options, rdLength: 0xffff }] });
    case 1:
      return buildQuery({
        ...base,
        opts: [{ payload: 4096, options, rdLength: options.length + rng.range(1, 50) }],
      });
    case 2: // claims less than it holds: the rest reads as another record
      return buildQuery({
        ...base,
        opts: [{ payload: 4096, options, rdLength: rng.int(options.length + 1) }],
      });
    case 3:
      return buildQuery({ ...base, opts: [{ payload: 1232 }, { payload: 65535 }] });
    case 4: // a non-root owner name
      return buildQuery({ ...base, opts: [{ payload: 1232, name: wireName('a.b') }] });
    case 5: {
      // ARCOUNT claims two records, one is there
      const out = buildQuery({ ...base, opts: [{ payload: 1232 }] });
      out.writeUInt16BE(2, 10);
      return out;
    }
    default: // an OPT cut short
      return buildQuery({ ...base, opts: [{ payload: 1232, options }] }).subarray(
        0,
        -rng.range(1, 10),
      );
  }
}

/** Offsets of the length bytes of the question name (uncompressed). */
function labelOffsets(packet: Buffer): number[] {
  const offsets: number[] = [];
  for (let i = 12; i < packet.length && packet[i]! !== 0 && packet[i]! <= 63; i += packet[i]! + 1)
    offsets.push(i);
  return offsets;
}

/** A query whose question has a label length byte of 64..255 (reserved types, pointers, junk). */
function badLabelLength(rng: Rng): Buffer {
  const out = validQuery(rng);
  const offsets = labelOffsets(out);
  out[offsets.length > 0 ? rng.pick(offsets) : 12] = rng.range(64, 255);
  return out;
}

/** A query with a byte in the name that is not letter, digit, "-" or "_". */
function badNameByte(rng: Rng): Buffer {
  const out = buildQuery({
    id: rng.int(65536),
    name: wireName(rng.pick(ALLOWED_NAMES)),
    type: 1,
  });
  const offsets = labelOffsets(out);
  const at = rng.pick(offsets) + 1;
  out[at] = rng.pick([0, 0x20, 0x2e, 0x2a, 0x2f, 0x40, 0x5c, 0x7f, 0x80, 0xc3, 0xff, rng.int(256)]);
  return out;
}

/** Something shaped like a response: records, compression, usually with QR set. */
function responseShaped(rng: Rng): Buffer {
  const name = rng.pick(ALLOWED_NAMES);
  const out = dnsPacket.encode({
    type: 'response',
    id: rng.int(65536),
    flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE | rng.int(6),
    questions: [{ type: 'A', name, class: 'IN' }],
    answers: Array.from({ length: rng.range(0, 5) }, (_, i) =>
      i % 3 === 2
        ? { type: 'CNAME' as const, name, ttl: rng.int(1000), data: 'x.allowed.test' }
        : {
            type: 'A' as const,
            name,
            ttl: rng.int(2 ** 31),
            data: `${rng.int(256)}.${rng.int(256)}.${rng.int(256)}.${rng.int(256)}`,
          },
    ),
  });
  if (rng.bool(0.3)) out.writeUInt16BE(out.readUInt16BE(2) & 0x7fff, 2); // QR cleared
  return out;
}

/** Fully random bytes, mostly of plausible lengths. */
function randomBytes(rng: Rng): Buffer {
  return rng.bytes(rng.bool(0.25) ? rng.int(17) : rng.int(601));
}

/** A plausible header (one question, QR clear) over a random or label-ish body. */
function randomBody(rng: Rng): Buffer {
  const hdr = header(rng, [1, 0, 0, rng.int(3)], rng.pick([0, 0x0100, 0x0110]));
  if (rng.bool(0.5)) return Buffer.concat([hdr, rng.bytes(rng.int(300))]);
  const parts: Buffer[] = [hdr];
  for (let n = rng.range(0, 6); n > 0; n--) {
    const length = rng.bool(0.9) ? rng.range(0, 63) : rng.range(64, 255);
    parts.push(Buffer.from([length]), Buffer.from(randomLabel(rng, 63).padEnd(length, 'a')));
  }
  parts.push(rng.bytes(rng.int(12)));
  return Buffer.concat(parts);
}

const withFlags = (packet: Buffer, set: number, clear = 0): Buffer => {
  const out = Buffer.from(packet);
  if (out.length >= 4) out.writeUInt16BE((out.readUInt16BE(2) & ~clear) | set, 2);
  return out;
};

type Generator = (rng: Rng) => Buffer;

const GENERATORS: ReadonlyArray<readonly [string, number, Generator]> = [
  ['random-bytes', 14, randomBytes],
  ['random-body', 8, randomBody],
  ['valid', 10, validQuery],
  ['bit-flips', 16, (rng) => flipBits(validQuery(rng), rng, 0)],
  ['bit-flips-body', 10, (rng) => flipBits(validQuery(rng), rng, 12)],
  [
    'truncated',
    8,
    (rng) => {
      const q = validQuery(rng);
      return q.subarray(0, rng.int(q.length));
    },
  ],
  ['pointer', 7, pointerPacket],
  ['huge-counts', 5, hugeCounts],
  ['bogus-opt', 5, bogusOpt],
  ['label-length-64-255', 4, badLabelLength],
  ['bad-name-byte', 3, badNameByte],
  [
    'long-name',
    3,
    (rng) => buildQuery({ id: rng.int(65536), name: wireName(longName(rng)), type: 1 }),
  ],
  ['qr-set', 3, (rng) => withFlags(validQuery(rng), 0x8000)],
  ['opcode', 2, (rng) => withFlags(validQuery(rng), rng.range(1, 15) << 11, 0x7800)],
  ['response-shaped', 3, responseShaped],
  ['trailing-garbage', 2, (rng) => Buffer.concat([validQuery(rng), rng.bytes(rng.range(1, 64))])],
];
const TOTAL_WEIGHT = GENERATORS.reduce((sum, [, weight]) => sum + weight, 0);

/** One hostile (or occasionally valid) message. */
export function generatePacket(rng: Rng): GeneratedPacket {
  let roll = rng.int(TOTAL_WEIGHT);
  for (const [kind, weight, generate] of GENERATORS) {
    if (roll < weight) return { kind, bytes: generate(rng) };
    roll -= weight;
  }
  throw new Error('unreachable');
}

/** Every prefix of a few valid queries: truncation at every length. */
export function truncationSweep(rng: Rng): GeneratedPacket[] {
  const bases = [
    buildQuery({ id: 1, name: wireName('api.allowed.test'), type: 1 }),
    buildQuery({
      id: 2,
      name: wireName('big.allowed.test'),
      type: 1,
      opts: [{ payload: 1232, options: ECS_OPTION }],
    }),
    buildQuery({ id: 3, name: wireName('secret.denied.test'), type: 28, opts: [{ payload: 512 }] }),
    buildQuery({ id: 4, name: wireName(longName(rng)), type: 1 }),
  ];
  return bases.flatMap((base) =>
    Array.from({ length: base.length + 1 }, (_, n) => ({
      kind: 'truncation-sweep',
      bytes: base.subarray(0, n),
    })),
  );
}

// ---------------------------------------------------------------------------------------------
// The oracle. It reads the query with its own small walker, not with src/dns/wire.ts.

/** The question of a query as written (uncompressed name, type, class), when it has one. */
export function questionOf(
  packet: Buffer,
): { bytes: Buffer; name: string; end: number } | undefined {
  if (packet.length < 12) return undefined;
  const labels: string[] = [];
  let i = 12;
  for (;;) {
    if (i >= packet.length) return undefined;
    const length = packet[i]!;
    if (length === 0) break;
    if (length > 63 || i + 1 + length > packet.length) return undefined;
    labels.push(packet.toString('latin1', i + 1, i + 1 + length).toLowerCase());
    i += 1 + length;
  }
  const nameEnd = i + 1;
  if (nameEnd - 12 > 255 || nameEnd + 4 > packet.length) return undefined;
  return {
    bytes: packet.subarray(12, nameEnd + 4),
    name: labels.join('.'),
    end: nameEnd + 4,
  };
}

/** A message's OPT record, when its additional section holds one. */
interface Edns {
  /** The advertised UDP payload size. */
  readonly payload: number;
  /** The upper 8 bits of a 12-bit rcode. */
  readonly extendedRcode: number;
  readonly version: number;
}

/** The OPT record of a message with a question, when its additional section holds one. */
export function ednsOf(packet: Buffer): Edns | undefined {
  const question = questionOf(packet);
  if (question === undefined) return undefined;
  let offset = question.end;
  for (let n = packet.readUInt16BE(10); n > 0; n--) {
    for (let steps = 0; ; steps++) {
      if (steps > 128 || offset >= packet.length) return undefined;
      const length = packet[offset]!;
      if (length === 0) {
        offset += 1;
        break;
      }
      if ((length & 0xc0) === 0xc0) {
        offset += 2;
        break;
      }
      if (length > 63) return undefined;
      offset += 1 + length;
    }
    if (offset + 10 > packet.length) return undefined;
    const rdLength = packet.readUInt16BE(offset + 8);
    if (offset + 10 + rdLength > packet.length) return undefined;
    if (packet.readUInt16BE(offset) === 41)
      return {
        payload: packet.readUInt16BE(offset + 2),
        extendedRcode: packet[offset + 4]!,
        version: packet[offset + 5]!,
      };
    offset += 10 + rdLength;
  }
  return undefined;
}

/** True when the message must be answered: a header's worth of bytes and QR clear. */
export const deservesReply = (packet: Buffer): boolean =>
  packet.length >= 12 && (packet[2]! & 0x80) === 0;

export interface ReplyContext {
  readonly transport: 'udp' | 'tcp';
  /** Whether the source address belongs to the registered sandbox. */
  readonly knownSource: boolean;
}

/** Problems with `reply` as the answer to `packet`; empty when it is a correct answer. */
export function replyProblems(packet: Buffer, reply: Buffer, context: ReplyContext): string[] {
  const problems: string[] = [];
  if (!deservesReply(packet)) problems.push('a reply to a message that must get none');
  if (reply.length < 12) return [...problems, `a ${reply.length}-byte reply`];
  if (packet.length >= 2 && reply.readUInt16BE(0) !== packet.readUInt16BE(0))
    problems.push('the reply ID differs from the query ID');
  const flags = reply.readUInt16BE(2);
  const rcode = (flags & 0xf) | ((ednsOf(reply)?.extendedRcode ?? 0) << 4);
  if ((flags & 0x8000) === 0) problems.push('QR is clear in the reply');
  try {
    dnsPacket.decode(reply);
    if (dnsPacket.decode.bytes !== reply.length)
      problems.push(
        `the reply does not parse cleanly (${reply.length - dnsPacket.decode.bytes} bytes left over)`,
      );
  } catch (error) {
    problems.push(`the reply does not parse (${(error as Error).message.replace(/\d+/g, 'N')})`);
  }
  const [qd, an, ns, ar] = [4, 6, 8, 10].map((at) => reply.readUInt16BE(at)) as [
    number,
    number,
    number,
    number,
  ];
  const question = questionOf(packet);
  if (qd > 1) problems.push(`the reply holds ${qd} questions`);
  if (qd === 1) {
    if (question === undefined) problems.push('the reply echoes a question the query did not have');
    else if (!reply.subarray(12, 12 + question.bytes.length).equals(question.bytes))
      problems.push('the echoed question differs from the query question');
  }
  const edns = ednsOf(packet);
  if (context.transport === 'udp') {
    const limit = edns === undefined ? 512 : Math.min(1232, Math.max(512, edns.payload));
    if (reply.length > limit)
      problems.push(`a ${reply.length}-byte UDP reply exceeds the client's ${limit}`);
  } else if (reply.length > 65535) problems.push('a TCP reply over 65535 bytes');
  if (ar > 0 && edns === undefined)
    problems.push('an additional record in reply to a query without OPT');
  const allowed = question !== undefined && isAllowedName(question.name);
  if (an + ns > 0 && !(context.knownSource && allowed))
    problems.push('records in the reply for a name or source the policy denies');
  // BADVERS (16) answers an EDNS version other than 0, and only that.
  if (rcode === 16 && (edns === undefined || edns.version === 0))
    problems.push('BADVERS for a query without an unknown EDNS version');
  if (!context.knownSource && rcode !== 1 && rcode !== 5 && rcode !== 16)
    problems.push(`rcode ${rcode} for a source that is no sandbox`);
  if (rcode === 0 && !allowed) problems.push('NOERROR for a name the policy denies');
  return problems;
}

/** Splits a TCP byte stream into the messages a server reading 2-byte length frames sees. */
export function splitFrames(stream: Buffer): Buffer[] {
  const messages: Buffer[] = [];
  let offset = 0;
  while (offset + 2 <= stream.length) {
    const length = stream.readUInt16BE(offset);
    if (offset + 2 + length > stream.length) break;
    messages.push(stream.subarray(offset + 2, offset + 2 + length));
    offset += 2 + length;
  }
  return messages;
}

export const frame = (message: Buffer): Buffer =>
  Buffer.concat([Buffer.from([message.length >> 8, message.length & 255]), message]);
