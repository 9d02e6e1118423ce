/**
 * Learning a policy from what a sandbox did: the smallest allowOut (names before addresses) that
 * allows every destination it was seen to reach or try, under a deny of everything else. Pure:
 * the caller reads the flow records. Coverage is judged by the one `decide`, never by matching
 * of its own: a preset or a wildcard stands for a set of names only where the compiled entry
 * allows every one of them.
 */
import { getDomain } from 'tldts';
import { parseIP } from './address.js';
import { type CanonicalName, canonicalName } from './host.js';
import { compilePolicy, decide, type Policy } from './policy.js';
import { PRESET_PREFIX, type PresetTable } from './preset-types.js';
import { ALL_TRAFFIC, parseNetworkConfig } from './rules.js';

/** One destination a sandbox reached or tried, as its flow records show it. */
export interface ObservedDestination {
  /** The name asked for, or, for an address allowed as learned, the name it was learned for. */
  readonly name: string | null;
  readonly address: string | null;
  /** The port connected to; null for a DNS question (it has none). */
  readonly port: number | null;
  /** How many flow records show it. */
  readonly flows: number;
}

export interface SuggestedEntry {
  /** The allowOut entry: `preset:NAME`, `*.domain`, a name or an address. */
  readonly entry: string;
  /** The flow records it covers. */
  readonly flows: number;
  /** The observed names (or addresses) it stands for, sorted. */
  readonly covers: readonly string[];
}

export interface Suggestion {
  readonly allowOut: readonly SuggestedEntry[];
  /** Always `0.0.0.0/0`: what was not seen is denied (all IPv4 and IPv6). */
  readonly denyOut: readonly string[];
}

/** Names under one registrable domain that make a `*.domain` wildcard worth its breadth. */
export const WILDCARD_SIBLINGS = 3;
/** Observed names a preset must cover to be used instead of them. */
export const PRESET_MIN_NAMES = 2;
/** Ports seen for an entry that it names one by one (`name:22`, `name:443`); more: every port. */
export const MAX_PORTS_PER_ENTRY = 4;

/** Flows by port (null: questions with no port, DNS). */
type Usage = Map<number | null, number>;

const use = (usage: Usage | undefined, port: number | null, flows: number): Usage => {
  const map = usage ?? new Map<number | null, number>();
  map.set(port, (map.get(port) ?? 0) + flows);
  return map;
};

const total = (usage: Usage) => [...usage.values()].reduce((sum, n) => sum + n, 0);

/**
 * The entries for `base` over what was seen: one per port where it connected to at most
 * MAX_PORTS_PER_ENTRY ports (its port-less DNS questions counted with the first), else one for
 * every port. `[IPv6]:port` in brackets.
 */
function scoped(base: string, usage: Usage, covers: readonly string[]): SuggestedEntry[] {
  const ports = [...usage.keys()].filter((port) => port !== null).sort((a, b) => a - b);
  if (ports.length === 0 || ports.length > MAX_PORTS_PER_ENTRY)
    return [{ entry: base, flows: total(usage), covers }];
  const host = base.includes(':') ? `[${base}]` : base;
  return ports.map((port, i) => ({
    entry: `${host}:${port}`,
    flows: usage.get(port)! + (i === 0 ? (usage.get(null) ?? 0) : 0),
    covers,
  }));
}

const TLD_OPTIONS = { allowPrivateDomains: true } as const;

/** A policy of `allowOut` alone under a deny of everything else; entries must be valid. */
function allowOnly(allowOut: readonly string[], presets?: PresetTable): Policy {
  const parsed = parseNetworkConfig({ allowOut, denyOut: [ALL_TRAFFIC] }, { presets });
  if (!parsed.ok) throw new Error(parsed.errors.map((e) => e.message).join('; '));
  return compilePolicy(parsed.value);
}

const allows = (policy: Policy, name: CanonicalName) =>
  decide(policy, { host: name }).verdict === 'allow';

/**
 * The suggestion for what was observed: presets that cover at least PRESET_MIN_NAMES of the
 * names, then `*.domain` for a registrable domain (Public Suffix List, private section
 * included, so never a public suffix) with at least WILDCARD_SIBLINGS names below it, then the
 * other names, then addresses seen with no name; each but a preset scoped to the ports it was
 * seen on (MAX_PORTS_PER_ENTRY at most). Each entry says how many flows it covers.
 */
export function suggestPolicy(
  observed: readonly ObservedDestination[],
  presets: PresetTable = new Map(),
): Suggestion {
  const names = new Map<CanonicalName, Usage>();
  const addresses = new Map<string, Usage>();
  const named = new Set<string>();
  for (const { name, address, port, flows } of observed) {
    const canonical = name === null ? undefined : canonicalName(name);
    if (canonical?.ok) {
      names.set(canonical.value, use(names.get(canonical.value), port, flows));
      if (address !== null) named.add(address);
    } else if (address !== null) {
      const ip = parseIP(address);
      if (ip.ok) addresses.set(ip.value.text, use(addresses.get(ip.value.text), port, flows));
    }
  }
  const entries: SuggestedEntry[] = [];
  /** `base` stands for `covered`; with `withPorts`, scoped to the ports they were seen on. */
  const take = (base: string, covered: readonly CanonicalName[], withPorts: boolean) => {
    const usage: Usage = new Map();
    for (const name of covered)
      for (const [port, flows] of names.get(name)!) use(usage, withPorts ? port : null, flows);
    entries.push(...scoped(base, usage, [...covered].sort()));
    for (const name of covered) names.delete(name);
  };

  // Presets, the one covering most names first; ties by name, so the output is stable.
  const byPreset = [...presets.keys()]
    .map((preset) => {
      const policy = allowOnly([`${PRESET_PREFIX}${preset}`], presets);
      return { preset, policy };
    })
    .sort((a, b) => a.preset.localeCompare(b.preset));
  for (;;) {
    const best = byPreset
      .map(({ preset, policy }) => ({
        preset,
        covered: [...names.keys()].filter((name) => allows(policy, name)),
      }))
      .filter(({ covered }) => covered.length >= PRESET_MIN_NAMES)
      .sort((a, b) => b.covered.length - a.covered.length)[0];
    if (best === undefined) break;
    // A preset's entries carry their own ports (or none): it is used as it is.
    take(`${PRESET_PREFIX}${best.preset}`, best.covered, false);
  }

  // Wildcards: names strictly below one registrable domain.
  const below = new Map<string, CanonicalName[]>();
  for (const name of names.keys()) {
    const domain = getDomain(name, TLD_OPTIONS);
    if (domain === null || domain === name) continue;
    // Pushed, not copied: a sandbox can make any number of names under one domain.
    const siblings = below.get(domain);
    if (siblings === undefined) below.set(domain, [name]);
    else siblings.push(name);
  }
  for (const [domain, siblings] of [...below].sort(([a], [b]) => a.localeCompare(b))) {
    if (siblings.length < WILDCARD_SIBLINGS) continue;
    const wildcard = `*.${domain}`;
    const policy = allowOnly([wildcard]);
    take(
      wildcard,
      siblings.filter((name) => allows(policy, name)),
      true,
    );
  }

  for (const name of [...names.keys()].sort()) take(name, [name], true);
  for (const [address, usage] of [...addresses].sort(([a], [b]) => a.localeCompare(b))) {
    if (named.has(address)) continue;
    entries.push(...scoped(address, usage, [address]));
  }
  return { allowOut: entries, denyOut: [ALL_TRAFFIC] };
}
