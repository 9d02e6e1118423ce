/**
 * Parsing and validation of a network configuration `{allowOut?, denyOut?,
 * allow_internet_access?}` (the PUT /sandboxes/{id}/network body, and the policy file format)
 * into canonical rules. Messages begin with the reference service's text where it has one, so
 * clients matching on it keep working, and then name the entry's list and index.
 */
import { type CIDR, isUnspecifiedNetwork, parseCIDR } from './address.js';
import { type CanonicalName, canonicalName } from './host.js';
import { PRESET_PREFIX, type PresetTable } from './preset-types.js';
import type { PolicyProblem } from './result.js';
import type { HeaderTransform } from './transform-types.js';
import { parseTransforms } from './transforms.js';

export type RuleList = 'allowOut' | 'denyOut';

export interface AddressRule {
  readonly kind: 'address';
  readonly list: RuleList;
  readonly index: number;
  /** The entry exactly as written. */
  readonly entry: string;
  readonly cidr: CIDR;
}

export interface NameRule {
  readonly kind: 'name' | 'wildcard';
  readonly list: 'allowOut';
  /** For a preset's entry, the index of its `preset:NAME` entry. */
  readonly index: number;
  /** The entry as written (in the policy, or in the preset's file). */
  readonly entry: string;
  /** The canonical name; for a wildcard, the domain below which it matches. */
  readonly name: CanonicalName;
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
  readonly denyOut: readonly AddressRule[];
  readonly allowInternetAccess: boolean | undefined;
  /** denyOut holds 0.0.0.0/0 (ALL_TRAFFIC) or allow_internet_access is false. */
  readonly denyAll: boolean;
  readonly description: string | undefined;
  /** `network.rules`: headers set on intercepted requests, one transform per rule key. */
  readonly transforms: readonly HeaderTransform[];
  /** Each preset allowOut names, once, in order of first use; its entries are in allowOut. */
  readonly presets: readonly PresetUse[];
}

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
]);

/** The E2B SDK's name for 0.0.0.0/0, accepted as an entry in its place. */
const ALL_TRAFFIC_NAME = 'ALL_TRAFFIC';
/** Policy files say what they are for; bounded like everything else a client sends. */
export const MAX_DESCRIPTION_LENGTH = 4096;

/** `pypi.org:443`, `1.2.3.4:443`, `[::1]:443`: a destination with a port, not an entry. */
const HOST_WITH_PORT = /^(?:\[[0-9a-fA-F:.]+\]|[^:/[\]]+):[0-9]{1,5}$/;

/** A hint for an entry written with a port: rules name hosts and networks, never ports. */
const portHint = (entry: string): string =>
  HOST_WITH_PORT.test(entry)
    ? `; entries take no port (a rule covers every port): write ${JSON.stringify(entry.replace(/:[0-9]+$/, '').replace(/^\[(.*)\]$/, '$1'))}`
    : '';

/** Entries that look like an address attempt are judged as addresses, never as names. */
const looksLikeAddress = (entry: string) => /[/:%]/.test(entry) || /^[0-9.]+$/.test(entry);

function parseAllowEntry(entry: string, index: number): Rule | PolicyProblem {
  const at = `allowOut[${index}]`;
  const problem = (message: string): PolicyProblem => ({ at, entry, message });
  if (entry.startsWith('*')) {
    const rest = entry.slice(2);
    if (!entry.startsWith('*.') || rest.includes('*')) {
      return problem(
        `invalid allowed domain ${entry} (${at}): "*" may only be the whole first label, as in "*.example.com"`,
      );
    }
    const name = canonicalName(rest);
    if (!name.ok) return problem(`invalid allowed domain ${entry} (${at}): ${name.error}`);
    return { kind: 'wildcard', list: 'allowOut', index, entry, name: name.value };
  }
  if (looksLikeAddress(entry) || entry === ALL_TRAFFIC_NAME) {
    const cidr = parseCIDR(entry === ALL_TRAFFIC_NAME ? ALL_TRAFFIC : entry);
    if (!cidr.ok)
      return problem(`invalid allowed address ${entry} (${at}): ${cidr.error}${portHint(entry)}`);
    if (isUnspecifiedNetwork(cidr.value)) {
      return problem(
        `invalid allowed address ${entry} (${at}): the unspecified network cannot be allowed; to allow all traffic, leave denyOut empty`,
      );
    }
    return { kind: 'address', list: 'allowOut', index, entry, cidr: cidr.value };
  }
  if (entry.includes('*')) {
    return problem(
      `invalid allowed domain ${entry} (${at}): "*" may only be the whole first label, as in "*.example.com"`,
    );
  }
  const name = canonicalName(entry);
  if (!name.ok) return problem(`invalid allowed domain ${entry} (${at}): ${name.error}`);
  return { kind: 'name', list: 'allowOut', index, entry, name: name.value };
}

function parseDenyEntry(written: string, index: number): AddressRule | PolicyProblem {
  const at = `denyOut[${index}]`;
  // ALL_TRAFFIC is the SDK's constant for 0.0.0.0/0; the rule is that entry from here on.
  const entry = written === ALL_TRAFFIC_NAME ? ALL_TRAFFIC : written;
  if (entry.startsWith(PRESET_PREFIX)) {
    return {
      at,
      entry,
      message: `invalid denied CIDR ${entry} (${at}): presets only allow; use ${entry} in allowOut`,
    };
  }
  const cidr = parseCIDR(entry);
  if (!cidr.ok) {
    const why = looksLikeAddress(entry)
      ? `${cidr.error}${portHint(entry)}`
      : `denyOut takes only IP addresses and CIDRs, not names${portHint(entry)}`;
    return { at, entry, message: `invalid denied CIDR ${entry} (${at}): ${why}` };
  }
  // The unspecified network is meaningful only as "everything", spelt 0.0.0.0/0 or ::/0. Other
  // spellings that canonicalise to a /0 (::ffff:0:0/96, 1.2.3.4/0) would deny all IPv4 and leave
  // IPv6 open, unlike ALL_TRAFFIC: refuse them rather than guess.
  if (isUnspecifiedNetwork(cidr.value) && entry !== ALL_TRAFFIC && entry !== '::/0') {
    return {
      at,
      entry,
      message: `invalid denied CIDR ${entry} (${at}): an unspecified address is only valid as 0.0.0.0/0 (all traffic) or ::/0 (all IPv6)`,
    };
  }
  return { kind: 'address', list: 'denyOut', index, entry, cidr: cidr.value };
}

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
  const parsed = parseAllowEntry(entry, index);
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
    const rule = parseAllowEntry(written, index);
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
        message: `unknown field ${JSON.stringify(key)}; a network configuration has allowOut, denyOut, allow_internet_access, rules and description`,
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
        : parseAllowEntry(entry, index),
    errors,
  );
  const denyOut = readList(config, 'denyOut', maxEntries, parseDenyEntry, errors);
  const transforms = parseTransforms(config.rules, errors);
  const denyAll = access === false || denyOut.some((rule) => rule.entry === ALL_TRAFFIC);
  const firstName = allowOut.find((rule) => rule.kind !== 'address');
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
    },
  };
}
