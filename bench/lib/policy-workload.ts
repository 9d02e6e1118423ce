/**
 * Deterministic policy workloads for benchmarks: a network configuration of a given size with a
 * realistic mix of rules, and destinations that hit every kind of rule as well as missing them.
 * Everything comes from a seeded PRNG, so every run and machine sees the same inputs.
 */
import {
  ALL_TRAFFIC,
  DEFAULT_INTERNAL_DENY,
  type Destination,
  type InternalRange,
  type NetworkRules,
  parseDestination,
  parseNetworkConfig,
} from '../../src/policy/index.js';
import { Prng } from './prng.js';

/** Destinations per set; a power of two so that a cursor can wrap with a mask. */
export const DESTINATIONS = 4096;
export const PORT = 443;

/** Words separated by white space. */
const words = (text: string): string[] => text.trim().split(/\s+/);

const TLDS: ReadonlyArray<readonly [string, number]> = [
  ['com', 40],
  ['net', 10],
  ['org', 8],
  ['io', 8],
  ['dev', 3],
  ['ai', 3],
  ['co', 3],
  ['app', 2],
  ['cloud', 2],
  ['sh', 1],
  ['de', 3],
  ['fr', 2],
  ['nl', 2],
  ['eu', 1],
  ['jp', 1],
  ['ca', 1],
  ['ch', 1],
  ['se', 1],
  ['co.uk', 2],
  ['com.au', 1],
  ['co.jp', 1],
  ['com.br', 1],
];

const SECOND_LEVEL = words(`
  github githubusercontent google googleapis gstatic amazonaws cloudfront azure microsoft
  windows apple icloud cloudflare fastly akamai npmjs yarnpkg pypi pythonhosted docker quay
  rubygems crates golang maven gradle jetbrains openai anthropic huggingface slack stripe sentry
  datadoghq twilio sendgrid mozilla debian ubuntu fedoraproject alpinelinux archlinux kernel
  gitlab bitbucket atlassian heroku vercel netlify digitalocean linode hetzner ovh oracle ibm
  salesforce shopify wikipedia wikimedia stackoverflow reddit twitter facebook youtube example
  acme contoso fabrikam initech globex
`);

const SUB_LABELS = words(`
  www api cdn static assets img media files download downloads registry auth login sso id
  accounts mail smtp app apps console dashboard docs blog status uploads storage s3 objects pkg
  packages repo mirror edge gateway ws events metrics logs telemetry eu us ap eu-west-1
  us-east-1 us-west-2 ap-southeast-1 prod staging dev v1 v2 data search raw objects-origin ghcr
  proxy
`);

const SYLLABLES = ['ka', 'lo', 'mi', 'ne', 'ru', 'ta', 'vo', 'zen', 'bri', 'cor', 'dex', 'fin'];
const ALNUM = 'abcdefghijklmnopqrstuvwxyz0123456789';

/** How many well-known registrable domains rules and destinations cluster around. */
export const POPULAR_BASES = 300;

class NameGenerator {
  readonly bases: string[];

  constructor(private readonly prng: Prng) {
    const seen = new Set<string>();
    // A bounded loop: SECOND_LEVEL x TLDS has far more than POPULAR_BASES combinations.
    for (let i = 0; i < POPULAR_BASES * 20 && seen.size < POPULAR_BASES; i++) {
      seen.add(`${prng.pick(SECOND_LEVEL)}.${prng.weighted(TLDS)}`);
    }
    this.bases = [...seen];
  }

  /** A subdomain label: a common word, or a hash-like label as CDNs and tenants use. */
  label(): string {
    const { prng } = this;
    if (prng.chance(0.7)) return prng.pick(SUB_LABELS);
    let text = ALNUM[prng.int(26)]!;
    const length = prng.range(3, 11);
    for (let i = 0; i < length; i++) text += ALNUM[prng.int(ALNUM.length)]!;
    return text;
  }

