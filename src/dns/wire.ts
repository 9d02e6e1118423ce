/**
 * DNS wire format, the parts we do by hand: strict parsing of queries from sandboxes (every
 * byte hostile), encoding upstream queries, short error answers, and walking encoded answers to
 * find their TTL fields so cached bytes can be reused with only the ID and TTLs patched.
 */

export const RCODE = {
  NOERROR: 0,
  FORMERR: 1,
  SERVFAIL: 2,
  NXDOMAIN: 3,
  NOTIMP: 4,
  REFUSED: 5,
  /** Extended (RFC 6891): the header carries its low 4 bits, the OPT record the rest. */
  BADVERS: 16,
} as const;
export const TYPE = { A: 1, AAAA: 28, OPT: 41, ANY: 255 } as const;
const CLASS_IN = 1;
export const HEADER_LENGTH = 12;
const MAX_NAME_WIRE_LENGTH = 255;
/** What we advertise and answer with over UDP (DNS flag day 2020: no fragmentation). */
export const MAX_UDP_PAYLOAD = 1232;
const MIN_UDP_PAYLOAD = 512;

const FLAG_QR = 0x8000;
const FLAG_TC = 0x0200;
const FLAG_RD = 0x0100;
const FLAG_RA = 0x0080;
const FLAG_CD = 0x0010;

export interface Query {
  readonly id: number;
  readonly recursionDesired: boolean;
  readonly checkingDisabled: boolean;
  /** The question name as the client wrote it on the wire (case kept: 0x20 randomisation). */
  readonly nameWire: Buffer;
  /** Lower-case dotted name, labels already checked for LDH and "_" only. */
  readonly name: string;
  readonly type: number;
  readonly qclass: number;
  /** The client's EDNS UDP payload size, when it sent an OPT record. */
  readonly ednsPayload: number | undefined;
}

/** What to do with bytes that claimed to be a query. */
export type QueryParse =
  | { kind: 'query'; query: Query }
  /** Answer with this rcode (the question is echoed when it parsed). */
  | { kind: 'error'; rcode: number; id: number; question: Buffer | undefined; reason: string }
  /** Not worth an answer: too short to hold an ID, or a response sent to us (loop guard). */
  | { kind: 'drop'; reason: string };

const isNameByte = (c: number) =>
  (c >= 97 && c <= 122) || (c >= 65 && c <= 90) || (c >= 48 && c <= 57) || c === 45 || c === 95;

/** Where readQuestionName spells a name out: room for 255 bytes and one more label. */
const nameText = Buffer.alloc(MAX_NAME_WIRE_LENGTH + 64);

/** Reads an uncompressed name at `offset`; returns the end offset and the dotted lower-case name. */
function readQuestionName(buf: Buffer, offset: number): { end: number; name: string } | string {
  // Spelled into one scratch buffer and read out once: a name is asked for on every query.
  let spelled = 0;
  let i = offset;
  for (;;) {
    if (i >= buf.length) return 'the question name runs past the end of the message';
    const length = buf[i]!;
    if (length === 0) break;
    if (length > 63) return 'the question name uses compression or a reserved label type';
    if (i + 1 + length > buf.length) return 'a label runs past the end of the message';
    if (spelled > 0) nameText[spelled++] = 0x2e;
    for (let j = i + 1; j <= i + length; j++) {
      const c = buf[j]!;
      if (!isNameByte(c))
        return `a label holds a byte that is not a letter, digit, "-" or "_" (0x${c.toString(16)})`;
      nameText[spelled++] = c >= 65 && c <= 90 ? c | 0x20 : c;
    }
    i += 1 + length;
    if (i + 1 - offset > MAX_NAME_WIRE_LENGTH) return 'the question name is longer than 255 bytes';
  }
  return { end: i + 1, name: nameText.toString('latin1', 0, spelled) };
}

