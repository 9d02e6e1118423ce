import type { Readable, Writable } from 'node:stream';
import { type ParseArgsConfig, parseArgs } from 'node:util';
import { type ConfigSources, loadConfig, type MoatConfig } from '../config.js';
import { SETTINGS } from '../config-settings.js';
import { didYouMean } from './did-you-mean.js';

export interface CliIO {
  readonly stdin: Readable & { isTTY?: boolean };
  readonly stdout: Writable;
  readonly stderr: Writable;
  readonly env: Readonly<Record<string, string | undefined>>;
}

/** Exit codes shared by every command. */
/** `denied` (a check that denies) and `failed` (serve could not start) share 1. */
export const EXIT = { ok: 0, denied: 1, failed: 1, usage: 2 } as const;

/** Thrown for a usage error; the CLI prints the message (and a hint) and exits 2. */
export class UsageError extends Error {}

/** Settings that are true or false: given bare (`--unconfined-sandboxes`), they mean true. */
const SWITCHES = new Set(
  SETTINGS.filter((s) => s.metavar === 'true|false').map((s) => `--${s.flag}`),
);

/**
 * parseArgs, with a misspelt option told the option it probably meant (as a misspelt MOAT_*
 * variable is): `Unknown option '--dns-listn'; did you mean --dns-listen?`.
 */
export function parseOptions<T extends ParseArgsConfig>(
  config: T,
): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs(config);
  } catch (error) {
    const given = /^Unknown option '(--[^']+)'/.exec((error as Error).message)?.[1];
    const known = Object.keys(config.options ?? {}).map((name) => `--${name}`);
    const meant = given === undefined ? undefined : didYouMean(given, known);
    if (meant === undefined) throw error;
    throw new UsageError(`Unknown option '${given}'; did you mean ${meant}?`);
  }
}

/** `args` with every bare switch written `--name=true` (parseArgs wants a value for settings). */
export function switchesFilled(args: readonly string[]): string[] {
  return args.map((arg, i) => {
    const next = args[i + 1];
    return SWITCHES.has(arg) && next !== 'true' && next !== 'false' ? `${arg}=true` : arg;
  });
}

/** Wraps help text at 72 columns under a 6-space indent. */
const wrap = (text: string): string =>
  text
    .split(' ')
    .reduce<string[]>((lines, word) => {
      const last = lines.at(-1);
      if (last !== undefined && last.length + word.length < 72)
        lines[lines.length - 1] = `${last} ${word}`;
      else lines.push(word);
      return lines;
    }, [])
    .map((line) => `      ${line}`)
    .join('\n');

type SettingKey = (typeof SETTINGS)[number]['key'];

/** Settings whose value is a comma-separated list: a repeated flag adds to it. */
const LISTS = new Set<SettingKey>(['internalDeny', 'allowHostPorts', 'dnsUpstream', 'apiKeys']);

/**
 * The configuration flags of one command (every setting when `keys` is absent): parseArgs
 * options, and their --help text generated from the settings table. Every command still reads
 * the whole configuration from --config and MOAT_*; it takes flags only for what it uses.
 */
export function configFlags(keys?: readonly SettingKey[]) {
  const settings = SETTINGS.filter((s) => keys === undefined || keys.includes(s.key));
  return {
    options: Object.fromEntries([
      ['config', { type: 'string' as const }],
      ...settings.map((s) => [s.flag, { type: 'string' as const, multiple: true as const }]),
    ]) as Record<string, { type: 'string'; multiple?: true }>,
    help: [
      '  --config FILE',
      wrap('JSON config file whose keys are the setting names of docs/configuration.md'),
      ...settings.map(
        (s) =>
          `  --${s.flag} ${s.metavar}\n${wrap(`${s.help}. Env ${s.env}, default ${s.default}${LISTS.has(s.key) ? '; repeat the flag to add entries' : ''}.`)}`,
      ),
    ].join('\n'),
  };
}

/** Loads the configuration from the parsed flags and the environment, or throws UsageError. */
export function configFrom(values: Record<string, unknown>, io: CliIO): MoatConfig {
  const flags: Record<string, string | undefined> = {};
  for (const s of SETTINGS) {
    const given = values[s.flag] as string[] | undefined;
    if (given === undefined) continue;
    if (given.length > 1 && !LISTS.has(s.key))
      throw new UsageError(
        `--${s.flag} is given ${given.length} times (${given.map((v) => JSON.stringify(v)).join(', ')}); it takes one value`,
      );
    flags[s.flag] = given.join(',');
  }
  const sources: ConfigSources = {
    flags,
    env: io.env,
    ...(typeof values.config === 'string' ? { file: values.config } : {}),
  };
  const config = loadConfig(sources);
  if (!config.ok) throw new UsageError(config.error);
  return config.value;
}
