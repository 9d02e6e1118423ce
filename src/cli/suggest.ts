import { loadPresets } from '../config-presets.js';
import { parseSince } from '../flows/index.js';
import {
  compileInternalDenyList,
  compilePolicy,
  type ObservedDestination,
  parseNetworkConfig,
  MAX_PORTS_PER_ENTRY,
  type Suggestion,
  suggestPolicy,
  WILDCARD_SIBLINGS,
} from '../policy/index.js';
import { type CliIO, configFlags, configFrom, EXIT, parseOptions, UsageError } from './io.js';
import { replayInput } from './replay-source.js';
import { type RecordedDecision, replay } from './replay.js';

const SUGGEST_CONFIG = configFlags(['internalDeny', 'presetsDir', 'dataDir']);

export const SUGGEST_HELP = `Usage: moat suggest --from-flows FLOWS.jsonl [--sandbox ID] [options]
       moat suggest [--api URL] [--key KEY | --key-file FILE] --sandbox ID [options]

Prints the smallest policy in Moat's language that would have allowed every destination a
sandbox reached or tried, with everything else denied: presets where one covers two or more of
the names seen, *.domain where ${WILDCARD_SIBLINGS} or more names under one registrable domain were seen
(never on a public suffix), then names, then addresses seen with no name. Each entry carries a
comment saying how many flow records it covers; moat check, moat lint and moat cni install read
policy files with such comments. What no policy opens (the host itself, the internal deny list,
invalid requests) is counted, not suggested. Each entry but a preset is scoped to the ports it
was seen on (name:443), one entry per port up to ${MAX_PORTS_PER_ENTRY}; more ports, or a name only asked
for in DNS, and the entry opens every port.

Options:
  --from-flows FILE     the flow records: the JSON Lines moat serve writes with --flow-log FILE,
                        or what moat observe --json > flows.jsonl saves
  --api URL             else a node's records (GET /flows, the newest 10,000; default
                        http://127.0.0.1:3000), with --key KEY or --key-file FILE (default:
                        <data-dir>/api-key, where moat serve writes it)
  --sandbox ID          the sandbox to learn from (needed when the records hold several)
  --since T             only records from T on: an ISO 8601 time or a duration back from now
                        (30m, 24h, 7d)
  --check               replay the records against the suggestion and say whether any would be
                        denied (exit 1 if so)
  --json                one JSON object: {"policy": {allowOut, denyOut}, "entries": [{"entry",
                        "flows", "covers"}], "notOpenable": N}
${SUGGEST_CONFIG.help}
  -h, --help            this help

Exit status: 0 a policy was printed (and, with --check, allows every record), 1 --check found a
record it would deny or the API could not be read, 2 usage error (no records among them).

Examples:
  moat observe --sandbox i7x2... --limit 10000 --json > flows.jsonl
  moat suggest --from-flows flows.jsonl --check > policy.json
  moat check --policy policy.json --replay flows.jsonl`;

const DEFAULT_API = 'http://127.0.0.1:3000';

/** Lists whose decisions no sandbox policy changes: the host, the internal list, bad requests. */
const NOT_OPENABLE = new Set(['host', 'internal', 'invalid']);

