/**
 * Methods and paths in `network.rules` (a Moat extension beside E2B's `transform`): each rule of
 * a destination may carry `match: {methods?, paths?}` and `action: "allow" | "deny"`. A request
 * is decided by walking the destination's rules in order: every rule whose match fits adds its
 * headers, and the first fitting rule with an action decides. With no such rule the request
 * passes (the address lists already let its connection through), which is E2B's meaning of a
 * rules list that only transforms.
 *
 * Paths are matched as sent, never rewritten: at a destination whose rules match paths, a
 * request whose path an origin could read as another one (dot segments, empty segments,
 * backslashes, path parameters, escapes of characters that need none) is refused instead, so
 * what Moat decided is what the origin reads.
 */
import type {
  DestinationRules,
  HeaderRule,
  RequestAction,
  RequestMatch,
  RequestRule,
} from './transform-types.js';

/** The most rules one destination key holds. */
export const MAX_RULES_PER_KEY = 64;
/** The most methods, and path patterns, one rule's match names. */
export const MAX_MATCH_METHODS = 16;
export const MAX_MATCH_PATHS = 64;
/** The longest path pattern, in characters. */
export const MAX_PATH_PATTERN_LENGTH = 1024;

/** RFC 9110 token characters: what a method is made of. */
const METHOD_TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}$/;

