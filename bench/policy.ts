/**
 * `npm run bench:policy`: the policy engine against a naive linear matcher over the same rules,
 * measured in the same run. For 10, 1,000, 10,000 and 100,000 rules it reports IP and
 * host-name decisions per second on pre-parsed (canonical) destinations, parse+decide for raw
 * host strings, compile time, and heap per compiled policy, then checks the targets:
 *
 * - at 100,000 rules: >= 10,000,000 IP decisions/s on one core, with ports on a quarter of the
 *   rules and without, >= 1,000,000 host-name decisions/s, and
 *   parse+compile under 500 ms;
 * - at 10,000 rules: at least 100x the naive matcher (IP and host names).
 *
 * Inputs are generated from a seeded PRNG, so every run sees the same rules and destinations.
 * Nothing here touches the network. Options: `--help`.
 */
import { cpus, loadavg } from 'node:os';
import {
  compilePolicy,
  type Decision,
  type Destination,
  decide,
  type NetworkRules,
  type Policy,
  parseDestination,
} from '../src/policy/index.js';
import { fullGc, gcOnce, reexecWithExposedGc, retainedBytesPer } from './lib/gc.js';
import { NaiveMatcher } from './lib/naive-matcher.js';
import { flag, type OptionValues, readOptions, refuse, text, whole } from './lib/options.js';
import {
  DESTINATIONS,
  generateWorkload,
  POPULAR_BASES,
  PORT,
  parseDestinations,
  parseRules,
  withPorts,
  type Workload,
} from './lib/policy-workload.js';
import {
  formatBytes,
  formatInt,
  formatMs,
  formatRatio,
  formatSi,
  markdownTable,
} from './lib/table.js';
import {
  measureRate,
  measureRates,
  medianTimeMs,
  type Rate,
  sinkChecksum,
  withCpuShare,
} from './lib/timing.js';

const DEFAULT_SIZES = [10, 1_000, 10_000, 100_000];
const MASK = DESTINATIONS - 1;

const TARGETS = {
  ipPerSecondAt100k: 10_000_000,
  hostPerSecondAt100k: 1_000_000,
  compileMsAt100k: 500,
  naiveRatioAt10k: 100,
};

// ---------------------------------------------------------------------------------------------
// Measurement

interface Prepared {
  readonly workload: Workload;
  readonly rules: NetworkRules;
  readonly policy: Policy;
  /** The same rules with ports on a quarter of the entries (see withPorts). */
  readonly portedPolicy: Policy;
  readonly naive: NaiveMatcher;
  /** Pre-parsed with parseDestination. */
  readonly ips: Destination[];
  readonly hosts: Destination[];
  /** The same destinations copied into object literals of one shape per kind (diagnostic). */
  readonly ipsOneShape: Destination[];
  readonly hostsOneShape: Destination[];
}

interface Row {
  readonly size: number;
  readonly ip: Rate;
  readonly ipNaive: Rate;
  readonly host: Rate;
  readonly hostNaive: Rate;
  readonly parseHost: Rate;
  readonly parseHostNaive: Rate;
  readonly ipOneShape: Rate;
  readonly hostOneShape: Rate;
  readonly ipPorted: Rate;
  readonly hostPorted: Rate;
  /** CPU time per wall time while decisions were measured (1 = a whole core). */
  readonly cpuShare: number;
  /** The same while compile times were measured (GC threads count too, so it may exceed 1). */
  readonly compileCpuShare: number;
  readonly parseMs: number;
  readonly compileMs: number;
  readonly parseCompileMs: number;
  readonly naiveBuildMs: number;
  readonly indexBytes: number;
  readonly rulesBytes: number;
  readonly naiveBytes: number;
}

const verdictBit = (d: Decision): number => (d.verdict === 'allow' ? 1 : 0);

