/**
 * The leak guard's search: which secret a request head carries, by a stored value or by a
 * placeholder of any name, read as an origin might read it: in any ASCII case, percent-decoded once or more, and split
 * across header fields of the one request. Pure byte work, no I/O; the values are compared
 * without an exit that depends on them (every window of the head is hashed by a value's
 * prefix, a hash hit is compared whole in constant time, and the search never stops at the first
 * find). Its cost is one pass over the searched text per prefix length (normally one), whatever
 * the number of secrets.
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { MAX_SECRET_NAME_LENGTH, SECRET_NAME, secretPlaceholder } from '../policy/index.js';
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

/**
 * Values are found by their first PREFIX bytes (or all of a shorter one), whatever their
 * length: one pass over the text for every value of PREFIX bytes or more, and a hit is compared
 * whole.
 */
const PREFIX = 8;
/** The filter is indexed by a hash's top FILTER_BITS, read before any Map lookup. */
const FILTER_BITS = 16;

/** The values whose prefixes are `length` bytes long, by the hash of their prefix. */
interface SamePrefix {
  readonly length: number;
  /** BASE to the power length - 1, for rolling the first byte out. */
  readonly power: number;
  /** 1 at the top bits of every prefix's hash: most windows of a text miss it. */
  readonly filter: Uint8Array;
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
  let at = bytes.indexOf(0x25);
  if (at < 0) return undefined;
  const out = Buffer.allocUnsafe(bytes.length);
  let length = 0;
  let copied = 0;
  // From one `%` to the next: the bytes between are copied as they are.
  for (; at >= 0 && at + 2 < bytes.length; at = bytes.indexOf(0x25, at + 1)) {
    const high = hexDigit(bytes[at + 1]!);
    const low = high < 0 ? -1 : hexDigit(bytes[at + 2]!);
    if (low < 0) continue;
    length += bytes.copy(out, length, copied, at);
    out[length++] = high * 16 + low;
    copied = at + 3;
    at += 2;
  }
  if (copied === 0) return undefined;
  length += bytes.copy(out, length, copied);
  return out.subarray(0, length);
}

function hashOf(bytes: Buffer, from: number, length: number): number {
  let hash = 0;
  for (let i = from; i < from + length; i++) hash = (Math.imul(hash, BASE) + bytes[i]!) >>> 0;
  return hash;
}

/**
 * What is searched: the method, target and field names, all field values run together (a
 * value in one field, or split across fields), and the values of each repeated field name run
 * together; each of them also percent-decoded to a fixed point (bounded); all lower-cased,
 * joined by LF. At most (1 + MAX_DECODE_ROUNDS) x 2 times the head, which Moat bounds.
 */
function searchedText(head: RequestHead): Buffer {
  const parts = [
    `${head.method} ${head.target}\n${head.fields.map((field) => field.name).join('\n')}`,
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
  /** One per prefix length: normally one, a group per length under PREFIX besides. */
  private readonly prefixes: SamePrefix[] = [];

  constructor(secrets: ReadonlyMap<string, string>) {
    const byLength = new Map<number, SamePrefix>();
    for (const [name, value] of secrets) {
      const bytes = lowerAscii(Buffer.from(value, 'utf8'));
      if (bytes.length === 0) continue;
      const length = Math.min(PREFIX, bytes.length);
      let same = byLength.get(length);
      if (same === undefined) {
        let power = 1;
        for (let i = 1; i < length; i++) power = Math.imul(power, BASE) >>> 0;
        same = { length, power, filter: new Uint8Array(1 << FILTER_BITS), byHash: new Map() };
        byLength.set(length, same);
        this.prefixes.push(same);
      }
      const hash = hashOf(bytes, 0, length);
      same.filter[hash >>> (32 - FILTER_BITS)] = 1;
      const needles = same.byHash.get(hash);
      if (needles === undefined) same.byHash.set(hash, [{ name, bytes }]);
      else needles.push({ name, bytes });
    }
  }

  /** The names of every secret whose value is in `text` (lower-cased). */
  foundIn(text: Buffer): Set<string> {
    const found = new Set<string>();
    for (const { length, power, filter, byHash } of this.prefixes) {
      if (text.length < length) continue;
      let hash = hashOf(text, 0, length);
      for (let at = 0; ; at++) {
        if (filter[hash >>> (32 - FILTER_BITS)] === 1)
          for (const needle of byHash.get(hash) ?? []) {
            const end = at + needle.bytes.length;
            if (end <= text.length && timingSafeEqual(text.subarray(at, end), needle.bytes))
              found.add(needle.name);
          }
        if (at + length >= text.length) break;
        const out = Math.imul(text[at]!, power);
        hash = (Math.imul((hash - out) >>> 0, BASE) + text[at + length]!) >>> 0;
      }
    }
    return found;
  }
}

/**
 * The names (lower case, as stored) of every placeholder in `text` (lower-cased), stored or
 * not: found by their fixed start, whatever the number of secrets.
 */
function placeholdersIn(text: Buffer): string[] {
  const names: string[] = [];
  for (let at = text.indexOf(PLACEHOLDER_START); at >= 0;) {
    const from = at + PLACEHOLDER_START.length;
    // Only as far as the longest name: many starts and one far `}` must not cost their product.
    const length = text.subarray(from, from + MAX_SECRET_NAME_LENGTH + 1).indexOf(PLACEHOLDER_END);
    const name = length > 0 ? text.toString('latin1', from, from + length) : '';
    if (SECRET_NAME.test(name)) names.push(name);
    at = text.indexOf(PLACEHOLDER_START, from);
  }
  return names;
}

/** Needles per snapshot: a vault hands out one map until its secrets change. */
const needlesOf = new WeakMap<ReadonlyMap<string, string>, SecretNeedles>();

/** A secret a request carries: by its value, or by a placeholder (of any name, stored or not). */
export interface CarriedSecret {
  readonly name: string;
  readonly by: 'value' | 'placeholder';
}

/** Whether any part of `head` the search reads holds a `$` or a `%`. */
function mayHoldPlaceholder(head: RequestHead): boolean {
  const maybe = (text: string) => text.includes('$') || text.includes('%');
  return (
    maybe(head.method) ||
    maybe(head.target) ||
    head.fields.some((field) => maybe(field.name) || maybe(field.value))
  );
}

/**
 * The first secret that `head` carries and that `bound` (names, lower case) does not name:
 * by value (in `secrets`' order), else by placeholder (in the head's order); undefined when
 * none. A placeholder is never filled in outside a rule's headers, so one of a name no stored
 * secret has is found the same as a stored one's (which names are stored is no answer a
 * request gets). Never throws, never logs.
 */
export function carriedSecret(
  secrets: ReadonlyMap<string, string>,
  bound: ReadonlySet<string>,
  head: RequestHead,
): CarriedSecret | undefined {
  // Without stored values only a placeholder can be carried, and its `$` appears as sent or
  // percent-encoded: a head with neither `$` nor `%` (most of them) needs no search.
  if (secrets.size === 0 && !mayHoldPlaceholder(head)) return undefined;
  let needles = needlesOf.get(secrets);
  if (needles === undefined) needlesOf.set(secrets, (needles = new SecretNeedles(secrets)));
  const text = searchedText(head);
  const found = needles.foundIn(text);
  for (const name of secrets.keys())
    if (found.has(name) && !bound.has(name)) return { name, by: 'value' };
  const placeholder = placeholdersIn(text).find((name) => !bound.has(name));
  return placeholder === undefined ? undefined : { name: placeholder, by: 'placeholder' };
}