/** Characters that may stand in a path as they are: RFC 3986 pchar, less ";" (see below). */
const PATH_CHARACTER = /[A-Za-z0-9\-._~!$&'()*+,=:@/]/;
/** Escapes of these name a character that needs none, or one an origin may read as structure. */
const UNRESERVED = /[A-Za-z0-9\-._~]/;
const STRUCTURAL_ESCAPES = new Set(['%2F', '%5C', '%3B', '%25', '%00']);
const STRICT_UTF8 = new TextDecoder('utf-8', { fatal: true });
/** Headers some origins (Google's APIs, frameworks' middleware) take as the request's method. */
export const METHOD_OVERRIDE_HEADERS = [
  'x-http-method-override',
  'x-http-method',
  'x-method-override',
];

/**
 * Why `path` (a request target's path, without its query) is not one every origin reads alike;
 * undefined when it is. A rule's pattern is held to the same: its `*` is a path character too.
 */
export function pathProblem(path: string): string | undefined {
  if (!path.startsWith('/')) return 'it does not begin with "/"';
  for (let at = 0; at < path.length; at++) {
    const c = path[at]!;
    if (c === '%') {
      const escape = path.slice(at, at + 3).toUpperCase();
      if (!/^%[0-9A-F]{2}$/.test(escape)) return `"%" at character ${at + 1} begins no escape`;
      const byte = Number.parseInt(escape.slice(1), 16);
      if (byte >= 0x80) {
        // A run of escaped bytes must be UTF-8 in its shortest form: an overlong "." or "/"
        // is one some decoders still read as that character.
        const run = /^(?:%[89A-Fa-f][0-9A-Fa-f])+/.exec(path.slice(at))![0];
        const bytes = Uint8Array.from(run.match(/%../g)!, (e) => Number.parseInt(e.slice(1), 16));
        try {
          STRICT_UTF8.decode(bytes);
        } catch {
          return `the escapes at character ${at + 1} are not UTF-8 in its shortest form`;
        }
        at += run.length - 1;
        continue;
      }
      const character = String.fromCharCode(byte);
      if (UNRESERVED.test(character) || PATH_CHARACTER.test(character))
        return `${escape} at character ${at + 1} escapes "${character}", which is sent as it is`;
      if (STRUCTURAL_ESCAPES.has(escape) || byte < 0x20 || byte === 0x7f)
        return `${escape} at character ${at + 1} escapes a character origins differ on (a separator, "%", or a control character)`;
      at += 2;
      continue;
    }
    if (c === ';')
      return `";" at character ${at + 1} begins a path parameter, which some origins drop`;
    if (c === '\\') return `"\\" at character ${at + 1} is read as "/" by some origins`;
    if (!PATH_CHARACTER.test(c))
      return `character ${at + 1} (${JSON.stringify(c)}) must be percent-encoded`;
  }
  const segments = path.slice(1).split('/');
  for (const [index, segment] of segments.entries()) {
    if (segment === '.' || segment === '..')
      return `it has a "${segment}" segment; send the path it stands for`;
    if (segment === '' && index < segments.length - 1) return 'it has an empty segment ("//")';
  }
  return undefined;
}

/** Whether `pattern` (`*`: any run of characters) matches `path`, character for character. */
function globMatches(pattern: string, path: string): boolean {
  const pieces = pattern.split('*');
  if (pieces.length === 1) return pattern === path;
  const first = pieces[0]!;
  const last = pieces.at(-1)!;
  if (!path.startsWith(first) || path.length < first.length + last.length) return false;
  if (!path.endsWith(last)) return false;
  // Each middle piece, leftmost first: a `*`-only glob needs no backtracking.
  let at = first.length;
  const end = path.length - last.length;
  for (const piece of pieces.slice(1, -1)) {
    const found = path.indexOf(piece, at);
    if (found < 0 || found + piece.length > end) return false;
    at = found + piece.length;
  }
  return true;
}

/** A request target's path (without the query); the whole target for the asterisk form. */
export const requestPath = (target: string): string => {
  const query = target.search(/[?#]/);
  return query < 0 ? target : target.slice(0, query);
};

/**
 * Whether a rule's match fits a request. Methods compare exactly (a rule naming GET fits HEAD
 * too: origins route HEAD to GET's handler); paths compare exactly for a rule that allows or
 * sets headers, and without regard to ASCII case for one that denies, so that `/Admin` cannot
 * pass a deny written for `/admin/*` at an origin that folds case, nor a credential scoped to
 * `/t/abc/*` go to `/T/ABC` at one that does not.
 */
function fits(rule: RequestRule, method: string, path: string, lowerPath: string): boolean {
  const { match } = rule;
  if (match === undefined) return true;
  if (
    match.methods !== undefined &&
    !match.methods.includes(method) &&
    !(method === 'HEAD' && match.methods.includes('GET'))
  )
    return false;
  if (match.paths === undefined) return true;
  return rule.action === 'deny'
    ? match.paths.some((pattern) => globMatches(pattern.toLowerCase(), lowerPath))
    : match.paths.some((pattern) => globMatches(pattern, path));
}

export type RequestDecision =
  | {
      readonly verdict: 'allow';
      /** The rule that allowed it; undefined: none decided (its connection's decision stands). */
      readonly rule: RequestRule | undefined;
      /** The headers of every fitting rule up to the deciding one, in order. */
      readonly headers: readonly HeaderRule[];
    }
  | { readonly verdict: 'deny'; readonly rule: RequestRule }
  /** The path is not one every origin reads alike, at a destination whose rules match paths. */
  | { readonly verdict: 'invalid'; readonly problem: string };

/**
 * Decides a request (`method` as sent, `target` its request target in origin or asterisk form)
 * by a destination's rules; `override` names a method-override header the request carries.
 */
export function decideRequest(
  rules: DestinationRules,
  method: string,
  target: string,
  override?: string,
): RequestDecision {
  // Transforms alone (E2B's rules): every rule fits, and none decides.
  if (!rules.decidesRequests) return { verdict: 'allow', rule: undefined, headers: rules.headers };
  const path = requestPath(target);
  if (rules.matchesMethods) {
    if (method !== method.toUpperCase())
      return {
        verdict: 'invalid',
        problem: `method ${JSON.stringify(method)} is not upper case, and origins differ on whether it is ${method.toUpperCase()}`,
      };
    if (override !== undefined)
      return {
        verdict: 'invalid',
        problem: `the request carries ${override}, which some origins take as its method`,
      };
  }
  if (rules.matchesPaths) {
    if (target.includes('#'))
      return { verdict: 'invalid', problem: 'the request target holds "#"' };
    const problem = path === '*' ? undefined : pathProblem(path);
    if (problem !== undefined)
      return { verdict: 'invalid', problem: `path ${JSON.stringify(path)}: ${problem}` };
  }
  const lowerPath = path.toLowerCase();
  const headers: HeaderRule[] = [];
  for (const rule of rules.rules) {
    if (!fits(rule, method, path, lowerPath)) continue;
    if (rule.action === 'deny') return { verdict: 'deny', rule };
    headers.push(...rule.headers);
    if (rule.action === 'allow') return { verdict: 'allow', rule, headers };
  }
  return { verdict: 'allow', rule: undefined, headers };
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** Reads a list of strings no longer than `max`, each checked by `check`; or says why not. */
function readList(
  written: unknown,
  field: string,
  max: number,
  check: (item: string) => string | undefined,
): readonly string[] | string {
  if (!Array.isArray(written) || written.length === 0)
    return `match.${field} must be a non-empty array of strings`;
  if (written.length > max)
    return `match.${field} has ${written.length} items; the limit is ${max}`;
  for (const [index, item] of written.entries()) {
    if (typeof item !== 'string') return `match.${field}[${index}] must be a string`;
    const problem = check(item);
    if (problem !== undefined) return `match.${field}[${index}] ${JSON.stringify(item)} ${problem}`;
  }
  return written as string[];
}

const methodProblem = (method: string) =>
  METHOD_TOKEN.test(method) ? undefined : 'is not an HTTP method (a token of 1 to 32 characters)';

function patternProblem(pattern: string): string | undefined {
  if (pattern.length > MAX_PATH_PATTERN_LENGTH)
    return `is longer than ${MAX_PATH_PATTERN_LENGTH} characters`;
  if (/[?#]/.test(pattern))
    return 'holds "?" or "#": paths match the path alone, and the query is not matched';
  const problem = pathProblem(pattern);
  return problem === undefined ? undefined : `is not a path a request could send: ${problem}`;
}

/** `match` as written in a rule, or why it cannot be one. */
export function parseRequestMatch(written: unknown): RequestMatch | string {
  if (!isObject(written)) return 'match must be an object with methods, paths or both';
  const unknown = Object.keys(written).find((field) => field !== 'methods' && field !== 'paths');
  if (unknown !== undefined)
    return `match has unknown field ${JSON.stringify(unknown)} (it takes methods and paths)`;
  if (written.methods === undefined && written.paths === undefined)
    return 'match names neither methods nor paths';
  let methods: readonly string[] | undefined;
  if (written.methods !== undefined) {
    const read = readList(written.methods, 'methods', MAX_MATCH_METHODS, methodProblem);
    if (typeof read === 'string') return read;
    methods = [...new Set(read.map((method) => method.toUpperCase()))];
  }
  let paths: readonly string[] | undefined;
  if (written.paths !== undefined) {
    const read = readList(written.paths, 'paths', MAX_MATCH_PATHS, patternProblem);
    if (typeof read === 'string') return read;
    paths = read;
  }
  return { methods, paths };
}

/** `action` as written in a rule, or why it cannot be one. */
export const parseRequestAction = (written: unknown): RequestAction | { problem: string } =>
  written === 'allow' || written === 'deny'
    ? written
    : { problem: `action ${JSON.stringify(written)} is neither "allow" nor "deny"` };

/** How a decision, a flow record and `moat check` name a rule: `api.github.com #2`. */
export const requestRuleLabel = (ruleKey: string, rule: RequestRule): string =>
  `${ruleKey} #${rule.number}`;

/** The longest path, and method, a decision's reason (and a flow record) repeats. */
export const MAX_SHOWN_PATH = 512;
export const MAX_SHOWN_METHOD = 32;

/** A destination's rules, with what is derived from them. */
export function destinationRules(ruleKey: string, rules: readonly RequestRule[]): DestinationRules {
  return {
    ruleKey,
    rules,
    headers: rules.flatMap((rule) => rule.headers),
    matchesPaths: rules.some((rule) => rule.match?.paths !== undefined),
    matchesMethods: rules.some((rule) => rule.match?.methods !== undefined),
    decidesRequests: rules.some((rule) => rule.match !== undefined || rule.action !== undefined),
  };
}

/** A destination with one rule that sets `headers` on every request: E2B's form of a rule. */
export const headerRules = (ruleKey: string, headers: readonly HeaderRule[]): DestinationRules =>
  destinationRules(ruleKey, [{ number: 1, match: undefined, action: undefined, headers }]);