// One batch function per kind of cell; each keeps its own cursor into the destination set.
function decideBatch(policy: Policy, destinations: readonly Destination[]) {
  let cursor = 0;
  return (count: number): number => {
    let acc = 0;
    for (let k = 0; k < count; k++) {
      acc += verdictBit(decide(policy, destinations[cursor]!));
      cursor = (cursor + 1) & MASK;
    }
    return acc;
  };
}

function naiveBatch(naive: NaiveMatcher, destinations: readonly Destination[]) {
  let cursor = 0;
  return (count: number): number => {
    let acc = 0;
    for (let k = 0; k < count; k++) {
      acc += verdictBit(naive.decide(destinations[cursor]!));
      cursor = (cursor + 1) & MASK;
    }
    return acc;
  };
}

function parseDecideBatch(policy: Policy, raw: readonly string[]) {
  let cursor = 0;
  return (count: number): number => {
    let acc = 0;
    for (let k = 0; k < count; k++) {
      const parsed = parseDestination(raw[cursor]!);
      acc += parsed.ok ? verdictBit(decide(policy, parsed.value)) : 2;
      cursor = (cursor + 1) & MASK;
    }
    return acc;
  };
}

function parseNaiveBatch(naive: NaiveMatcher, raw: readonly string[]) {
  let cursor = 0;
  return (count: number): number => {
    let acc = 0;
    for (let k = 0; k < count; k++) {
      const parsed = parseDestination(raw[cursor]!);
      acc += parsed.ok ? verdictBit(naive.decide(parsed.value)) : 2;
      cursor = (cursor + 1) & MASK;
    }
    return acc;
  };
}

/**
 * Both matchers must give the same verdict, list and rule for every destination (checked on a
 * bounded sample for large rule sets, where the naive matcher is slow).
 */
function crossCheck(p: Prepared): number {
  const limit = p.workload.size >= 100_000 ? 256 : p.workload.size >= 10_000 ? 1024 : DESTINATIONS;
  let checked = 0;
  for (const set of [p.ips, p.hosts]) {
    for (let i = 0; i < limit; i++) {
      const destination = set[i]!;
      const a = decide(p.policy, destination);
      const b = p.naive.decide(destination);
      if (a.verdict !== b.verdict || a.list !== b.list || a.rule !== b.rule) {
        const shown = JSON.stringify({ ...destination, ip: destination.ip?.text });
        throw new Error(
          `matchers disagree at ${p.workload.size} rules on ${shown}: ` +
            `moat ${a.verdict}/${a.list}/${a.rule}, naive ${b.verdict}/${b.list}/${b.rule}`,
        );
      }
      checked++;
    }
  }
  return checked;
}

/** A copy of a destination as a plain object literal: `{ip, port}` or `{host, port}`. */
const literalCopy = (d: Destination): Destination =>
  d.ip !== undefined ? { ip: d.ip, port: d.port } : { host: d.host, port: d.port };

function prepare(size: number): Prepared {
  const workload = generateWorkload(size);
  const rules = parseRules(workload.config, size);
  const ips = parseDestinations(workload.rawIps);
  const hosts = parseDestinations(workload.rawHosts);
  return {
    workload,
    rules,
    policy: compilePolicy(rules),
    portedPolicy: compilePolicy(parseRules(withPorts(workload.config), size)),
    naive: new NaiveMatcher(rules),
    ips,
    hosts,
    ipsOneShape: ips.map(literalCopy),
    hostsOneShape: hosts.map(literalCopy),
  };
}

