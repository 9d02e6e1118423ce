import { createInterface } from 'node:readline';
import type { MoatConfig } from '../config.js';
import { loadPresets } from '../config-presets.js';
import { AnswerCache, HostResolver, UpstreamClient } from '../dns/index.js';
import {
  compileInternalDenyList,
  compilePolicy,
  type Decision,
  type DecisionList,
  decide,
  destinationRulesFor,
  type CanonicalName,
  formatDestination,
  type NetworkRules,
  type Policy,
  parseDestination,
  requestDecision,
  requestPath,
} from '../policy/index.js';
import { type CliIO, configFlags, configFrom, EXIT, parseOptions, UsageError } from './io.js';
import { warnUnknownEnvironment } from './unknown-environment.js';

/** The settings check uses: the internal deny list, the entry limit and the resolver's. */
const CHECK_CONFIG = configFlags([
  'internalDeny',
  'maxPolicyEntries',
  'presetsDir',
  'dnsUpstream',
  'dnsTimeoutMs',
  'dnsCacheSize',
  'dnsMaxTtl',
]);
import { readPolicyFile } from './policy-file.js';
import { replayInput, type ReplaySource } from './replay-source.js';
import { type ReplayChange, replay } from './replay.js';

export const CHECK_HELP = `Usage: moat check --policy FILE [options] [DEST...]
       moat check --policy FILE --replay FLOWS.jsonl [--sandbox ID] [--json]
       moat check --policy FILE --replay-api URL [--key KEY | --key-file FILE] [--sandbox ID]

Decides destinations against a policy file, as Moat would enforce it. Without --resolve it
touches no network. With no DEST arguments, reads destinations from standard input, one per
line (blank lines and lines starting with # are skipped).

DEST forms: host, host:port, IPv4, IPv6, [IPv6]:port, scheme://host[:port]/path, and
"METHOD scheme://host[:port]/path" (one argument: quote it). A URL to a destination whose
network.rules match methods or paths is decided as a request too (GET when no METHOD is given):
  ALLOW  api.github.com:443 GET /repos/acme/x  [rules api.github.com #1]  ...

A host name is decided by the name rules. A name no rule names, under a policy that does not
deny by default, "depends on what the name resolves to": --resolve looks it up and decides
each address. A name the rules deny is never looked up (Moat's DNS and proxy never do).

Options:
  --policy FILE             policy file: JSON shaped like the PUT /sandboxes/{id}/network body
  --resolve                 resolve host names the policy does not deny through the resolvers
                            of --dns-upstream (default: /etc/resolv.conf, as moat serve), and
                            decide every address as Moat's proxy would: allowed when any
                            address is; the addresses are listed under the destination
  --json                    one JSON object per line:
                            {"destination","canonical","verdict","rule","list","reason"},
                            with --resolve also "addresses": [{"address","verdict","rule",
                            "list","reason"}] for a name that was looked up, and "intercept":
                            the network.rules key whose headers an allowed name would get,
                            and "request": {"method","path"} for a request decided by it
  --replay FILE             what-if: decide every decision recorded in a flow log under the
                            policy and print what would change. The file: the JSON Lines
                            moat serve writes with --flow-log FILE, or what moat observe
                            --json > flows.jsonl saves (--limit up to 10000). Decided under
                            --internal-deny: Moat's default unless given (give the node's,
                            as its moat serve --print-config shows it)
  --replay-api URL          the same for the records a Moat node keeps (GET /flows, the
                            newest 10,000), decided under the node's internal deny list (GET
                            /internal-deny) unless --internal-deny is given; with --key KEY
                            or --key-file FILE (default: the file moat serve writes,
                            <data-dir>/api-key: data/api-key here)
  --sandbox ID              replay only this sandbox's records
${CHECK_CONFIG.help}
  -h, --help                this help

Exit status: 0 when every destination is allowed, 1 when any is denied (an unparsable
destination counts as denied, list "invalid"; with --resolve, a name that does not resolve
counts as denied, list "unresolved"), 2 on usage errors or an invalid policy. With a replay:
0 when nothing recorded would be newly denied, 1 when something would (or --replay-api
could not be read), 2 on usage errors (an unreadable --replay file among them).

Examples:
  moat check --policy policies/github.json api.github.com https://example.com/ 10.0.0.1
  moat check --policy open.json --resolve --dns-upstream 127.0.0.1:53 example.com
  moat check --policy tight.json --replay /var/log/moat/flows.jsonl --sandbox i7x2...
  moat check --policy tight.json --replay-api http://127.0.0.1:3000`;

