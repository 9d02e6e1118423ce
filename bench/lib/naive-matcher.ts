/**
 * The naive peer of the policy engine for benchmarks: the same canonical rules in numeric form
 * (IPv4 as int32 + mask, IPv6 as four of each, names as strings), scanned linearly for every
 * decision, in the same order as `decide`. Written sensibly, just without an index.
 */
import {
  ALL_TRAFFIC,
  type CIDR,
  DEFAULT_INTERNAL_DENY,
  type Decision,
  type Destination,
  type InternalRange,
  type IPAddress,
  type NetworkRules,
} from '../../src/policy/index.js';

const mask4 = (length: number): number => (length === 0 ? 0 : (~0 << (32 - length)) | 0);

/** Per-word masks of an IPv6 prefix. */
function masks6(length: number): number[] {
  return [0, 1, 2, 3].map((i) => {
    const keep = length - i * 32;
    return keep >= 32 ? ~0 : keep <= 0 ? 0 : ~0 << (32 - keep);
  });
}

const naiveDecision = (
  verdict: Decision['verdict'],
  list: Decision['list'],
  rule: string | null,
  reason: string,
): Decision => Object.freeze({ verdict, list, rule, reason });

const NAIVE_DEFAULT = naiveDecision('allow', 'default', null, 'no rule matches');
const NAIVE_NO_DESTINATION = naiveDecision('deny', 'invalid', null, 'no host and no address');
const NAIVE_BAD_PORT = naiveDecision('deny', 'invalid', null, 'bad port');

/** Longest-prefix match by scanning every prefix; IPv4 as int32 + mask, IPv6 as 4 of each. */
class LinearPrefixList {
  private readonly nets4: Int32Array;
  private readonly masks4: Int32Array;
  private readonly lengths4: Uint8Array;
  private readonly decisions4: Decision[] = [];
  private readonly nets6: Int32Array;
  private readonly masks6: Int32Array;
  private readonly lengths6: Uint8Array;
  private readonly decisions6: Decision[] = [];

  constructor(entries: ReadonlyArray<{ readonly cidr: CIDR; readonly decision: Decision }>) {
    const count4 = entries.filter((e) => e.cidr.version === 4).length;
    const count6 = entries.length - count4;
    this.nets4 = new Int32Array(count4);
    this.masks4 = new Int32Array(count4);
    this.lengths4 = new Uint8Array(count4);
    this.nets6 = new Int32Array(count6 * 4);
    this.masks6 = new Int32Array(count6 * 4);
    this.lengths6 = new Uint8Array(count6);
    let i4 = 0;
    let i6 = 0;
    for (const { cidr, decision } of entries) {
      if (cidr.version === 4) {
        this.nets4[i4] = cidr.words[0]! | 0;
        this.masks4[i4] = mask4(cidr.prefixLength) | 0;
        this.lengths4[i4] = cidr.prefixLength;
        this.decisions4.push(decision);
        i4++;
      } else {
        const ones = masks6(cidr.prefixLength);
        for (let w = 0; w < 4; w++) {
          this.nets6[i6 * 4 + w] = cidr.words[w]! | 0;
          this.masks6[i6 * 4 + w] = ones[w]! | 0;
        }
        this.lengths6[i6] = cidr.prefixLength;
        this.decisions6.push(decision);
        i6++;
      }
    }
  }

  lookup(ip: IPAddress): Decision | undefined {
    const words = ip.words;
    let best = -1;
    let bestLength = -1;
    if (ip.version === 4) {
      const a = words[0]! | 0;
      const nets = this.nets4;
      const masks = this.masks4;
      const lengths = this.lengths4;
      for (let i = 0; i < nets.length; i++) {
        if (((a ^ nets[i]!) & masks[i]!) === 0 && lengths[i]! > bestLength) {
          best = i;
          bestLength = lengths[i]!;
        }
      }
      return best < 0 ? undefined : this.decisions4[best];
    }
    const a0 = words[0]! | 0;
    const a1 = words[1]! | 0;
    const a2 = words[2]! | 0;
    const a3 = words[3]! | 0;
    const nets = this.nets6;
    const masks = this.masks6;
    const lengths = this.lengths6;
    for (let i = 0, j = 0; i < lengths.length; i++, j += 4) {
      if (
        ((a0 ^ nets[j]!) & masks[j]!) === 0 &&
        ((a1 ^ nets[j + 1]!) & masks[j + 1]!) === 0 &&
        ((a2 ^ nets[j + 2]!) & masks[j + 2]!) === 0 &&
        ((a3 ^ nets[j + 3]!) & masks[j + 3]!) === 0 &&
        lengths[i]! > bestLength
      ) {
        best = i;
        bestLength = lengths[i]!;
      }
    }
    return best < 0 ? undefined : this.decisions6[best];
  }
}