/** Skips a possibly compressed name in a record; returns the offset after it, or -1. */
function skipName(buf: Buffer, offset: number): number {
  let i = offset;
  for (let steps = 0; steps < 128 && i < buf.length; steps++) {
    const length = buf[i]!;
    if (length === 0) return i + 1;
    if ((length & 0xc0) === 0xc0) return i + 2 <= buf.length ? i + 2 : -1;
    if (length > 63) return -1;
    i += 1 + length;
  }
  return -1;
}

/** Parses a query strictly. Nothing here throws, whatever the bytes. */
export function parseQuery(buf: Buffer): QueryParse {
  if (buf.length < HEADER_LENGTH) return { kind: 'drop', reason: 'shorter than a DNS header' };
  const id = buf.readUInt16BE(0);
  const flags = buf.readUInt16BE(2);
  if (flags & FLAG_QR) return { kind: 'drop', reason: 'a response, not a query' };
  const error = (rcode: number, reason: string, question?: Buffer): QueryParse => ({
    kind: 'error',
    rcode,
    id,
    question,
    reason,
  });
  const opcode = (flags >> 11) & 0xf;
  if (opcode !== 0) return error(RCODE.REFUSED, `opcode ${opcode} is not QUERY`);
  if (buf.readUInt16BE(4) !== 1)
    return error(RCODE.FORMERR, 'a query must hold exactly one question');
  if (buf.readUInt16BE(6) !== 0 || buf.readUInt16BE(8) !== 0)
    return error(RCODE.FORMERR, 'a query must not hold answer or authority records');
  const parsedName = readQuestionName(buf, HEADER_LENGTH);
  if (typeof parsedName === 'string') return error(RCODE.FORMERR, parsedName);
  const { end, name } = parsedName;
  if (end + 4 > buf.length) return error(RCODE.FORMERR, 'the question has no type and class');
  const question = buf.subarray(HEADER_LENGTH, end + 4);
  const type = buf.readUInt16BE(end);
  const qclass = buf.readUInt16BE(end + 2);
  if (qclass !== CLASS_IN) return error(RCODE.REFUSED, `class ${qclass} is not IN`, question);
  let ednsPayload: number | undefined;
  let offset = end + 4;
  for (let n = buf.readUInt16BE(10); n > 0; n--) {
    const after = skipName(buf, offset);
    if (after < 0 || after + 10 > buf.length)
      return error(RCODE.FORMERR, 'an additional record is malformed', question);
    const rrType = buf.readUInt16BE(after);
    const rdLength = buf.readUInt16BE(after + 8);
    if (after + 10 + rdLength > buf.length)
      return error(RCODE.FORMERR, 'an additional record runs past the end', question);
    if (rrType === TYPE.OPT) {
      if (ednsPayload !== undefined)
        return error(RCODE.FORMERR, 'more than one OPT record', question);
      const version = buf[after + 5]!;
      if (version !== 0)
        return error(RCODE.BADVERS, `EDNS version ${version} is not supported (only 0)`, question);
      ednsPayload = buf.readUInt16BE(after + 2);
    }
    offset = after + 10 + rdLength;
  }
  return {
    kind: 'query',
    query: {
      id,
      recursionDesired: (flags & FLAG_RD) !== 0,
      checkingDisabled: (flags & FLAG_CD) !== 0,
      nameWire: buf.subarray(HEADER_LENGTH, end),
      name,
      type,
      qclass,
      ednsPayload,
    },
  };
}

/** The largest answer a client can take: 512 without EDNS, its advertised size up to 1232 with. */
export const udpLimit = (query: Query | undefined): number =>
  query?.ednsPayload === undefined
    ? MIN_UDP_PAYLOAD
    : Math.min(MAX_UDP_PAYLOAD, Math.max(MIN_UDP_PAYLOAD, query.ednsPayload));

const OPT_RECORD = Buffer.from([
  0,
  0,
  TYPE.OPT,
  MAX_UDP_PAYLOAD >> 8,
  MAX_UDP_PAYLOAD & 0xff,
  0,
  0,
  0,
  0,
  0,
  0,
]);