/** A decision as check reports it: the policy's, or a name that did not resolve. */
type CheckDecision = Omit<Decision, 'list'> & { readonly list: DecisionList | 'unresolved' };

interface Verdict {
  readonly destination: string;
  readonly canonical: string | null;
  readonly decision: CheckDecision;
  /** With --resolve, each address a name resolved to, decided on its own. */
  readonly addresses?: ReadonlyArray<{ readonly address: string; readonly decision: Decision }>;
  /** The `network.rules` key whose headers Moat would set (intercepting TLS), if any. */
  readonly ruleKey?: string;
  /** The request a URL destination asked, when its destination's rules decided it. */
  readonly request?: { readonly method: string; readonly path: string };
}

/** A URL DEST's request: its method (GET unless written before it) and its path and query. */
function requestOf(text: string): { method: string; url: string; target: string } {
  const spaced = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+)\s+(\S+)$/.exec(text);
  const [method, url] = spaced === null ? ['GET', text] : [spaced[1]!, spaced[2]!];
  const scheme = /^[a-zA-Z][a-zA-Z0-9+.-]*:\/\/[^/?#]*/.exec(url);
  const rest = scheme === null ? '' : url.slice(scheme[0].length);
  return { method, url, target: rest.startsWith('/') ? rest : `/${rest}` };
}

/**
 * An allowed name that a rule covers is intercepted, and that rule's headers are set; a URL
 * to it is decided as a request by the rule's methods and paths.
 */
function withRules(
  policy: Policy,
  verdict: Verdict,
  host: CanonicalName | undefined,
  request: { method: string; target: string } | undefined,
): Verdict {
  if (host === undefined || verdict.decision.verdict !== 'allow') return verdict;
  const rules = destinationRulesFor(policy, host);
  if (rules === undefined) return verdict;
  const intercepted = { ...verdict, ruleKey: rules.ruleKey };
  if (request === undefined || !rules.decidesRequests) return intercepted;
  const { method, target } = request;
  const decision = requestDecision(
    policy,
    rules,
    host,
    method,
    target,
    verdict.decision as Decision,
  );
  const path = requestPath(target);
  const shown = `${method} ${path}`;
  return {
    ...intercepted,
    canonical: `${verdict.canonical} ${shown}`,
    decision,
    request: { method, path },
  };
}

const unresolved = (reason: string): CheckDecision => ({
  verdict: 'deny',
  list: 'unresolved',
  rule: null,
  reason,
});

/**
 * Decides one destination. With a resolver, a name the policy does not deny is looked up and
 * each address decided with the name, as the proxy plans a dial: the destination is allowed
 * when any address is (by the first allowed one), and denied by the first address otherwise.
 */
async function judge(policy: Policy, text: string, resolver?: HostResolver): Promise<Verdict> {
  const request = requestOf(text);
  const isUrl = request.url.includes('://');
  const verdict = await decideDestination(policy, isUrl ? request.url : text, resolver);
  const parsed = parseDestination(isUrl ? request.url : text);
  return withRules(
    policy,
    { ...verdict, destination: text },
    parsed.ok ? parsed.value.host : undefined,
    isUrl ? request : undefined,
  );
}