function measureSize(p: Prepared, budgetMs: number): Row {
  const { size } = p.workload;
  let phase = process.hrtime.bigint();
  const lap = (name: string) => {
    const now = process.hrtime.bigint();
    process.stderr.write(`  ${name} ${(Number(now - phase) / 1e9).toFixed(1)} s\n`);
    phase = now;
  };
  const fast = { budgetMs, warmupMs: 100, maxOps: 20_000_000 };
  // The naive matcher gets the same time but a count bound that matters only when it is fast.
  const slow = { budgetMs, warmupMs: 100, maxOps: 2_000_000 };
  // Cells compared with each other are measured together, their trials taking turns.
  const { result: rates, cpuShare } = withCpuShare(() => {
    const [ip, ipNaive, ipOneShape, ipPorted] = measureRates([
      { batch: decideBatch(p.policy, p.ips), options: fast },
      { batch: naiveBatch(p.naive, p.ips), options: slow },
      { batch: decideBatch(p.policy, p.ipsOneShape), options: fast },
      { batch: decideBatch(p.portedPolicy, p.ips), options: fast },
    ]);
    const [host, hostNaive, hostOneShape, hostPorted] = measureRates([
      { batch: decideBatch(p.policy, p.hosts), options: fast },
      { batch: naiveBatch(p.naive, p.hosts), options: slow },
      { batch: decideBatch(p.policy, p.hostsOneShape), options: fast },
      { batch: decideBatch(p.portedPolicy, p.hosts), options: fast },
    ]);
    const [parseHost, parseHostNaive] = measureRates([
      { batch: parseDecideBatch(p.policy, p.workload.rawHosts), options: fast },
      { batch: parseNaiveBatch(p.naive, p.workload.rawHosts), options: slow },
    ]);
    return {
      ip,
      ipNaive,
      ipOneShape,
      ipPorted,
      host,
      hostNaive,
      hostOneShape,
      hostPorted,
      parseHost,
      parseHostNaive,
    };
  });

  lap('decisions');
  // For large rule sets a GC before each run, so that one run does not pay for collecting the
  // garbage of the previous one (small ones make too little garbage to matter).
  const before = size >= 10_000 ? gcOnce : undefined;
  const runs = { minRuns: 5, maxRuns: 15, budgetMs: 1000, before };
  const { config } = p.workload;
  const compiled = withCpuShare(() => ({
    parseMs: medianTimeMs(() => parseRules(config, size), runs).medianMs,
    compileMs: medianTimeMs(() => compilePolicy(p.rules), runs).medianMs,
    parseCompileMs: medianTimeMs(() => compilePolicy(parseRules(config, size)), runs).medianMs,
    naiveBuildMs: medianTimeMs(() => new NaiveMatcher(p.rules), runs).medianMs,
  }));

  lap('compile');
  // Enough copies that the per-copy figure is well above GC noise, few enough to stay small.
  const copies = Math.min(1000, Math.max(3, Math.round(200_000 / size)));
  const indexBytes = retainedBytesPer(() => compilePolicy(p.rules), copies);
  const rulesBytes = retainedBytesPer(() => parseRules(config, size), copies);
  const naiveBytes = retainedBytesPer(() => new NaiveMatcher(p.rules), copies);
  lap('heap');
  return {
    size,
    ...rates,
    cpuShare,
    // Too short a phase to judge (small rule sets) counts as a whole core.
    compileCpuShare: compiled.wallMs >= 250 ? compiled.cpuShare : 1,
    ...compiled.result,
    indexBytes,
    rulesBytes,
    naiveBytes,
  };
}

/**
 * Runs every kind of cell briefly on every policy before anything is measured, so that the
 * JIT has seen all shapes (IP and host destinations, every policy size) and the first cell
 * measured is not flattered by monomorphic code that later cells would deoptimise.
 */
function warmUp(prepared: readonly Prepared[]): void {
  const options = { budgetMs: 30, warmupMs: 20, maxOps: 200_000 };
  for (const p of prepared) {
    measureRate(decideBatch(p.policy, p.ips), options);
    measureRate(decideBatch(p.policy, p.hosts), options);
    measureRate(decideBatch(p.policy, p.ipsOneShape), options);
    measureRate(decideBatch(p.policy, p.hostsOneShape), options);
    measureRate(parseDecideBatch(p.policy, p.workload.rawHosts), options);
    measureRate(parseDecideBatch(p.policy, p.workload.rawIps), options);
    measureRate(naiveBatch(p.naive, p.ips), { ...options, maxOps: 2_000 });
    measureRate(naiveBatch(p.naive, p.hosts), { ...options, maxOps: 2_000 });
  }
}