function writeHeader(
  out: Buffer,
  id: number,
  query: Pick<Query, 'recursionDesired' | 'checkingDisabled'> | undefined,
  rcode: number,
  truncated: boolean,
): void {
  let flags = FLAG_QR | FLAG_RA | rcode;
  if (query?.recursionDesired) flags |= FLAG_RD;
  if (query?.checkingDisabled) flags |= FLAG_CD;
  if (truncated) flags |= FLAG_TC;
  out.writeUInt16BE(id, 0);
  out.writeUInt16BE(flags, 2);
}

/** An answer with no records: errors, NXDOMAIN, refusals, and truncation notices. */
export function emptyAnswer(
  id: number,
  question: Buffer | undefined,
  rcode: number,
  query?: Query,
  truncated = false,
): Buffer {
  // An extended rcode needs an OPT record to carry its upper bits.
  const opt = query?.ednsPayload !== undefined || rcode > 0xf;
  const out = Buffer.alloc(HEADER_LENGTH + (question?.length ?? 0) + (opt ? OPT_RECORD.length : 0));
  writeHeader(out, id, query, rcode & 0xf, truncated);
  if (question) {
    out.writeUInt16BE(1, 4);
    question.copy(out, HEADER_LENGTH);
  }
  if (opt) {
    out.writeUInt16BE(1, 10);
    const at = out.length - OPT_RECORD.length;
    OPT_RECORD.copy(out, at);
    out[at + 5] = rcode >> 4;
  }
  return out;
}

/** The question section of a parsed query (name as the client wrote it, type, class). */
export function questionOf(query: Query): Buffer {
  // nameWire ends with the root label's zero byte.
  const out = Buffer.alloc(query.nameWire.length + 4);
  query.nameWire.copy(out, 0);
  out.writeUInt16BE(query.type, query.nameWire.length);
  out.writeUInt16BE(query.qclass, query.nameWire.length + 2);
  return out;
}

/** Encodes our own query to an upstream: lower-case name, RD, EDNS with our payload size, nothing else. */
export function encodeUpstreamQuery(id: number, name: string, type: number): Buffer {
  const labels = name === '' ? [] : name.split('.');
  const nameLength = labels.reduce((sum, label) => sum + 1 + label.length, 1);
  const out = Buffer.alloc(HEADER_LENGTH + nameLength + 4 + OPT_RECORD.length);
  out.writeUInt16BE(id, 0);
  out.writeUInt16BE(FLAG_RD, 2);
  out.writeUInt16BE(1, 4);
  out.writeUInt16BE(1, 10);
  let i = HEADER_LENGTH;
  for (const label of labels) {
    out[i++] = label.length;
    i += out.write(label, i, 'latin1');
  }
  out[i++] = 0;
  out.writeUInt16BE(type, i);
  out.writeUInt16BE(CLASS_IN, i + 2);
  OPT_RECORD.copy(out, i + 4);
  return out;
}

/** True when `response` answers exactly our question (ID checked by the caller). */
export function answersQuestion(response: Buffer, query: Buffer): boolean {
  if (response.length < HEADER_LENGTH || (response.readUInt16BE(2) & FLAG_QR) === 0) return false;
  if (response.readUInt16BE(4) !== 1) return false;
  const questionEnd = skipName(query, HEADER_LENGTH) + 4;
  const length = questionEnd - HEADER_LENGTH;
  if (response.length < HEADER_LENGTH + length) return false;
  // Our query's name is uncompressed labels. Upstreams may change the case of its letters (0x20
  // randomisation), so letters compare case-insensitively; length bytes, every other byte and
  // the type and class must match exactly.
  let i = HEADER_LENGTH;
  for (let label = query[i]!; label !== 0; label = query[i]!) {
    if (response[i] !== label) return false;
    const end = i + 1 + label;
    for (let j = i + 1; j < end; j++) {
      if (asciiLower(response[j]!) !== asciiLower(query[j]!)) return false;
    }
    i = end;
  }
  for (; i < questionEnd; i++) if (response[i] !== query[i]) return false;
  return true;
}