async function decideDestination(
  policy: Policy,
  text: string,
  resolver?: HostResolver,
): Promise<Verdict> {
  const parsed = parseDestination(text);
  if (!parsed.ok) {
    return {
      destination: text,
      canonical: null,
      decision: { verdict: 'deny', list: 'invalid', rule: null, reason: parsed.error },
    };
  }
  const destination = parsed.value;
  const base = { destination: text, canonical: formatDestination(destination) };
  const byName = decide(policy, destination);
  const host = destination.host;
  // Only a name the rules do not deny is looked up, as the proxy does.
  if (resolver === undefined || host === undefined || byName.verdict === 'deny')
    return { ...base, decision: byName };
  let ips;
  try {
    ips = await resolver.lookup(host);
  } catch (error) {
    return {
      ...base,
      decision: unresolved(`cannot resolve ${host}: ${(error as Error).message}`),
      addresses: [],
    };
  }
  if (ips.length === 0)
    return {
      ...base,
      decision: unresolved(`${host} has no IPv4 or IPv6 address`),
      addresses: [],
    };
  const addresses = ips.map((ip) => ({
    address: ip.text,
    decision: decide(policy, { ...destination, ip }),
  }));
  const deciding = addresses.find((a) => a.decision.verdict === 'allow') ?? addresses[0]!;
  return { ...base, decision: deciding.decision, addresses };
}

const fields = ({ verdict, rule, list, reason }: CheckDecision) => ({
  verdict,
  rule,
  list,
  reason,
});

const line = (shown: string, { verdict, list, rule, reason }: CheckDecision) =>
  `${verdict.toUpperCase().padEnd(5)} ${shown}  [${list}${rule === null ? '' : ` ${rule}`}]  ${reason}`;

function format(verdict: Verdict, json: boolean): string {
  if (json) {
    return JSON.stringify({
      destination: verdict.destination,
      canonical: verdict.canonical,
      ...fields(verdict.decision),
      ...(verdict.addresses === undefined
        ? {}
        : {
            addresses: verdict.addresses.map((a) => ({
              address: a.address,
              ...fields(a.decision),
            })),
          }),
      ...(verdict.ruleKey === undefined ? {} : { intercept: verdict.ruleKey }),
      ...(verdict.request === undefined ? {} : { request: verdict.request }),
    });
  }
  const intercepted =
    verdict.ruleKey === undefined ? '' : `  (TLS intercepted: headers of rule ${verdict.ruleKey})`;
  return [
    line(verdict.canonical ?? verdict.destination, verdict.decision) + intercepted,
    ...(verdict.addresses ?? []).map((a) => `  ${line(a.address, a.decision)}`),
  ].join('\n');
}

/** Moat's own resolver (upstream client and cache) on the configured upstreams. */
function resolverFor(config: MoatConfig): HostResolver {
  const upstream = new UpstreamClient(config.dnsUpstream, { timeoutMs: config.dnsTimeoutMs });
  return new HostResolver(
    new AnswerCache(upstream, {
      capacity: config.dnsCacheSize,
      maxTtl: config.dnsMaxTtl,
      maxNegativeTtl: Math.min(config.dnsMaxTtl, 3600),
      now: () => performance.now(),
    }),
  );
}