// ---------------------------------------------------------------------------------------------
// Report

const ratio = (a: Rate, b: Rate) => formatRatio(a.perSecond / b.perSecond);

function decisionsTable(rows: readonly Row[]): string {
  return markdownTable(
    [
      'rules',
      'IP/s moat',
      'IP/s naive',
      'ratio',
      'host/s moat',
      'host/s naive',
      'ratio',
      'parse+decide host/s moat',
      'naive',
      'ratio',
      'parse+compile ms',
      'heap/policy',
    ],
    rows.map((r) => [
      formatInt(r.size),
      formatSi(r.ip.perSecond),
      formatSi(r.ipNaive.perSecond),
      ratio(r.ip, r.ipNaive),
      formatSi(r.host.perSecond),
      formatSi(r.hostNaive.perSecond),
      ratio(r.host, r.hostNaive),
      formatSi(r.parseHost.perSecond),
      formatSi(r.parseHostNaive.perSecond),
      ratio(r.parseHost, r.parseHostNaive),
      formatMs(r.parseCompileMs),
      formatBytes(r.rulesBytes + r.indexBytes),
    ]),
  );
}

function compileTable(rows: readonly Row[]): string {
  return markdownTable(
    [
      'rules',
      'parse ms',
      'compile ms moat',
      'build ms naive',
      'ratio',
      'index heap moat',
      'naive',
      'ratio',
      'parsed rules heap',
    ],
    rows.map((r) => [
      formatInt(r.size),
      formatMs(r.parseMs),
      formatMs(r.compileMs),
      formatMs(r.naiveBuildMs),
      formatRatio(r.compileMs / r.naiveBuildMs),
      formatBytes(r.indexBytes),
      formatBytes(r.naiveBytes),
      formatRatio(r.indexBytes / r.naiveBytes),
      formatBytes(r.rulesBytes),
    ]),
  );
}

function shapeTable(rows: readonly Row[]): string {
  return markdownTable(
    [
      'rules',
      'IP/s parseDestination objects',
      'IP/s literal objects',
      'ratio',
      'host/s parseDestination objects',
      'host/s literal objects',
      'ratio',
    ],
    rows.map((r) => [
      formatInt(r.size),
      formatSi(r.ip.perSecond),
      formatSi(r.ipOneShape.perSecond),
      ratio(r.ipOneShape, r.ip),
      formatSi(r.host.perSecond),
      formatSi(r.hostOneShape.perSecond),
      ratio(r.hostOneShape, r.host),
    ]),
  );
}

function portsTable(rows: readonly Row[]): string {
  return markdownTable(
    ['rules', 'IP/s', 'IP/s with ports', 'ratio', 'host/s', 'host/s with ports', 'ratio'],
    rows.map((r) => [
      formatInt(r.size),
      formatSi(r.ip.perSecond),
      formatSi(r.ipPorted.perSecond),
      ratio(r.ipPorted, r.ip),
      formatSi(r.host.perSecond),
      formatSi(r.hostPorted.perSecond),
      ratio(r.hostPorted, r.host),
    ]),
  );
}

interface Verdict {
  readonly name: string;
  readonly measured: string;
  readonly pass: boolean | undefined;
}