  /** A registrable domain: mostly one of the popular bases, sometimes a fresh one. */
  base(): string {
    const { prng } = this;
    if (prng.chance(0.7)) return prng.pick(this.bases);
    let word = '';
    const syllables = prng.range(2, 4);
    for (let i = 0; i < syllables; i++) word += prng.pick(SYLLABLES);
    if (prng.chance(0.3)) word += String(prng.int(100));
    return `${word}.${prng.weighted(TLDS)}`;
  }

  /** A name of 2-4 labels (a little more under two-label suffixes such as co.uk). */
  name(): string {
    const depth = this.prng.weighted([
      [0, 25],
      [1, 50],
      [2, 25],
    ] as const);
    let name = this.base();
    for (let i = 0; i < depth; i++) name = `${this.label()}.${name}`;
    return name;
  }

  /** The domain below which a wildcard rule matches: mostly a registrable domain. */
  wildcardDomain(): string {
    return this.prng.chance(0.6) ? this.base() : `${this.label()}.${this.base()}`;
  }
}

interface Prefix4 {
  readonly net: number;
  readonly length: number;
}

interface Prefix6 {
  readonly words: readonly number[];
  readonly length: number;
}

const mask4 = (length: number): number => (length === 0 ? 0 : (~0 << (32 - length)) >>> 0);

function maskWords6(words: readonly number[], length: number): number[] {
  return words.map((w, i) => {
    const keep = length - i * 32;
    return keep >= 32 ? w >>> 0 : keep <= 0 ? 0 : (w & (~0 << (32 - keep))) >>> 0;
  });
}

export const formatIPv4 = (a: number): string =>
  `${a >>> 24}.${(a >>> 16) & 255}.${(a >>> 8) & 255}.${a & 255}`;

/** IPv6 text with trailing zero groups compressed ("2a01:4f8::"), as people write prefixes. */
export function formatIPv6(words: readonly number[]): string {
  const groups: number[] = [];
  for (const w of words) groups.push(w >>> 16, w & 0xffff);
  let last = 7;
  while (last >= 0 && groups[last] === 0) last--;
  const hex = (g: number[]) => g.map((x) => x.toString(16)).join(':');
  return last <= 5 ? `${hex(groups.slice(0, last + 1))}::` : hex(groups);
}

const INTERNAL4 = DEFAULT_INTERNAL_DENY.filter((range) => range.cidr.version === 4);

/** True when the prefix overlaps any IPv4 range of the internal deny list. */
function overlapsInternal4(net: number, length: number): boolean {
  for (const range of INTERNAL4) {
    const common = Math.min(length, range.cidr.prefixLength);
    if (((net ^ range.cidr.words[0]!) & mask4(common)) === 0) return true;
  }
  return false;
}

/** A public IPv4 prefix (outside the internal deny list) with a realistic length mix. */
function publicPrefix4(prng: Prng): Prefix4 {
  const length = prng.weighted([
    [8, 0.3],
    [prng.range(11, 16), 10],
    [prng.range(17, 23), 25],
    [24, 30],
    [prng.range(25, 31), 5],
    [32, 30],
  ] as const);
  // Bounded retries; about a fifth of the space is internal, so this ends within a few tries.
  for (let attempt = 0; attempt < 1000; attempt++) {
    const net = (prng.uint32() & mask4(length)) >>> 0;
    if (!overlapsInternal4(net, length)) return { net, length };
  }
  throw new Error('could not generate a public IPv4 prefix');
}

/** Regional-registry space (2400::/12 ... 2c00::/12): clear of the internal deny list. */
const IPV6_REGIONS = [0x2400, 0x2600, 0x2800, 0x2a00, 0x2c00];

function publicAddress6(prng: Prng): number[] {
  const top = prng.pick(IPV6_REGIONS) + prng.int(0x100);
  return [((top << 16) | prng.int(0x10000)) >>> 0, prng.uint32(), prng.uint32(), prng.uint32()];
}

