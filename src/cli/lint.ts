import { statSync } from 'node:fs';
import { loadPresets } from '../config-presets.js';
import { compileInternalDenyList, lintPolicy } from '../policy/index.js';
import { type CliIO, configFlags, configFrom, EXIT, parseOptions, UsageError } from './io.js';
import { warnUnknownEnvironment } from './unknown-environment.js';

/** The settings lint uses: the internal deny list it warns against, and the entry limit. */
const LINT_CONFIG = configFlags(['internalDeny', 'maxPolicyEntries', 'presetsDir']);
import { readPolicyFile } from './policy-file.js';

export const LINT_HELP = `Usage: moat lint [options] FILE...

Validates policy files (JSON shaped like the PUT /sandboxes/{id}/network body). Errors make a
file invalid: the server would answer 400 to it. Warnings point at entries that are valid but
probably not what was meant: repeated or shadowed entries, wildcards on public suffixes
(*.co.uk), deny entries that an allow entry overrides, entries the internal deny list overrides.

Messages go to standard error, one per problem, as FILE: error|warning: MESSAGE.
A summary line per file goes to standard output. A file that is not JSON and whose name does
not end in .json (a README beside the policies: moat lint policies/*) is skipped with a note.

Options:
  --strict                  treat warnings as errors
${LINT_CONFIG.help}
  -h, --help                this help

Exit status: 0 when every file is valid (warnings allowed unless --strict), 2 otherwise.`;

export async function lint(args: string[], io: CliIO): Promise<number> {
  const { values, positionals } = parseOptions({
    args,
    allowPositionals: true,
    options: {
      strict: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
      ...LINT_CONFIG.options,
    },
  });
  if (values.help) {
    io.stdout.write(`${LINT_HELP}\n`);
    return EXIT.ok;
  }
  if (positionals.length === 0) throw new UsageError('moat lint needs at least one policy file');
  warnUnknownEnvironment(io);
  const config = configFrom(values, io);
  const internal = compileInternalDenyList(config.internalDeny);
  const presets = loadPresets(config.presetsDir);
  if (!presets.ok) {
    io.stderr.write(`error: ${presets.error}\n`);
    return EXIT.usage;
  }
  let failed = false;
  for (const path of positionals) {
    // policies/* names policies/presets/ too: preset files are checked when presets load.
    if (statSync(path, { throwIfNoEntry: false })?.isDirectory()) {
      io.stdout.write(`${path}: skipped (a folder)\n`);
      continue;
    }
    const file = readPolicyFile(path, {
      maxEntries: config.maxPolicyEntries,
      presets: presets.value,
    });
    if (!file.ok && file.notJson && !path.endsWith('.json')) {
      io.stdout.write(`${path}: skipped (not JSON, and not named *.json)\n`);
      continue;
    }
    if (!file.ok) {
      for (const problem of file.problems) io.stderr.write(`${path}: error: ${problem}\n`);
      io.stdout.write(
        `${path}: invalid (${file.problems.length} error${file.problems.length === 1 ? '' : 's'})\n`,
      );
      failed = true;
      continue;
    }
    const warnings = lintPolicy(file.rules, internal);
    const severity = values.strict ? 'error' : 'warning';
    for (const warning of warnings) io.stderr.write(`${path}: ${severity}: ${warning.message}\n`);
    if (values.strict && warnings.length > 0) failed = true;
    const { allowOut, denyOut } = file.rules;
    io.stdout.write(
      `${path}: ${values.strict && warnings.length > 0 ? 'invalid' : 'ok'} (${allowOut.length} allowOut, ${denyOut.length} denyOut, ${warnings.length} warning${warnings.length === 1 ? '' : 's'})\n`,
    );
  }
  return failed ? EXIT.usage : EXIT.ok;
}