function checkTargets(rows: readonly Row[]): Verdict[] {
  const at = (size: number) => rows.find((r) => r.size === size);
  const r100k = at(100_000);
  const r10k = at(10_000);
  const rate = (r: Rate | undefined) =>
    r ? `${formatInt(r.perSecond)}/s (trials ${formatSi(r.min)}-${formatSi(r.max)})` : 'not run';
  const min = TARGETS.naiveRatioAt10k;
  return [
    {
      name: `IP decisions/s at 100,000 rules >= ${formatInt(TARGETS.ipPerSecondAt100k)}`,
      measured: rate(r100k?.ip),
      pass: r100k && r100k.ip.perSecond >= TARGETS.ipPerSecondAt100k,
    },
    {
      name: `IP decisions/s at 100,000 rules with ports >= ${formatInt(TARGETS.ipPerSecondAt100k)}`,
      measured: rate(r100k?.ipPorted),
      pass: r100k && r100k.ipPorted.perSecond >= TARGETS.ipPerSecondAt100k,
    },
    {
      name: `host-name decisions/s at 100,000 rules >= ${formatInt(TARGETS.hostPerSecondAt100k)}`,
      measured: rate(r100k?.host),
      pass: r100k && r100k.host.perSecond >= TARGETS.hostPerSecondAt100k,
    },
    {
      name: `parse+compile at 100,000 rules < ${TARGETS.compileMsAt100k} ms`,
      measured: r100k
        ? `${formatMs(r100k.parseCompileMs)} ms (compile alone ${formatMs(r100k.compileMs)} ms)`
        : 'not run',
      pass: r100k && r100k.parseCompileMs < TARGETS.compileMsAt100k,
    },
    {
      name: `IP decisions at 10,000 rules >= ${min}x naive`,
      measured: r10k ? ratio(r10k.ip, r10k.ipNaive) : 'not run',
      pass: r10k && r10k.ip.perSecond >= min * r10k.ipNaive.perSecond,
    },
    {
      name: `host-name decisions at 10,000 rules >= ${min}x naive`,
      measured: r10k ? ratio(r10k.host, r10k.hostNaive) : 'not run',
      pass: r10k && r10k.host.perSecond >= min * r10k.hostNaive.perSecond,
    },
  ];
}

function describeMix(p: Prepared): string {
  const count = (list: readonly Destination[], pick: (d: Decision) => string) => {
    const counts = new Map<string, number>();
    for (const d of list) {
      const key = pick(decide(p.policy, d));
      counts.set(key, (counts.get(key) ?? 0) + 1);
    }
    return [...counts]
      .sort((a, b) => b[1] - a[1])
      .map(([key, n]) => `${key} ${Math.round((n / list.length) * 100)}%`)
      .join(', ');
  };
  const how = (d: Decision) => `${d.verdict}/${d.list}`;
  return (
    `  IP destinations at ${formatInt(p.workload.size)} rules: ${count(p.ips, how)}\n` +
    `  host destinations at ${formatInt(p.workload.size)} rules: ${count(p.hosts, how)}`
  );
}

const SUMMARY = `The policy engine against a naive linear matcher over the same rules, in one run: for 10 to
100,000 rules, IP and host-name decisions per second, parse+decide for raw host strings, compile
time and heap per compiled policy. Inputs come from a seeded PRNG; nothing touches the network.`;

const OPTIONS = {
  sizes: text({
    default: DEFAULT_SIZES.join(','),
    value: 'LIST',
    help: 'rule counts, whole numbers of at least 2',
  }),
  'budget-ms': whole({ default: 400, min: 1, max: 10_000, help: 'measuring time per cell' }),
  strict: flag('exit 1 when a target fails'),
};

