/**
 * Parsing and validation of a network configuration `{allowOut?, denyOut?,
 * allow_internet_access?}` (the PUT /sandboxes/{id}/network body, and the policy file format)
 * into canonical rules. Messages begin with the reference service's text where it has one, so
 * clients matching on it keep working, and then name the entry's list and index.
 */
import { type CIDR, isUnspecifiedNetwork, parseCIDR } from './address.js';
import { splitEntryPorts } from './destination.js';
import { type CanonicalName, canonicalName } from './host.js';
import type { PortRange } from './ports.js';
import { PRESET_PREFIX, type PresetTable } from './preset-types.js';
import type { PolicyProblem } from './result.js';
import type { DestinationRules } from './transform-types.js';
import { parseTransforms } from './transforms.js';

export type RuleList = 'allowOut' | 'denyOut';

export interface AddressRule {
  readonly kind: 'address';
  readonly list: RuleList;
  readonly index: number;
  /** The entry exactly as written. */
  readonly entry: string;
  readonly cidr: CIDR;
  /** The ports the rule covers; undefined: every port. */
  readonly ports: PortRange | undefined;
}

/** A name rule: in allowOut, or in denyOut (a Moat extension: E2B's denyOut takes addresses). */
export interface NameRule {
  readonly kind: 'name' | 'wildcard';
  readonly list: RuleList;
  /** For a preset's entry, the index of its `preset:NAME` entry. */
  readonly index: number;
  /** The entry as written (in the policy, or in the preset's file). */
  readonly entry: string;
  /** The canonical name; for a wildcard, the domain below which it matches. */
  readonly name: CanonicalName;
  /** The ports the rule covers; undefined: every port. */
  readonly ports: PortRange | undefined;
  /** The preset this entry came from, when it came from `preset:NAME`. */
  readonly preset?: string;
}

export type Rule = AddressRule | NameRule;

/** How decisions, flow records and lint name a rule: `preset:pypi (pypi.org)` for a preset's. */
export const ruleLabel = (rule: Rule): string =>
  rule.kind !== 'address' && rule.preset !== undefined
    ? `${PRESET_PREFIX}${rule.preset} (${rule.entry})`
    : rule.entry;

/** A preset used by a policy: what `GET /sandboxes/{id}` shows beside allowOut as written. */
export interface PresetUse {
  readonly name: string;
  readonly version: number;
  readonly entries: readonly string[];
}

export interface NetworkRules {
  readonly allowOut: readonly Rule[];
  readonly denyOut: readonly Rule[];
  readonly allowInternetAccess: boolean | undefined;
  /** denyOut holds 0.0.0.0/0 (ALL_TRAFFIC) or allow_internet_access is false. */
  readonly denyAll: boolean;
  readonly description: string | undefined;
  /** `network.rules`: headers set on intercepted requests, one transform per rule key. */
  readonly transforms: readonly DestinationRules[];
  /** Each preset allowOut names, once, in order of first use; its entries are in allowOut. */
  readonly presets: readonly PresetUse[];
  /** `enforce`, or `report`: denials are recorded, not enforced (a Moat extension). */
  readonly mode: NetworkMode;
}

/**
 * How a sandbox's policy is applied: `enforce` denies what it denies; `report` lets through what
 * the sandbox's own rules deny and records what they would have denied (the internal deny list,
 * the host, Moat's listeners and other sandboxes stay closed).
 */
export type NetworkMode = 'enforce' | 'report';
export const NETWORK_MODES: readonly NetworkMode[] = ['enforce', 'report'];

export type ParseResult =
  { ok: true; value: NetworkRules } | { ok: false; errors: PolicyProblem[] };

export interface ParseOptions {
  /** Entries allowed in each list (default 10,000). */
  readonly maxEntries?: number;
  /** What `preset:NAME` in allowOut may name (none when absent). */
  readonly presets?: PresetTable;
}

export const DEFAULT_MAX_ENTRIES = 10_000;
export const ALL_TRAFFIC = '0.0.0.0/0';
export const ALL_TRAFFIC_MESSAGE =
  "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.";

