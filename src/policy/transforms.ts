/**
 * `network.rules`: per-destination header transforms (E2B's `rules.transform.headers`). Parsed
 * here into canonical rule keys and values split into literal text and secret references; the
 * lookup a request's host name goes through is `destinationRulesFor`.
 *
 * Values may hold credentials, so no message here ever quotes a value: problems name the rule
 * key and the header, and say what is wrong.
 */
import { canonicalName } from './host.js';
import type { PolicyProblem } from './result.js';
import {
  destinationRules,
  MAX_RULES_PER_KEY,
  parseRequestAction,
  parseRequestMatch,
} from './request-rules.js';
import type {
  DestinationRules,
  HeaderRule,
  HeaderValuePart,
  RequestAction,
  RequestMatch,
  RequestRule,
} from './transform-types.js';

/** Rule keys in one configuration. */
export const MAX_RULE_KEYS = 1000;
/** Headers one rule key sets. */
export const MAX_RULE_HEADERS = 64;
/** Distinct secrets the headers of one rule key name. */
export const MAX_SECRETS_PER_RULE = 32;
/** Characters of one header value as written (placeholders included). */
export const MAX_HEADER_VALUE_LENGTH = 8192;
/** A secret's name: what `${e2b.secrets.<name>}` may name (stored lower-cased). */
export const SECRET_NAME = /^[a-zA-Z0-9_-]+$/;
export const MAX_SECRET_NAME_LENGTH = 128;

/**
 * An identity token's name, as E2B's SDK allows it (not empty; no brace, which would end or
 * open a placeholder, and no control character); kept as written (names are case-sensitive).
 */
export const IDENTITY_TOKEN_NAME = /^[^{}\p{Cc}]+$/u;
export const MAX_IDENTITY_TOKEN_NAME_LENGTH = 128;

/** RFC 9110 token characters: what a header name is made of. */
const HTTP_TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/**
 * Headers that frame the request or name its destination. Setting them would let a rule
 * smuggle a second request past the origin's parser or front another host, so no rule may.
 */
const FRAMING_HEADERS = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'upgrade',
  'expect',
]);

/** Control characters other than horizontal tab: CR, LF and NUL among them. */
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u0008\u000a-\u001f\u007f]/;

const PLACEHOLDER_START = '${';
const SECRETS_PREFIX = 'e2b.secrets.';
const IDENTITY_PREFIX = 'e2b.identity.tokens.';

/** How a rule's value names a stored secret: `${e2b.secrets.<name>}`. */
export const secretPlaceholder = (name: string): string =>
  `${PLACEHOLDER_START}${SECRETS_PREFIX}${name}}`;

/** How a rule's value names a workload identity token: `${e2b.identity.tokens.<name>}`. */
export const identityPlaceholder = (name: string): string =>
  `${PLACEHOLDER_START}${IDENTITY_PREFIX}${name}}`;

/** Whether `name` can be an identity token's name (and so sit in a placeholder). */
export const isIdentityTokenName = (name: string): boolean =>
  name.length <= MAX_IDENTITY_TOKEN_NAME_LENGTH && IDENTITY_TOKEN_NAME.test(name);

/** A rule key in canonical form (`api.example.com`, `*.example.com`), or why it is not one. */
function ruleKey(written: string): { key: string } | { problem: string } {
  const wildcard = written.startsWith('*.');
  const rest = wildcard ? written.slice(2) : written;
  if (written === '*' || rest.includes('*')) {
    return {
      problem:
        '"*" may only be the whole first label of a key, as in "*.example.com" (a bare "*" is not a key)',
    };
  }
  const name = canonicalName(rest);
  if (!name.ok) return { problem: name.error };
  return { key: wildcard ? `*.${name.value}` : name.value };
}

/**
 * Splits a header value into literal text and secret references. The problem it returns never
 * quotes the value; only the position of a bad placeholder.
 */