async function main(values: OptionValues<typeof OPTIONS>): Promise<void> {
  const sizes = values.sizes.split(',').map((s) => Number(s.trim()));
  if (sizes.some((n) => !Number.isInteger(n) || n < 2))
    refuse('bench:policy', '--sizes must list whole numbers of at least 2');
  const budgetMs = values['budget-ms'];

  const started = process.hrtime.bigint();
  const cpu = cpus()[0]?.model.trim() ?? 'unknown CPU';
  console.log(`# Moat policy benchmark`);
  console.log('');
  console.log(
    `node ${process.version}, ${process.platform}/${process.arch}, ${cpu}, ` +
      `${cpus().length} CPUs (the benchmark runs on one thread), ` +
      `load average ${loadavg()[0]!.toFixed(2)} at start`,
  );
  console.log(
    `rules: denyOut 10% (0.0.0.0/0 + public CIDRs); allowOut 40% IPv4 CIDRs /8-/32, 10% IPv6 ` +
      `CIDRs, 30% names, 20% *. wildcards (2-4 labels around ${POPULAR_BASES} popular domains)`,
  );
  console.log(
    `destinations: ${DESTINATIONS} IP and ${DESTINATIONS} host-name, pre-parsed with ` +
      `parseDestination; "parse+decide" parses the raw "name:${PORT}" text every time; ` +
      `${budgetMs} ms per cell after warm-up`,
  );

  process.stderr.write('generating and compiling rule sets...\n');
  const prepared = sizes.map(prepare);
  let checked = 0;
  for (const p of prepared) checked += crossCheck(p);
  console.log(`cross-check: moat and naive agree on all ${formatInt(checked)} sampled decisions`);
  for (const p of prepared) console.log(describeMix(p));
  process.stderr.write('warming up...\n');
  warmUp(prepared);

  const rows: Row[] = [];
  // Each size is taken off the list before it is measured and dropped after, so that the GCs
  // of later heap measurements have less to trace.
  for (let p = prepared.shift(); p !== undefined; p = prepared.shift()) {
    process.stderr.write(`measuring ${formatInt(p.workload.size)} rules...\n`);
    fullGc();
    rows.push(measureSize(p, budgetMs));
  }

  console.log('');
  console.log('## Decisions per second (one core), moat beside the naive linear matcher');
  console.log('');
  console.log(decisionsTable(rows));
  console.log('');
  console.log(
    'heap/policy: parsed rules + compiled index, per policy. k = 10^3, M = 10^6; ratio = moat / naive.',
  );
  console.log('');
  console.log('## Compile time and memory');
  console.log('');
  console.log(compileTable(rows));
  console.log('');
  console.log(
    'medians of repeated runs; ratio = moat / naive (lower is better here); heap = growth of ' +
      'V8 heap + array buffers after full GC, per copy held.',
  );
  console.log('');
  console.log('## Diagnostic: decide() on the same destinations as one-shape object literals');
  console.log('');
  console.log(shapeTable(rows));
  console.log('');
  console.log(
    'the same destinations copied into plain object literals `{ ip, port }` / `{ host, port }`; ' +
      'ratio = literal / parseDestination. A ratio well above 1 means the objects ' +
      'parseDestination returns slow decide() down (hidden classes / inline caches).',
  );
  console.log('');
  console.log('## With ports in the rules');
  console.log('');
  console.log(portsTable(rows));
  console.log('');
  console.log(
    'the same rules and destinations with ports on a quarter of the entries (allowOut: one in ' +
      `four on :${PORT}, one in four on :8000-8100; denyOut: one in three on :25); ratio = with ports / without.`,
  );
  console.log('');
  console.log('## Targets');
  console.log('');
  const verdicts = checkTargets(rows);
  for (const v of verdicts) {
    const tag = v.pass === undefined ? 'SKIP' : v.pass ? 'PASS' : 'FAIL';
    console.log(`${tag}  ${v.name}: ${v.measured}`);
  }
  const starved: string[] = [];
  for (const r of rows) {
    const at = `${formatInt(r.size)} rules`;
    if (r.cpuShare < 0.9) starved.push(`${Math.round(r.cpuShare * 100)}% in decisions at ${at}`);
    if (r.compileCpuShare < 0.9) {
      starved.push(`${Math.round(r.compileCpuShare * 100)}% in compile at ${at}`);
    }
  }
  if (starved.length > 0) {
    console.log('');
    console.log(
      `WARNING  the benchmark got less than a whole core (${starved.join(', ')}): ` +
        'other load on the machine; those figures are noisy.',
    );
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  console.log('');
  console.log(`total ${seconds.toFixed(1)} s (checksum ${sinkChecksum()})`);
  if (values.strict && verdicts.some((v) => v.pass === false)) process.exitCode = 1;
}

// Read first, so that --help and a refused command line need no second process.
const values = readOptions('bench:policy', SUMMARY, OPTIONS);
if (!(await reexecWithExposedGc())) await main(values);