function publicPrefix6(prng: Prng): Prefix6 {
  const length = prng.weighted([
    [32, 20],
    [48, 40],
    [56, 10],
    [64, 20],
    [128, 10],
  ] as const);
  return { words: maskWords6(publicAddress6(prng), length), length };
}

/** A random address inside a prefix. */
const inside4 = (prng: Prng, p: Prefix4): number =>
  (p.net | (prng.uint32() & ~mask4(p.length))) >>> 0;

const inside6 = (prng: Prng, p: Prefix6): number[] => {
  const random = [prng.uint32(), prng.uint32(), prng.uint32(), prng.uint32()];
  const host = maskWords6(random, p.length).map((w, i) => (random[i]! ^ w) >>> 0);
  return p.words.map((w, i) => (w | host[i]!) >>> 0);
};

function insideInternal(prng: Prng, range: InternalRange): string {
  const { cidr } = range;
  if (cidr.version === 4)
    return formatIPv4(inside4(prng, { net: cidr.words[0]!, length: cidr.prefixLength }));
  let words = inside6(prng, { words: cidr.words, length: cidr.prefixLength });
  // ::ffff:0:0/96 would be read as IPv4; keep ::/96 samples out of the mapped block.
  if (words[0] === 0 && words[1] === 0 && words[2] === 0xffff) words = [0, 0, 0, words[3]!];
  return formatIPv6(words);
}

export interface Workload {
  readonly size: number;
  readonly config: { allowOut: string[]; denyOut: string[] };
  /** IP destinations as written (`a.b.c.d:443`, `[v6]:443`). */
  readonly rawIps: string[];
  /** Host-name destinations as written (`name:443`). */
  readonly rawHosts: string[];
}

/**
 * A network configuration with `size` entries in all: denyOut is a tenth of them (0.0.0.0/0
 * and public CIDRs), allowOut the rest: 40% IPv4 CIDRs, 10% IPv6 CIDRs, 30% names and 20%
 * `*.` wildcards. Destinations mix hits on every kind of rule with misses.
 */
