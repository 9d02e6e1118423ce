/**
 * The leak guard's search: which stored secret, by value or placeholder, a request head carries,
 * read as an origin might read it: in any ASCII case, percent-decoded once or more, and split
 * across header fields of the one request. Pure byte work, no I/O; the values are compared
 * without an exit that depends on them (every window of the head is hashed, a hash hit is
 * compared in constant time, and the search never stops at the first find).
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { secretPlaceholder } from '../policy/index.js';
import type { RequestHead } from './http1.js';

/** Percent-decoding rounds tried beyond the text as sent (`%25%36%42` is two rounds from `k`). */
const MAX_DECODE_ROUNDS = 4;
/** Parts of the head searched are joined by LF, which no secret value or placeholder holds. */
const SEPARATOR = 0x0a;
/** A rolling hash's base, odd and unknown to a sandbox (so it cannot aim collisions). */
const BASE = randomBytes(4).readUInt32LE() | 1;
/** What every placeholder starts with, lower case; the name runs to the next `}`. */
const PLACEHOLDER_START = Buffer.from(secretPlaceholder('').slice(0, -1));
const PLACEHOLDER_END = 0x7d;

interface Needle {
  readonly name: string;
  readonly bytes: Buffer;
}

/** The values of one length, by the hash of their lower-cased bytes. */
interface SameLength {
  readonly length: number;
  /** BASE to the power length - 1, for rolling the first byte out. */
  readonly power: number;
  readonly byHash: Map<number, Needle[]>;
}

/** ASCII A-Z to a-z, in place; other bytes are left alone (a value's UTF-8 bytes included). */
function lowerAscii(bytes: Buffer): Buffer {
  for (let i = 0; i < bytes.length; i++) {
    const byte = bytes[i]!;
    if (byte >= 0x41 && byte <= 0x5a) bytes[i] = byte + 0x20;
  }
  return bytes;
}

function hexDigit(byte: number): number {
  if (byte >= 0x30 && byte <= 0x39) return byte - 0x30;
  const lower = byte | 0x20;
  return lower >= 0x61 && lower <= 0x66 ? lower - 0x57 : -1;
}

/** `bytes` with each `%XX` replaced by its byte; undefined when there was none. */
function percentDecoded(bytes: Buffer): Buffer | undefined {
  if (!bytes.includes(0x25)) return undefined;
  const out = Buffer.allocUnsafe(bytes.length);
  let length = 0;
  let decoded = false;
  for (let i = 0; i < bytes.length; i++) {
    const high = bytes[i] === 0x25 && i + 2 < bytes.length ? hexDigit(bytes[i + 1]!) : -1;
    const low = high < 0 ? -1 : hexDigit(bytes[i + 2]!);
    if (low < 0) {
      out[length++] = bytes[i]!;
      continue;
    }
    out[length++] = high * 16 + low;
    decoded = true;
    i += 2;
  }
  return decoded ? out.subarray(0, length) : undefined;
}

function hashOf(bytes: Buffer, from: number, length: number): number {
  let hash = 0;
  for (let i = from; i < from + length; i++) hash = (Math.imul(hash, BASE) + bytes[i]!) >>> 0;
  return hash;
}

/**
 * What is searched: the head as sent (method, target, every field's name and value), all field
 * values run together, and the values of each repeated field name run together; each of them
 * also percent-decoded to a fixed point (bounded); all lower-cased, joined by LF. At most
 * (1 + MAX_DECODE_ROUNDS) x 3 times the head, which Moat bounds.
 */
function searchedText(head: RequestHead): Buffer {
  const parts = [
    `${head.method} ${head.target}\n${head.fields.map((f) => `${f.name}: ${f.value}`).join('\n')}`,
    head.fields.map((field) => field.value).join(''),
  ];
  const byName = new Map<string, string[]>();
  for (const field of head.fields) {
    const values = byName.get(field.lower);
    if (values === undefined) byName.set(field.lower, [field.value]);
    else values.push(field.value);
  }
  for (const values of byName.values()) if (values.length > 1) parts.push(values.join(''));
  const texts: Buffer[] = [];
  for (const part of parts) {
    let text: Buffer | undefined = Buffer.from(part, 'latin1');
    for (let round = 0; text !== undefined && round <= MAX_DECODE_ROUNDS; round++) {
      texts.push(text, Buffer.of(SEPARATOR));
      text = percentDecoded(text);
    }
  }
  return lowerAscii(Buffer.concat(texts));
}

/** The stored values of one snapshot of the secrets, ready to be searched for. */
class SecretNeedles {
  private readonly lengths: SameLength[] = [];
  /** Lower-case names, to the stored name (placeholders are found by name). */
  private readonly names = new Map<string, string>();

  constructor(secrets: ReadonlyMap<string, string>) {
    const byLength = new Map<number, SameLength>();
    for (const [name, value] of secrets) {
      this.names.set(name.toLowerCase(), name);
      const bytes = lowerAscii(Buffer.from(value, 'utf8'));
      if (bytes.length === 0) continue;
      let same = byLength.get(bytes.length);
      if (same === undefined) {
        let power = 1;
        for (let i = 1; i < bytes.length; i++) power = Math.imul(power, BASE) >>> 0;
        same = { length: bytes.length, power, byHash: new Map() };
        byLength.set(bytes.length, same);
        this.lengths.push(same);
      }
      const hash = hashOf(bytes, 0, bytes.length);
      const needles = same.byHash.get(hash);
      if (needles === undefined) same.byHash.set(hash, [{ name, bytes }]);
      else needles.push({ name, bytes });
    }
  }

  /** The names of every secret whose value or placeholder is in `text` (lower-cased). */
  foundIn(text: Buffer): Set<string> {
    const found = new Set<string>();
    for (const { length, power, byHash } of this.lengths) {
      if (text.length < length) continue;
      let hash = hashOf(text, 0, length);
      for (let at = 0; ; at++) {
        for (const needle of byHash.get(hash) ?? [])
          if (timingSafeEqual(text.subarray(at, at + length), needle.bytes)) found.add(needle.name);
        if (at + length >= text.length) break;
        const out = Math.imul(text[at]!, power);
        hash = (Math.imul((hash - out) >>> 0, BASE) + text[at + length]!) >>> 0;
      }
    }
    // Placeholders are no secret: found by their fixed start, whatever the number of names.
    for (let at = text.indexOf(PLACEHOLDER_START); at >= 0;) {
      const from = at + PLACEHOLDER_START.length;
      const end = text.indexOf(PLACEHOLDER_END, from);
      if (end < 0) break;
      const name = this.names.get(text.toString('latin1', from, end));
      if (name !== undefined) found.add(name);
      at = text.indexOf(PLACEHOLDER_START, from);
    }
    return found;
  }
}

/** Needles per snapshot: a vault hands out one map until its secrets change. */
const needlesOf = new WeakMap<ReadonlyMap<string, string>, SecretNeedles>();

/**
 * The first secret (in `secrets`' order) that `head` carries, by value or placeholder, and
 * that `bound` does not name; undefined when none. Never throws, never logs.
 */
export function carriedSecret(
  secrets: ReadonlyMap<string, string>,
  bound: ReadonlySet<string>,
  head: RequestHead,
): string | undefined {
  let needles = needlesOf.get(secrets);
  if (needles === undefined) needlesOf.set(secrets, (needles = new SecretNeedles(secrets)));
  const found = needles.foundIn(searchedText(head));
  for (const name of secrets.keys()) if (found.has(name) && !bound.has(name)) return name;
  return undefined;
}