function parseValue(value: string): { parts: HeaderValuePart[] } | { problem: string } {
  if (value.length > MAX_HEADER_VALUE_LENGTH) {
    return { problem: `the value is longer than ${MAX_HEADER_VALUE_LENGTH} characters` };
  }
  if (CONTROL.test(value)) {
    return {
      problem: 'the value holds a control character (CR, LF, NUL or another); none may be sent',
    };
  }
  const parts: HeaderValuePart[] = [];
  let at = 0;
  while (at < value.length) {
    const start = value.indexOf(PLACEHOLDER_START, at);
    if (start < 0) break;
    if (start > at) parts.push({ literal: value.slice(at, start) });
    const end = value.indexOf('}', start);
    const inner = end < 0 ? '' : value.slice(start + 2, end);
    if (inner.startsWith(IDENTITY_PREFIX)) {
      const token = inner.slice(IDENTITY_PREFIX.length);
      if (!isIdentityTokenName(token))
        return {
          problem: `the placeholder at character ${start + 1} of the value names no identity token: \${e2b.identity.tokens.<name>} takes 1 to ${MAX_IDENTITY_TOKEN_NAME_LENGTH} characters without "{" or "}"`,
        };
      parts.push({ identity: token });
      at = end + 1;
      continue;
    }
    const name = inner.slice(SECRETS_PREFIX.length);
    if (
      end < 0 ||
      !inner.startsWith(SECRETS_PREFIX) ||
      !SECRET_NAME.test(name) ||
      name.length > MAX_SECRET_NAME_LENGTH
    ) {
      return {
        problem: `the "\${" at character ${start + 1} of the value does not begin a placeholder \${e2b.secrets.<name>} (names are letters, digits, "_" and "-") or \${e2b.identity.tokens.<name>}`,
      };
    }
    parts.push({ secret: name.toLowerCase() });
    at = end + 1;
  }
  if (at < value.length) parts.push({ literal: value.slice(at) });
  return { parts };
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** A rule's headers (`transform.headers`), in the order written, or why they cannot be. */
function readHeaders(written: unknown, secrets: Set<string>): HeaderRule[] | string {
  if (written === undefined) return [];
  if (!isObject(written)) return 'transform.headers must be an object';
  const headers: HeaderRule[] = [];
  for (const [name, value] of Object.entries(written)) {
    const header = `header ${JSON.stringify(name)}`;
    if (!HTTP_TOKEN.test(name)) return `${header} is not an HTTP header name (a token)`;
    if (FRAMING_HEADERS.has(name.toLowerCase()))
      return `${header} frames the request or names its destination; no rule may set it`;
    if (typeof value !== 'string') return `${header} must have a string value`;
    const parsed = parseValue(value);
    if ('problem' in parsed) return `${header}: ${parsed.problem}`;
    for (const part of parsed.parts) if ('secret' in part) secrets.add(part.secret);
    headers.push({ name, value: parsed.parts });
  }
  return headers;
}

/**
 * `match` and `action` of a rule: beside its `transform` (Moat's form), or inside it (the form
 * E2B SDK 2.51 sends: it keeps only `transform` of a rule, and passes that object on whole).
 */
function readAccess(
  rule: Record<string, unknown>,
  transform: Record<string, unknown> | undefined,
): { match: RequestMatch | undefined; action: RequestAction | undefined } | string {
  const twice = (['match', 'action'] as const).find(
    (field) => rule[field] !== undefined && transform?.[field] !== undefined,
  );
  if (twice !== undefined) return `${twice} is written both beside and inside transform`;
  const match = rule.match ?? transform?.match;
  const action = rule.action ?? transform?.action;
  const parsedMatch = match === undefined ? undefined : parseRequestMatch(match);
  if (typeof parsedMatch === 'string') return parsedMatch;
  const parsedAction = action === undefined ? undefined : parseRequestAction(action);
  if (typeof parsedAction === 'object') return parsedAction.problem;
  return { match: parsedMatch, action: parsedAction };
}

const RULE_FIELDS = new Set(['transform', 'match', 'action']);
const TRANSFORM_FIELDS = new Set(['headers', 'match', 'action']);

/** The rules of one key, in the order written. */
function readRules(
  key: string,
  written: string,
  rules: unknown,
  errors: PolicyProblem[],
): DestinationRules | undefined {
  const at = `rules[${JSON.stringify(written)}]`;
  const fail = (message: string) => {
    errors.push({ at, entry: written, message: `invalid rule ${written} (${at}): ${message}` });
    return undefined;
  };
  if (!Array.isArray(rules)) return fail('a rule key takes an array of rules');
  if (rules.length > MAX_RULES_PER_KEY)
    return fail(`it has ${rules.length} rules; the limit is ${MAX_RULES_PER_KEY}`);
  const read: RequestRule[] = [];
  const secrets = new Set<string>();
  for (const [index, rule] of rules.entries()) {
    if (!isObject(rule)) return fail(`rule ${index} must be an object`);
    const unknown = Object.keys(rule).find((field) => !RULE_FIELDS.has(field));
    if (unknown !== undefined)
      return fail(`rule ${index} has unknown field ${JSON.stringify(unknown)}`);
    const transform = rule.transform;
    if (transform !== undefined && !isObject(transform))
      return fail(`rule ${index}'s transform must be an object`);
    const unknownField = Object.keys(transform ?? {}).find((f) => !TRANSFORM_FIELDS.has(f));
    if (unknownField !== undefined)
      return fail(`rule ${index}'s transform has unknown field ${JSON.stringify(unknownField)}`);
    const headers = readHeaders(transform?.headers, secrets);
    if (typeof headers === 'string') return fail(`rule ${index}'s ${headers}`);
    const access = readAccess(rule, transform);
    if (typeof access === 'string') return fail(`rule ${index}: ${access}`);
    // E2B SDK 2.51 sends `{}` for a rule whose `match` and `action` sit beside `transform`:
    // accepting it would silently drop what the rule was written to refuse.
    if (transform === undefined && access.match === undefined && access.action === undefined)
      return fail(
        `rule ${index} is empty: it matches nothing and sets nothing. (E2B SDK 2.51 sends a rule's transform alone: write match and action inside transform)`,
      );
    if (access.match !== undefined && access.action === undefined && headers.length === 0)
      return fail(`rule ${index} has a match but neither an action nor headers: it does nothing`);
    read.push({ number: index + 1, ...access, headers });
  }
  const parsed = destinationRules(key, read);
  if (parsed.headers.length > MAX_RULE_HEADERS)
    return fail(`it sets ${parsed.headers.length} headers; the limit is ${MAX_RULE_HEADERS}`);
  if (secrets.size > MAX_SECRETS_PER_RULE)
    return fail(`its headers name ${secrets.size} secrets; the limit is ${MAX_SECRETS_PER_RULE}`);
  return parsed;
}

/**
 * Parses `network.rules` into one transform per canonical key, adding every problem to
 * `errors`. Two keys that canonicalise to the same name are refused, not merged.
 */
export function parseTransforms(input: unknown, errors: PolicyProblem[]): DestinationRules[] {
  if (input === undefined || input === null) return [];
  if (!isObject(input)) {
    errors.push({ at: 'rules', message: 'rules must be an object of rule keys' });
    return [];
  }
  const entries = Object.entries(input);
  if (entries.length > MAX_RULE_KEYS) {
    errors.push({
      at: 'rules',
      message: `rules has ${entries.length} keys; the limit is ${MAX_RULE_KEYS}`,
    });
    return [];
  }
  const transforms: DestinationRules[] = [];
  const writtenAs = new Map<string, string>();
  for (const [written, rules] of entries) {
    const at = `rules[${JSON.stringify(written)}]`;
    const key = ruleKey(written);
    if ('problem' in key) {
      errors.push({
        at,
        entry: written,
        message: `invalid rule key ${written} (${at}): ${key.problem}`,
      });
      continue;
    }
    const earlier = writtenAs.get(key.key);
    if (earlier !== undefined) {
      errors.push({
        at,
        entry: written,
        message: `rule keys ${JSON.stringify(earlier)} and ${JSON.stringify(written)} both name ${key.key}; give each destination one key`,
      });
      continue;
    }
    writtenAs.set(key.key, written);
    const read = readRules(key.key, written, rules, errors);
    if (read !== undefined) transforms.push(read);
  }
  return transforms;
}

/** The secrets a transform's headers name, each once. */
export const secretsOf = (transform: DestinationRules): string[] => [
  ...new Set(
    transform.headers.flatMap((header) =>
      header.value.flatMap((part) => ('secret' in part ? [part.secret] : [])),
    ),
  ),
];

/** The identity tokens a transform's headers name, each once. */
export const identityTokensOf = (transform: DestinationRules): string[] => [
  ...new Set(
    transform.headers.flatMap((header) =>
      header.value.flatMap((part) => ('identity' in part ? [part.identity] : [])),
    ),
  ),
];

/**
 * `network.rules` as it is stored and shown: each key in canonical form, rules as written
 * (placeholders stay placeholders). For a configuration `parseNetworkConfig` accepted.
 */
export function canonicalRuleKeys(
  rules: Readonly<Record<string, unknown>>,
): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(rules).map(([written, value]) => {
      const key = ruleKey(written);
      return ['key' in key ? key.key : written, value];
    }),
  );
}