export function generateWorkload(size: number): Workload {
  const prng = new Prng(0x6d6f6174 ^ size);
  const names = new NameGenerator(prng);
  const denyCount = Math.max(2, Math.round(size * 0.1));
  const allowCount = size - denyCount;

  const allow4: Prefix4[] = [];
  const allow6: Prefix6[] = [];
  const exact: string[] = [];
  const wildcards: string[] = [];
  const deny4: Prefix4[] = [];
  const deny6: Prefix6[] = [];
  const allowOut: string[] = [];
  for (let i = 0; i < allowCount; i++) {
    const kind = prng.weighted([
      ['v4', 40],
      ['v6', 10],
      ['name', 30],
      ['wildcard', 20],
    ] as const);
    if (kind === 'v4') {
      const p = publicPrefix4(prng);
      allow4.push(p);
      allowOut.push(p.length === 32 ? formatIPv4(p.net) : `${formatIPv4(p.net)}/${p.length}`);
    } else if (kind === 'v6') {
      const p = publicPrefix6(prng);
      allow6.push(p);
      allowOut.push(`${formatIPv6(p.words)}/${p.length}`);
    } else if (kind === 'name') {
      const name = names.name();
      exact.push(name);
      allowOut.push(name);
    } else {
      const domain = names.wildcardDomain();
      wildcards.push(domain);
      allowOut.push(`*.${domain}`);
    }
  }
  const denyOut: string[] = [ALL_TRAFFIC];
  for (let i = 1; i < denyCount; i++) {
    if (prng.chance(0.8)) {
      const p = publicPrefix4(prng);
      deny4.push(p);
      denyOut.push(`${formatIPv4(p.net)}/${p.length}`);
    } else {
      const p = publicPrefix6(prng);
      deny6.push(p);
      denyOut.push(`${formatIPv6(p.words)}/${p.length}`);
    }
  }

  const v4 = (address: number) => `${formatIPv4(address)}:${PORT}`;
  const v6 = (words: readonly number[]) => `[${formatIPv6(words)}]:${PORT}`;
  const rawIps: string[] = [];
  for (let i = 0; i < DESTINATIONS; i++) {
    const kind = prng.weighted([
      ['allow4', 30],
      ['allow6', 5],
      ['deny', 15],
      ['internal', 10],
      ['public4', 30],
      ['public6', 10],
    ] as const);
    if (kind === 'allow4' && allow4.length > 0) rawIps.push(v4(inside4(prng, prng.pick(allow4))));
    else if (kind === 'allow6' && allow6.length > 0)
      rawIps.push(v6(inside6(prng, prng.pick(allow6))));
    else if (kind === 'deny' && deny4.length + deny6.length > 0) {
      const pick = prng.int(deny4.length + deny6.length);
      rawIps.push(
        pick < deny4.length
          ? v4(inside4(prng, deny4[pick]!))
          : v6(inside6(prng, deny6[pick - deny4.length]!)),
      );
    } else if (kind === 'internal') {
      const range = prng.pick(DEFAULT_INTERNAL_DENY);
      const text = insideInternal(prng, range);
      rawIps.push(range.cidr.version === 4 ? `${text}:${PORT}` : `[${text}]:${PORT}`);
    } else if (kind === 'public6' || kind === 'allow6') rawIps.push(v6(publicAddress6(prng)));
    else rawIps.push(v4(inside4(prng, publicPrefix4(prng))));
  }

  const rawHosts: string[] = [];
  for (let i = 0; i < DESTINATIONS; i++) {
    const kind = prng.weighted([
      ['exact', 35],
      ['wildcard', 25],
      ['miss', 40],
    ] as const);
    let host: string;
    if (kind === 'exact' && exact.length > 0) host = prng.pick(exact);
    else if (kind === 'wildcard' && wildcards.length > 0) {
      host = prng.pick(wildcards);
      const depth = prng.chance(0.7) ? 1 : 2;
      for (let d = 0; d < depth; d++) host = `${names.label()}.${host}`;
    } else host = names.name();
    rawHosts.push(`${host}:${PORT}`);
  }
  return { size, config: { allowOut, denyOut }, rawIps, rawHosts };
}

/**
 * The same configuration with ports on a quarter of its entries (Moat's extension): every
 * fourth allowOut entry on the destinations' port, the next on `8000-8100`; every third denyOut
 * entry but ALL_TRAFFIC on 25. The destinations stay as they are (port 443).
 */
export function withPorts(config: Workload['config']): Workload['config'] {
  const port = (entry: string, spec: string) =>
    entry.includes(':') && !entry.includes('.') ? `[${entry}]:${spec}` : `${entry}:${spec}`;
  return {
    allowOut: config.allowOut.map((entry, i) =>
      i % 4 === 0 ? port(entry, String(PORT)) : i % 4 === 1 ? port(entry, '8000-8100') : entry,
    ),
    denyOut: config.denyOut.map((entry, i) => (i > 0 && i % 3 === 0 ? port(entry, '25') : entry)),
  };
}

export function parseDestinations(raw: readonly string[]): Destination[] {
  return raw.map((text) => {
    const parsed = parseDestination(text);
    if (!parsed.ok) throw new Error(`generated destination ${text}: ${parsed.error}`);
    return parsed.value;
  });
}

export function parseRules(config: Workload['config'], maxEntries: number): NetworkRules {
  const parsed = parseNetworkConfig(config, { maxEntries });
  if (!parsed.ok) {
    const first = parsed.errors.slice(0, 3).map((e) => `${e.at}: ${e.message}`);
    throw new Error(`generated configuration rejected: ${first.join('; ')}`);
  }
  return parsed.value;
}