const KNOWN_FIELDS = new Set([
  'allowOut',
  'denyOut',
  'allow_internet_access',
  'description',
  'rules',
  'mode',
]);

/** The E2B SDK's name for 0.0.0.0/0, accepted as an entry in its place. */
const ALL_TRAFFIC_NAME = 'ALL_TRAFFIC';
/** Policy files say what they are for; bounded like everything else a client sends. */
export const MAX_DESCRIPTION_LENGTH = 4096;

/** Entries that look like an address attempt are judged as addresses, never as names. */
const looksLikeAddress = (target: string) => /[/:%]/.test(target) || /^[0-9.]+$/.test(target);

const WILDCARD_RULE = '"*" may only be the whole first label, as in "*.example.com"';

/**
 * One entry of allowOut or denyOut: a name, a `*.name` wildcard, an address or a CIDR, each
 * with an optional port or port range. Messages begin as E2B's do ("invalid allowed domain",
 * "invalid denied CIDR") and name the entry, its place and why.
 */
function parseEntry(written: string, list: RuleList, index: number): Rule | PolicyProblem {
  const at = `${list}[${index}]`;
  // ALL_TRAFFIC is the SDK's constant for 0.0.0.0/0; the rule is that entry from here on.
  const entry = written === ALL_TRAFFIC_NAME ? ALL_TRAFFIC : written;
  const allow = list === 'allowOut';
  const problem = (what: string, message: string): PolicyProblem => ({
    at,
    entry: written,
    // denyOut's errors all begin as E2B's ("invalid denied CIDR"), names included.
    message: `invalid ${allow ? `allowed ${what}` : 'denied CIDR'} ${written} (${at}): ${message}`,
  });
  const split = splitEntryPorts(entry);
  if (!split.ok) {
    const before = entry.replace(/:[^:]*$/, '');
    return problem(looksLikeAddress(before) ? 'address' : 'domain', split.error);
  }
  const { target, ports } = split.value;
  if (target.startsWith('*')) {
    const rest = target.slice(2);
    if (!target.startsWith('*.') || rest.includes('*')) return problem('domain', WILDCARD_RULE);
    const name = canonicalName(rest);
    if (!name.ok) return problem('domain', name.error);
    return { kind: 'wildcard', list, index, entry: written, name: name.value, ports };
  }
  if (looksLikeAddress(target) || target === ALL_TRAFFIC_NAME) {
    if (target === ALL_TRAFFIC_NAME)
      return problem('address', 'ALL_TRAFFIC takes no port: it denies every port');
    const cidr = parseCIDR(target);
    if (!cidr.ok) return problem('address', cidr.error);
    if (isUnspecifiedNetwork(cidr.value)) {
      if (allow) {
        return problem(
          'address',
          'the unspecified network cannot be allowed; to allow all traffic, leave denyOut empty',
        );
      }
      // The unspecified network is meaningful only as "everything", spelt 0.0.0.0/0 or ::/0.
      // Other spellings that canonicalise to a /0 (::ffff:0:0/96, 1.2.3.4/0) would deny all
      // IPv4 and leave IPv6 open, unlike ALL_TRAFFIC: refuse them rather than guess.
      if (entry !== ALL_TRAFFIC && entry !== '::/0') {
        return problem(
          'address',
          ports === undefined
            ? 'an unspecified address is only valid as 0.0.0.0/0 (all traffic) or ::/0 (all IPv6)'
            : 'the unspecified network takes no port: 0.0.0.0/0 and ::/0 deny every port',
        );
      }
    }
    return { kind: 'address', list, index, entry, cidr: cidr.value, ports };
  }
  if (target.includes('*')) return problem('domain', WILDCARD_RULE);
  const name = canonicalName(target);
  if (!name.ok) return problem('domain', name.error);
  return { kind: 'name', list, index, entry: written, name: name.value, ports };
}