const internalLists = new WeakMap<readonly InternalRange[], LinearPrefixList>();

/** The internal deny list is built once per list and shared, as compiled policies share theirs. */
function internalList(ranges: readonly InternalRange[]): LinearPrefixList {
  let list = internalLists.get(ranges);
  if (list === undefined) {
    list = new LinearPrefixList(
      ranges.map((range) => ({
        cidr: range.cidr,
        decision: naiveDecision('deny', 'internal', range.entry, `internal ${range.entry}`),
      })),
    );
    internalLists.set(ranges, list);
  }
  return list;
}

/**
 * What one would write without an index: every rule in an array, every decision a scan. Same
 * order as `decide`: internal list, allowOut names, allowOut addresses, denyOut, default.
 */
export class NaiveMatcher {
  private readonly internal: LinearPrefixList;
  private readonly exactNames: string[] = [];
  private readonly exactDecisions: Decision[] = [];
  /** `.example.com` for `*.example.com`: a name matches when it ends with it. */
  private readonly wildcardSuffixes: string[] = [];
  private readonly wildcardDecisions: Decision[] = [];
  private readonly allow: LinearPrefixList;
  private readonly deny: LinearPrefixList;
  private readonly unmatchedName: Decision;

  constructor(rules: NetworkRules, internal: readonly InternalRange[] = DEFAULT_INTERNAL_DENY) {
    this.internal = internalList(internal);
    const allow: { cidr: CIDR; decision: Decision }[] = [];
    for (const rule of rules.allowOut) {
      const decision = naiveDecision('allow', 'allowOut', rule.entry, `allowOut ${rule.entry}`);
      if (rule.kind === 'address') allow.push({ cidr: rule.cidr, decision });
      else if (rule.kind === 'name') {
        this.exactNames.push(rule.name);
        this.exactDecisions.push(decision);
      } else {
        this.wildcardSuffixes.push(`.${rule.name}`);
        this.wildcardDecisions.push(decision);
      }
    }
    this.allow = new LinearPrefixList(allow);
    const deny: { cidr: CIDR; decision: Decision }[] = [];
    let denyAll: Decision | undefined;
    for (const rule of rules.denyOut) {
      // The benchmark's workload has no denyOut names.
      if (rule.kind !== 'address') continue;
      if (rule.entry === ALL_TRAFFIC) {
        denyAll ??= naiveDecision('deny', 'denyOut', rule.entry, 'denyOut ALL_TRAFFIC');
        deny.push({ cidr: rule.cidr, decision: denyAll });
        deny.push({ cidr: { ...rule.cidr, version: 6, words: [0, 0, 0, 0] }, decision: denyAll });
      } else {
        const decision = naiveDecision('deny', 'denyOut', rule.entry, `denyOut ${rule.entry}`);
        deny.push({ cidr: rule.cidr, decision });
      }
    }
    if (rules.allowInternetAccess === false) {
      denyAll ??= naiveDecision('deny', 'denyOut', 'allow_internet_access=false', 'no access');
      for (const words of [[0], [0, 0, 0, 0]]) {
        const version = words.length === 1 ? 4 : 6;
        const cidr: CIDR = { version, words, prefixLength: 0, hadHostBits: false, text: '' };
        deny.push({ cidr, decision: denyAll });
      }
    }
    this.deny = new LinearPrefixList(deny);
    this.unmatchedName = denyAll
      ? naiveDecision('deny', denyAll.list, denyAll.rule, 'no name rule covers the name')
      : NAIVE_DEFAULT;
  }

  private lookupName(host: string): Decision | undefined {
    const names = this.exactNames;
    for (let i = 0; i < names.length; i++) {
      if (names[i] === host) return this.exactDecisions[i];
    }
    const suffixes = this.wildcardSuffixes;
    let best = -1;
    let bestLength = 0;
    for (let i = 0; i < suffixes.length; i++) {
      const suffix = suffixes[i]!;
      if (suffix.length > bestLength && suffix.length < host.length && host.endsWith(suffix)) {
        best = i;
        bestLength = suffix.length;
      }
    }
    return best < 0 ? undefined : this.wildcardDecisions[best];
  }

  decide(destination: Destination): Decision {
    const { host, ip, port } = destination;
    if (port !== undefined && !(Number.isInteger(port) && port >= 1 && port <= 65535)) {
      return NAIVE_BAD_PORT;
    }
    if (ip !== undefined) {
      const internal = this.internal.lookup(ip);
      if (internal) return internal;
    }
    if (host !== undefined) {
      const byName = this.lookupName(host);
      if (byName) return byName;
    }
    if (ip === undefined) return host === undefined ? NAIVE_NO_DESTINATION : this.unmatchedName;
    return this.allow.lookup(ip) ?? this.deny.lookup(ip) ?? NAIVE_DEFAULT;
  }
}
