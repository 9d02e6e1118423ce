import type { Readable, Writable } from 'node:stream';
import { type ConfigSources, loadConfig, type MoatConfig, SETTINGS } from '../config.js';

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

/** parseArgs option definitions for the configuration flags every command accepts. */
export const CONFIG_OPTIONS = Object.fromEntries([
  ['config', { type: 'string' as const }],
  ...SETTINGS.map((s) => [s.flag, { type: 'string' as const }]),
]) as Record<string, { type: 'string' }>;

/** Settings that are true or false: given bare (`--unconfined-sandboxes`), they mean true. */
const SWITCHES = new Set(
  SETTINGS.filter((s) => s.metavar === 'true|false').map((s) => `--${s.flag}`),
);

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

export const CONFIG_HELP = [
  '  --config FILE',
  wrap('JSON config file whose keys are the setting names of README "Configuration"'),
  ...SETTINGS.map(
    (s) => `  --${s.flag} ${s.metavar}\n${wrap(`${s.help}. Env ${s.env}, default ${s.default}.`)}`,
  ),
].join('\n');

/** Loads the configuration from the parsed flags and the environment, or throws UsageError. */
export function configFrom(values: Record<string, unknown>, io: CliIO): MoatConfig {
  const flags: Record<string, string | undefined> = {};
  for (const s of SETTINGS) flags[s.flag] = values[s.flag] as string | undefined;
  const sources: ConfigSources = {
    flags,
    env: io.env,
    ...(typeof values.config === 'string' ? { file: values.config } : {}),
  };
  const config = loadConfig(sources);
  if (!config.ok) throw new UsageError(config.error);
  return config.value;
}