export async function check(args: string[], io: CliIO): Promise<number> {
  const { values, positionals } = parseOptions({
    args,
    allowPositionals: true,
    options: {
      policy: { type: 'string' },
      resolve: { type: 'boolean' },
      json: { type: 'boolean' },
      replay: { type: 'string' },
      'replay-api': { type: 'string' },
      sandbox: { type: 'string' },
      key: { type: 'string' },
      'key-file': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
      ...CHECK_CONFIG.options,
    },
  });
  if (values.help) {
    io.stdout.write(`${CHECK_HELP}\n`);
    return EXIT.ok;
  }
  if (typeof values.policy !== 'string') throw new UsageError('moat check needs --policy FILE');
  warnUnknownEnvironment(io);
  const config = configFrom(values, io);
  const presets = loadPresets(config.presetsDir);
  if (!presets.ok) {
    io.stderr.write(`error: ${presets.error}\n`);
    return EXIT.usage;
  }
  const file = readPolicyFile(values.policy, {
    maxEntries: config.maxPolicyEntries,
    presets: presets.value,
  });
  if (!file.ok) {
    for (const problem of file.problems) io.stderr.write(`${values.policy}: error: ${problem}\n`);
    return EXIT.usage;
  }
  if (values.replay !== undefined || values['replay-api'] !== undefined) {
    if (positionals.length > 0 || values.resolve)
      throw new UsageError('a replay takes no DEST arguments and no --resolve');
    return replayCommand(file.rules, values, io, config);
  }
  const policy = compilePolicy(file.rules, compileInternalDenyList(config.internalDeny));
  if (values.sandbox !== undefined) throw new UsageError('--sandbox is for --replay');
  const resolver = values.resolve === true ? resolverFor(config) : undefined;
  let denied = false;
  const emit = async (text: string) => {
    const verdict = await judge(policy, text, resolver);
    denied ||= verdict.decision.verdict === 'deny';
    io.stdout.write(`${format(verdict, values.json === true)}\n`);
  };
  if (positionals.length > 0) {
    for (const text of positionals) await emit(text);
  } else {
    if (io.stdin.isTTY)
      io.stderr.write('reading destinations from standard input, one per line (Ctrl-D to end)\n');
    let count = 0;
    for await (const line of createInterface({
      input: io.stdin,
      crlfDelay: Number.POSITIVE_INFINITY,
    })) {
      const text = line.trim();
      if (text === '' || text.startsWith('#')) continue;
      await emit(text);
      count++;
    }
    if (count === 0)
      throw new UsageError('no destinations given (as arguments or on standard input)');
  }
  return denied ? EXIT.denied : EXIT.ok;
}

const shownDestination = ({ name, address, port }: ReplayChange['destination']): string => {
  const where = [name, address].filter((part) => part !== null).join(' ');
  return port === null ? where : `${where}:${port}`;
};

/** `moat check --replay`: what the recorded traffic would meet under the policy. */
async function replayCommand(
  rules: NetworkRules,
  values: ReplaySource & { json?: boolean },
  io: CliIO,
  config: MoatConfig,
): Promise<number> {
  const input = await replayInput(values, io, config);
  if (input === undefined) return EXIT.failed;
  const { records, internalDeny } = input;
  const result = replay(records, compilePolicy(rules, compileInternalDenyList(internalDeny)));
  for (const change of result.changes) {
    if (values.json === true) {
      io.stdout.write(`${JSON.stringify(change)}\n`);
      continue;
    }
    const { now, was } = change;
    const label = change.change === 'newly-denied' ? 'NEWLY DENIED ' : 'NEWLY ALLOWED';
    const rule = (list: string, r: string | null) => `[${list}${r === null ? '' : ` ${r}`}]`;
    io.stdout.write(
      `${label}  ${shownDestination(change.destination)}${change.request === undefined ? '' : ` ${change.request.method} ${change.request.path}`}  (${change.flows} flow${change.flows === 1 ? '' : 's'}, ${change.sandboxes.length} sandbox${change.sandboxes.length === 1 ? '' : 'es'})  was ${rule(was.list, was.rule)}  now ${rule(now.list, now.rule)}  ${now.reason}\n`,
    );
  }
  const count = (change: string) =>
    result.changes.filter((c) => c.change === change).reduce((n, c) => n + c.flows, 0);
  const denied = count('newly-denied');
  io.stderr.write(
    `replayed ${records.length} recorded decision${records.length === 1 ? '' : 's'}: ${denied} newly denied, ${count('newly-allowed')} newly allowed, ${result.unchanged} unchanged, ${result.notReplayable} decided by host protection or invalid requests (not replayed)\n`,
  );
  return denied > 0 ? EXIT.denied : EXIT.ok;
}