export async function suggest(args: string[], io: CliIO): Promise<number> {
  const { values, positionals } = parseOptions({
    args,
    allowPositionals: false,
    options: {
      'from-flows': { type: 'string' },
      api: { type: 'string' },
      key: { type: 'string' },
      'key-file': { type: 'string' },
      sandbox: { type: 'string' },
      since: { type: 'string' },
      check: { type: 'boolean' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
      ...SUGGEST_CONFIG.options,
    },
  });
  if (values.help) {
    io.stdout.write(`${SUGGEST_HELP}\n`);
    return EXIT.ok;
  }
  if (positionals.length > 0) throw new UsageError('moat suggest takes no arguments');
  const since = values.since === undefined ? undefined : parseSince(values.since, Date.now());
  if (values.since !== undefined && since === undefined)
    throw new UsageError(
      `--since ${values.since}: an ISO 8601 time or a duration like 30m, 24h, 7d`,
    );
  const config = configFrom(values, io);
  const presets = loadPresets(config.presetsDir);
  if (!presets.ok) {
    io.stderr.write(`error: ${presets.error}\n`);
    return EXIT.usage;
  }
  const input = await replayInput(
    {
      replay: values['from-flows'],
      // Without a file, a node's API: the default one unless --api names another.
      'replay-api': values['from-flows'] === undefined ? (values.api ?? DEFAULT_API) : values.api,
      sandbox: values.sandbox,
      key: values.key,
      'key-file': values['key-file'],
      'internal-deny': (values as Record<string, unknown>)['internal-deny'] as string[] | undefined,
    },
    io,
    config,
    { command: 'moat suggest', fileFlag: '--from-flows', apiFlag: '--api' },
  );
  if (input === undefined) return EXIT.failed;
  const records = input.records.filter(
    (record) => since === undefined || (record.time !== null && record.time >= since),
  );
  const sandboxes = [...new Set(records.map((record) => record.sandboxID))];
  if (sandboxes.length === 0)
    throw new UsageError(
      `no flow records${values.sandbox === undefined ? '' : ` of sandbox ${values.sandbox}`}${values.since === undefined ? '' : ` since ${values.since}`} to learn from`,
    );
  if (sandboxes.length > 1)
    throw new UsageError(
      `the records hold ${sandboxes.length} sandboxes (${sandboxes.slice(0, 5).join(', ')}${sandboxes.length > 5 ? ', ...' : ''}): give --sandbox ID`,
    );
  const openable = records.filter((record) => !NOT_OPENABLE.has(record.list));
  const suggestion = suggestPolicy(observedIn(openable), presets.value);
  const notOpenable = records.length - openable.length;
  if (values.json === true) {
    io.stdout.write(
      `${JSON.stringify({ policy: policyOf(suggestion), entries: suggestion.allowOut, notOpenable })}\n`,
    );
  } else io.stdout.write(commented(suggestion));
  io.stderr.write(
    `moat suggest: ${suggestion.allowOut.length} entr${suggestion.allowOut.length === 1 ? 'y' : 'ies'} from ${openable.length} flow record${openable.length === 1 ? '' : 's'} of sandbox ${sandboxes[0]}${notOpenable === 0 ? '' : `; ${notOpenable} decided by the host, the internal deny list or as invalid (no policy opens those)`}\n`,
  );
  if (values.check !== true) return EXIT.ok;
  return checkSuggestion(suggestion, openable, input.internalDeny, presets.value, io);
}

/** What the records show the sandbox reaching or trying; a learned address counts for its name. */
function observedIn(records: readonly RecordedDecision[]): ObservedDestination[] {
  return records.map(({ destination, list, rule }) => ({
    name: destination.name ?? (list === 'learned' ? rule : null),
    address: destination.address,
    port: destination.port,
    flows: 1,
  }));
}

const policyOf = (suggestion: Suggestion) => ({
  allowOut: suggestion.allowOut.map((entry) => entry.entry),
  denyOut: suggestion.denyOut,
});

/** The policy as JSON with a `//` comment after each entry: how many records it covers. */
function commented(suggestion: Suggestion): string {
  const count = (n: number) => `${n} flow${n === 1 ? '' : 's'}`;
  const lines = suggestion.allowOut.map((entry, i) => {
    const comma = i < suggestion.allowOut.length - 1 ? ',' : '';
    // What it stands for, unless that is the entry itself (its port aside).
    const itself = entry.entry.replace(/:\d+$/, '').replace(/^\[(.*)\]$/, '$1');
    const names =
      entry.covers.length === 1 && entry.covers[0] === itself ? '' : `: ${entry.covers.join(', ')}`;
    return `    ${JSON.stringify(entry.entry)}${comma} // ${count(entry.flows)}${names}`;
  });
  return [
    '{',
    lines.length === 0 ? '  "allowOut": [],' : ['  "allowOut": [', ...lines, '  ],'].join('\n'),
    `  "denyOut": ${JSON.stringify(suggestion.denyOut)} // everything not seen`,
    '}',
    '',
  ].join('\n');
}

/** Replays the records as if each had been allowed: any the suggestion denies is reported. */
function checkSuggestion(
  suggestion: Suggestion,
  records: readonly RecordedDecision[],
  internalDeny: Parameters<typeof compileInternalDenyList>[0],
  presets: Parameters<typeof suggestPolicy>[1],
  io: CliIO,
): number {
  const parsed = parseNetworkConfig(policyOf(suggestion), { presets });
  if (!parsed.ok) throw new Error(`the suggestion does not parse: ${parsed.errors[0]!.message}`);
  const policy = compilePolicy(parsed.value, compileInternalDenyList(internalDeny));
  const wanted = records.map((record) => ({ ...record, verdict: 'allow' as const }));
  const denied = replay(wanted, policy).changes.filter((c) => c.change === 'newly-denied');
  for (const change of denied) {
    const { name, address, port } = change.destination;
    io.stderr.write(
      `moat suggest: --check: ${[name, address].filter((p) => p !== null).join(' ')}${port === null ? '' : `:${port}`} (${change.flows} flows) would be denied: ${change.now.reason}\n`,
    );
  }
  io.stderr.write(
    `moat suggest: --check: replayed ${records.length} record${records.length === 1 ? '' : 's'}: ${denied.length === 0 ? 'every one allowed' : `${denied.reduce((n, c) => n + c.flows, 0)} denied`}\n`,
  );
  return denied.length === 0 ? EXIT.ok : EXIT.denied;
}
