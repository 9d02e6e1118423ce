/**
 * The one host normaliser. Every host name or IP literal that reaches a decision passes through
 * `parseHost` exactly once; rules and destinations are compared only in this canonical form.
 */
import { domainToASCII } from 'node:url';
import { type IPAddress, parseIP } from './address.js';
import { err, ok, type Result } from './result.js';

/** A host name in canonical form: lower-case A-labels, no trailing dot, LDH and `_` only. */
export type CanonicalName = string & { readonly __canonicalName: unique symbol };

export type Host = { kind: 'ip'; ip: IPAddress } | { kind: 'name'; name: CanonicalName };

export const MAX_NAME_LENGTH = 253;
const MAX_LABEL_LENGTH = 63;

const isDigit = (c: number) => c >= 48 && c <= 57;
const isLower = (c: number) => c >= 97 && c <= 122;
const isUpper = (c: number) => c >= 65 && c <= 90;
const HYPHEN = 45;
const UNDERSCORE = 95;
const DOT = 46;

/**
 * WHATWG URL parsers read a host whose last label is a number (`127.1`, `0x7f.1`, `2130706433`)
 * as an IPv4 address. Such a name must never match as a name while a client dials an address.
 */
function lastLabelIsNumeric(name: string): boolean {
  const label = name.slice(name.lastIndexOf('.') + 1);
  return /^(?:[0-9]+|0x[0-9a-f]*)$/i.test(label);
}

/** Checks label syntax of an ASCII name; returns a problem or undefined. */
function labelProblem(name: string): string | undefined {
  if (name.length === 0) return 'is empty';
  if (name.length > MAX_NAME_LENGTH) return `is longer than ${MAX_NAME_LENGTH} characters`;
  let start = 0;
  for (let i = 0; i <= name.length; i++) {
    const c = i < name.length ? name.charCodeAt(i) : DOT;
    if (c === DOT) {
      const length = i - start;
      if (length === 0) return 'has an empty label';
      if (length > MAX_LABEL_LENGTH)
        return `has a label longer than ${MAX_LABEL_LENGTH} characters`;
      if (name.charCodeAt(start) === HYPHEN || name.charCodeAt(i - 1) === HYPHEN) {
        return 'has a label that starts or ends with "-"';
      }
      start = i + 1;
    } else if (!(isLower(c) || isDigit(c) || c === HYPHEN || c === UNDERSCORE)) {
      return `has a character that is not a letter, digit, "-" or "_" (${JSON.stringify(String.fromCharCode(c))})`;
    }
  }
  return undefined;
}

/** True when every character is already in canonical ASCII form (the fast path). */
function isCanonicalAscii(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (!(isLower(c) || isDigit(c) || c === HYPHEN || c === UNDERSCORE || c === DOT)) return false;
  }
  return true;
}

/**
 * Canonicalises a host name (not an IP literal): one trailing dot dropped, case folded, IDN
 * mapped to A-labels (UTS #46, so full-width forms fold too), then strict label checks.
 */
export function canonicalName(input: string): Result<CanonicalName> {
  const problem = (what: string) =>
    err<CanonicalName>(`host name ${JSON.stringify(input)} ${what}`);
  const raw = input.endsWith('.') ? input.slice(0, -1) : input;
  if (raw.length > MAX_NAME_LENGTH * 4) return problem('is too long');
  let name = raw;
  if (!isCanonicalAscii(raw)) {
    for (let i = 0; i < raw.length; i++) {
      const c = raw.charCodeAt(i);
      // domainToASCII percent-decodes and accepts URL punctuation; only letters, digits, "-",
      // "_", "." and non-ASCII (IDN) may reach it.
      if (
        c < 128 &&
        !(isLower(c) || isUpper(c) || isDigit(c) || c === HYPHEN || c === UNDERSCORE || c === DOT)
      ) {
        return problem(
          `has a character that is not a letter, digit, "-" or "_" (${JSON.stringify(raw[i])})`,
        );
      }
    }
    if (lastLabelIsNumeric(raw))
      return problem('ends in a number: it is an IPv4 address in a non-standard spelling');
    name = domainToASCII(raw);
    if (name === '') return problem('is not a valid internationalised domain name');
    // A full-width or ideographic trailing dot maps to "."; it is the one trailing dot allowed.
    if (name.endsWith('.') && raw === input) name = name.slice(0, -1);
  }
  if (lastLabelIsNumeric(name))
    return problem('ends in a number: it is an IPv4 address in a non-standard spelling');
  const bad = labelProblem(name);
  if (bad) return problem(bad);
  return ok(name as CanonicalName);
}

/**
 * Classifies and canonicalises a host: an IP literal in its one accepted spelling, or a host
 * name. Brackets are the caller's business (they belong to authority syntax, not to hosts).
 */
export function parseHost(input: string): Result<Host> {
  if (input.includes(':')) {
    const ip = parseIP(input);
    return ip.ok ? ok({ kind: 'ip', ip: ip.value }) : ip;
  }
  if (input.length > 0 && isDigit(input.charCodeAt(0)) && input.includes('.')) {
    const ip = parseIP(input);
    if (ip.ok) return ok({ kind: 'ip', ip: ip.value });
  }
  const name = canonicalName(input);
  return name.ok ? ok({ kind: 'name', name: name.value }) : name;
}