function parseDenyEntry(entry: string, index: number): Rule | PolicyProblem {
  if (entry.startsWith(PRESET_PREFIX)) {
    const at = `denyOut[${index}]`;
    return {
      at,
      entry,
      message: `invalid denied CIDR ${entry} (${at}): presets only allow; use ${entry} in allowOut`,
    };
  }
  return parseEntry(entry, 'denyOut', index);
}

/** True when every name `rule` matches is one `by` matches too (ports aside). */
const nameCovers = (by: NameRule, rule: NameRule): boolean =>
  by.kind === 'name'
    ? rule.kind === 'name' && rule.name === by.name
    : rule.name.endsWith(`.${by.name}`) || (rule.kind === 'wildcard' && rule.name === by.name);

const isProblem = (parsed: Rule | readonly Rule[] | PolicyProblem): parsed is PolicyProblem =>
  !Array.isArray(parsed) && !('kind' in parsed);

/**
 * Why an entry of a preset file cannot be one (undefined when it can): it is judged exactly as
 * an allowOut entry, and must then be a name or a wildcard, never an address, range or preset.
 */
export function presetEntryProblem(entry: string, index: number): string | undefined {
  const at = `allowOut[${index}]`;
  if (entry.startsWith(PRESET_PREFIX))
    return `${at} ${JSON.stringify(entry)}: a preset cannot name another preset`;
  const parsed = parseEntry(entry, 'allowOut', index);
  if (isProblem(parsed)) return parsed.message;
  if (parsed.kind === 'address')
    return `${at} ${JSON.stringify(entry)} is an address or CIDR: a preset names only domain names and *.name wildcards`;
  return undefined;
}

/** `preset:NAME` in allowOut: the preset's entries as rules at the preset's index. */
function expandPreset(
  entry: string,
  index: number,
  presets: PresetTable | undefined,
  used: Map<string, PresetUse>,
): Rule[] | PolicyProblem {
  const at = `allowOut[${index}]`;
  if (entry.includes(':', PRESET_PREFIX.length)) {
    return {
      at,
      entry,
      message: `invalid preset ${entry} (${at}): a preset takes no port; its entries name their own`,
    };
  }
  const preset = presets?.get(entry.slice(PRESET_PREFIX.length));
  if (preset === undefined) {
    const known = [...(presets?.keys() ?? [])].sort();
    return {
      at,
      entry,
      message: `unknown preset ${entry} (${at}): known presets are ${known.length === 0 ? 'none' : known.map((name) => PRESET_PREFIX + name).join(', ')}`,
    };
  }
  used.set(preset.name, { name: preset.name, version: preset.version, entries: preset.entries });
  const rules: NameRule[] = [];
  for (const written of preset.entries) {
    // Checked when the preset's file was read (presetEntryProblem); checked again, not assumed.
    const rule = parseEntry(written, 'allowOut', index);
    if (isProblem(rule) || rule.kind === 'address') {
      return {
        at,
        entry,
        message: `preset ${entry} (${at}) from ${preset.source} holds ${JSON.stringify(written)}, which is not a name or *.name wildcard`,
      };
    }
    rules.push({ ...rule, preset: preset.name });
  }
  return rules;
}

function readList<T extends Rule>(
  config: Record<string, unknown>,
  field: RuleList,
  maxEntries: number,
  parseEntry: (entry: string, index: number) => T | readonly T[] | PolicyProblem,
  errors: PolicyProblem[],
): T[] {
  const value = config[field];
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) {
    errors.push({ at: field, message: `${field} must be an array of strings` });
    return [];
  }
  if (value.length > maxEntries) {
    errors.push({
      at: field,
      message: `${field} has ${value.length} entries; the limit is ${maxEntries} per list`,
    });
    return [];
  }
  const rules: T[] = [];
  value.forEach((entry: unknown, index) => {
    if (typeof entry !== 'string') {
      errors.push({
        at: `${field}[${index}]`,
        message: `${field}[${index}] must be a string, not ${JSON.stringify(entry)}`,
      });
      return;
    }
    const parsed = parseEntry(entry, index);
    if (isProblem(parsed)) errors.push(parsed);
    else rules.push(...(Array.isArray(parsed) ? (parsed as readonly T[]) : [parsed as T]));
  });
  return rules;
}