const asciiLower = (byte: number): number => (byte >= 0x41 && byte <= 0x5a ? byte | 0x20 : byte);

export const isTruncated = (response: Buffer): boolean =>
  (response.readUInt16BE(2) & FLAG_TC) !== 0;

interface RecordSpan {
  readonly type: number;
  readonly ttlOffset: number;
  readonly dataLength: number;
}

/**
 * The first `count` records after the question section, as their length fields frame them, or
 * undefined when the message does not walk cleanly.
 */
function walkRecords(message: Buffer, count: number): RecordSpan[] | undefined {
  if (message.length < HEADER_LENGTH) return undefined;
  let offset = HEADER_LENGTH;
  for (let n = message.readUInt16BE(4); n > 0; n--) {
    offset = skipName(message, offset);
    if (offset < 0) return undefined;
    offset += 4;
  }
  const records: RecordSpan[] = [];
  for (let n = 0; n < count; n++) {
    const after = skipName(message, offset);
    if (after < 0 || after + 10 > message.length) return undefined;
    const dataLength = message.readUInt16BE(after + 8);
    records.push({
      type: message.readUInt16BE(after),
      ttlOffset: after + 4,
      dataLength,
    });
    offset = after + 10 + dataLength;
  }
  return offset <= message.length ? records : undefined;
}

/**
 * Offsets of the TTL field of every answer and authority record of a message (no OPT in these
 * sections), or undefined when the message does not walk cleanly.
 */
export function ttlOffsets(message: Buffer): number[] | undefined {
  const count = message.readUInt16BE(6) + message.readUInt16BE(8);
  return walkRecords(message, count)?.map((record) => record.ttlOffset);
}

/**
 * Why an upstream reply's records cannot be read as their length fields frame them, or
 * undefined. dns-packet reads 4 and 16 bytes for A and AAAA whatever the record says (and
 * whatever its class: it reads class 0x8001 as IN), so a record of another length would be
 * read across its neighbour.
 */
export function replyFramingProblem(message: Buffer): string | undefined {
  const count = message.readUInt16BE(6) + message.readUInt16BE(8) + message.readUInt16BE(10);
  const records = walkRecords(message, count);
  if (records === undefined) return 'its records run past its end';
  for (const { type, dataLength } of records) {
    if (type === TYPE.A && dataLength !== 4) return `an A record holds ${dataLength} bytes, not 4`;
    if (type === TYPE.AAAA && dataLength !== 16)
      return `an AAAA record holds ${dataLength} bytes, not 16`;
  }
  return undefined;
}

/**
 * Makes the answer a client receives from a reusable encoded message (ID 0, lower-case
 * question, no OPT): patches ID, flags, question case and TTLs, and adds OPT when the client
 * used EDNS. Returns a truncation notice when it would not fit `limit`.
 */
export function finishAnswer(
  template: Buffer,
  offsets: readonly number[],
  ttls: readonly number[],
  query: Query,
  rcode: number,
  limit: number,
): Buffer {
  const opt = query.ednsPayload !== undefined;
  const size = template.length + (opt ? OPT_RECORD.length : 0);
  if (size > limit) return emptyAnswer(query.id, questionOf(query), rcode, query, true);
  const out = Buffer.allocUnsafe(size);
  template.copy(out, 0);
  writeHeader(out, query.id, query, rcode, false);
  query.nameWire.copy(out, HEADER_LENGTH);
  for (let i = 0; i < offsets.length; i++) out.writeUInt32BE(ttls[i]!, offsets[i]!);
  if (opt) {
    out.writeUInt16BE(1, 10);
    OPT_RECORD.copy(out, template.length);
  }
  return out;
}
