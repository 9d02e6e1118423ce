import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import {
  compileInternalDenyList,
  compilePolicy,
  type Decision,
  decide,
  formatDestination,
  type Policy,
  parseDestination,
} from '../policy/index.js';
import { type CliIO, CONFIG_HELP, CONFIG_OPTIONS, configFrom, EXIT, UsageError } from './io.js';
import { readPolicyFile } from './policy-file.js';

export const CHECK_HELP = `Usage: moat check --policy FILE [options] [DEST...]

Decides destinations against a policy file, as Moat would enforce it, without touching the
network. With no DEST arguments, reads destinations from standard input, one per line (blank
lines and lines starting with # are skipped).

DEST forms: host, host:port, IPv4, IPv6, [IPv6]:port, scheme://host[:port]/path

A host name is decided by the name rules. Where only an address rule could decide, the answer
"depends on what the name resolves to": it is denied under a deny-by-default policy.

Options:
  --policy FILE             policy file: JSON shaped like the PUT /sandboxes/{id}/network body
  --json                    one JSON object per line:
                            {"destination","canonical","verdict","rule","list","reason"}
${CONFIG_HELP}
  -h, --help                this help

Exit status: 0 when every destination is allowed, 1 when any is denied (an unparsable
destination counts as denied, list "invalid"), 2 on usage errors or an invalid policy.

Example:
  moat check --policy policies/github.json api.github.com https://example.com/ 10.0.0.1`;

interface Verdict {
  readonly destination: string;
  readonly canonical: string | null;
  readonly decision: Decision;
}

function judge(policy: Policy, text: string): Verdict {
  const destination = parseDestination(text);
  if (!destination.ok) {
    return {
      destination: text,
      canonical: null,
      decision: { verdict: 'deny', list: 'invalid', rule: null, reason: destination.error },
    };
  }
  return {
    destination: text,
    canonical: formatDestination(destination.value),
    decision: decide(policy, destination.value),
  };
}

function format(verdict: Verdict, json: boolean): string {
  const { verdict: v, list, rule, reason } = verdict.decision;
  if (json) {
    return JSON.stringify({
      destination: verdict.destination,
      canonical: verdict.canonical,
      verdict: v,
      rule,
      list,
      reason,
    });
  }
  const shown = verdict.canonical ?? verdict.destination;
  return `${v.toUpperCase().padEnd(5)} ${shown}  [${list}${rule === null ? '' : ` ${rule}`}]  ${reason}`;
}

export async function check(args: string[], io: CliIO): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      policy: { type: 'string' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
      ...CONFIG_OPTIONS,
    },
  });
  if (values.help) {
    io.stdout.write(`${CHECK_HELP}\n`);
    return EXIT.ok;
  }
  if (typeof values.policy !== 'string') throw new UsageError('moat check needs --policy FILE');
  const config = configFrom(values, io);
  const file = readPolicyFile(values.policy, { maxEntries: config.maxPolicyEntries });
  if (!file.ok) {
    for (const problem of file.problems) io.stderr.write(`${values.policy}: error: ${problem}\n`);
    return EXIT.usage;
  }
  const policy = compilePolicy(file.rules, compileInternalDenyList(config.internalDeny));
  let denied = false;
  const emit = (text: string) => {
    const verdict = judge(policy, text);
    denied ||= verdict.decision.verdict === 'deny';
    io.stdout.write(`${format(verdict, values.json === true)}\n`);
  };
  if (positionals.length > 0) {
    positionals.forEach(emit);
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
      emit(text);
      count++;
    }
    if (count === 0)
      throw new UsageError('no destinations given (as arguments or on standard input)');
  }
  return denied ? EXIT.denied : EXIT.ok;
}