/** Validates a network configuration and returns its canonical rules, or every problem found. */
export function parseNetworkConfig(input: unknown, options: ParseOptions = {}): ParseResult {
  const maxEntries = options.maxEntries ?? DEFAULT_MAX_ENTRIES;
  if (typeof input !== 'object' || input === null || Array.isArray(input)) {
    return {
      ok: false,
      errors: [{ at: 'config', message: 'a network configuration must be a JSON object' }],
    };
  }
  const config = input as Record<string, unknown>;
  const errors: PolicyProblem[] = [];
  for (const key of Object.keys(config)) {
    if (!KNOWN_FIELDS.has(key)) {
      errors.push({
        at: key,
        message: `unknown field ${JSON.stringify(key)}; a network configuration has allowOut, denyOut, allow_internet_access, rules, mode and description`,
      });
    }
  }
  const access = config.allow_internet_access;
  if (access !== undefined && access !== null && typeof access !== 'boolean') {
    errors.push({
      at: 'allow_internet_access',
      message: 'allow_internet_access must be true or false',
    });
  }
  // Left out: enforce. A sandbox's mode is fixed when it is created (see SandboxService).
  const mode = config.mode ?? 'enforce';
  if (!NETWORK_MODES.includes(mode as NetworkMode)) {
    errors.push({
      at: 'mode',
      message: `mode must be "enforce" or "report" (it is ${JSON.stringify(mode)?.slice(0, 64)})`,
    });
  }
  const description = config.description;
  if (description !== undefined && typeof description !== 'string') {
    errors.push({ at: 'description', message: 'description must be a string' });
  } else if (typeof description === 'string' && description.length > MAX_DESCRIPTION_LENGTH) {
    errors.push({
      at: 'description',
      message: `description has ${description.length} characters; the limit is ${MAX_DESCRIPTION_LENGTH}`,
    });
  }
  const used = new Map<string, PresetUse>();
  const allowOut = readList(
    config,
    'allowOut',
    maxEntries,
    (entry, index) =>
      entry.startsWith(PRESET_PREFIX)
        ? expandPreset(entry, index, options.presets, used)
        : parseEntry(entry, 'allowOut', index),
    errors,
  );
  const denyOut = readList(config, 'denyOut', maxEntries, parseDenyEntry, errors);
  const transforms = parseTransforms(config.rules, errors);
  const denyAll = access === false || denyOut.some((rule) => rule.entry === ALL_TRAFFIC);
  // A name in allowOut says something only against a deny: ALL_TRAFFIC (E2B's rule), or a
  // denyOut name covering it (a Moat extension: `*.pastebin.com` denied, one name of it allowed).
  const deniedNames = denyOut.filter((rule): rule is NameRule => rule.kind !== 'address');
  const firstName = allowOut.find(
    (rule): rule is NameRule =>
      rule.kind !== 'address' && !deniedNames.some((denied) => nameCovers(denied, rule)),
  );
  if (firstName && !denyAll) {
    const what =
      firstName.preset === undefined
        ? `${JSON.stringify(firstName.entry)} is a domain`
        : `"${PRESET_PREFIX}${firstName.preset}" names domains`;
    errors.push({
      at: `allowOut[${firstName.index}]`,
      entry: firstName.entry,
      message: `${ALL_TRAFFIC_MESSAGE} (allowOut[${firstName.index}] ${what}; ALL_TRAFFIC is "0.0.0.0/0", which denies IPv6 too)`,
    });
  }
  if (errors.length > 0) return { ok: false, errors };
  return {
    ok: true,
    value: {
      allowOut,
      denyOut,
      allowInternetAccess: typeof access === 'boolean' ? access : undefined,
      denyAll,
      description: typeof description === 'string' ? description : undefined,
      transforms,
      presets: [...used.values()],
      mode: mode as NetworkMode,
    },
  };
}
