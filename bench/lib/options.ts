/**
 * The command line of every benchmark. A bench declares each option once (its default and a
 * one-line help); `readOptions` then answers `--help` from those declarations and refuses an
 * unknown option or a bad value with one line and exit 2, before anything is started, so that
 * a typo never costs a run or ends in a stack.
 */
import { parseArgs } from 'node:util';

/** One option: how it reads its text, what it is when absent, and how --help shows it. */
export interface Option<T> {
  /** How the value is written in the help (`N`, `LIST`); undefined for a flag, which takes none. */
  readonly value: string | undefined;
  readonly help: string;
  readonly fallback: T;
  /** The default and the allowed values as the help shows them ('' for nothing to add). */
  readonly shown: string;
  /** The value from its text; throws a BadValue saying what is wrong. */
  readonly read: (text: string) => T;
}

/** What `readOptions` returns for `S`: each option's value, typed by its kind. */
export type OptionValues<S> = { readonly [K in keyof S]: S[K] extends Option<infer T> ? T : never };

/** A value an option refuses; the message follows the option's name. */
export class BadValue extends Error {}

/** Present or absent: false by default. */
export function flag(help: string): Option<boolean> {
  return { value: undefined, help, fallback: false, shown: '', read: () => true };
}

/** Free text, used as it is. */
export function text<T extends string | undefined>(spec: {
  readonly default: T;
  readonly value: string;
  readonly help: string;
}): Option<string | T> {
  const shown = spec.default ? `default ${spec.default}` : '';
  return { value: spec.value, help: spec.help, fallback: spec.default, shown, read: (t) => t };
}

/** A whole number from `min` to `max`. */
export function whole(spec: {
  readonly default: number;
  readonly min: number;
  readonly max: number;
  readonly help: string;
}): Option<number> {
  const { min, max } = spec;
  return {
    value: 'N',
    help: spec.help,
    fallback: spec.default,
    shown: `default ${spec.default}; ${min} to ${max}`,
    read: (t) => {
      const n = Number(t);
      if (t.trim() === '' || !Number.isInteger(n) || n < min || n > max)
        throw new BadValue(`must be a whole number from ${min} to ${max}`);
      return n;
    },
  };
}

/** One of `known`. */
export function choice<T extends string>(spec: {
  readonly known: readonly T[];
  readonly default: T;
  readonly help: string;
}): Option<T> {
  return {
    value: spec.known.join('|'),
    help: spec.help,
    fallback: spec.default,
    shown: `default ${spec.default}`,
    read: (t) => {
      if (!spec.known.includes(t as T))
        throw new BadValue(`must be one of ${spec.known.join(', ')}`);
      return t as T;
    },
  };
}

/** A comma-separated list of items from `known`, in the order given. */
export function list<T extends string>(spec: {
  readonly known: readonly T[];
  readonly default: readonly T[];
  readonly help: string;
}): Option<readonly T[]> {
  return {
    value: 'LIST',
    help: spec.help,
    fallback: spec.default,
    shown: `default ${spec.default.join(',')}; of ${spec.known.join(', ')}`,
    read: (t) =>
      t.split(',').map((item) => {
        const name = item.trim();
        if (!spec.known.includes(name as T))
          throw new BadValue(`has an unknown item ${JSON.stringify(name)}`);
        return name as T;
      }),
  };
}

/** Prints one line for a command line the bench cannot run with, and exits 2. */
export function refuse(command: string, problem: string): never {
  process.stderr.write(`${command}: ${problem}; see --help\n`);
  process.exit(2);
}

/**
 * The options of `npm run <command>` from process.argv: `--help` (or `-h`) prints the usage,
 * `summary` and every option, and exits 0; a command line that does not fit `spec` is refused.
 */
export function readOptions<S extends Readonly<Record<string, Option<unknown>>>>(
  command: string,
  summary: string,
  spec: S,
): OptionValues<S> {
  const { tokens } = parseArgs({
    options: Object.fromEntries(
      Object.entries(spec).map(([name, o]) => [name, { type: o.value ? 'string' : 'boolean' }]),
    ) as Record<string, { type: 'string' | 'boolean' }>,
    strict: false,
    allowPositionals: true,
    tokens: true,
  });
  const values = Object.fromEntries(Object.entries(spec).map(([name, o]) => [name, o.fallback]));
  for (const token of tokens) {
    if (token.kind === 'option-terminator') continue;
    if (token.kind === 'positional') refuse(command, `unexpected argument ${token.value}`);
    if (token.name === 'help' || token.name === 'h') {
      process.stdout.write(help(command, summary, spec));
      process.exit(0);
    }
  }
  for (const token of tokens) {
    if (token.kind !== 'option') continue;
    const option = Object.hasOwn(spec, token.name) ? spec[token.name] : undefined;
    if (option === undefined) refuse(command, `unknown option ${token.rawName}`);
    if (option.value === undefined && token.value !== undefined)
      refuse(command, `${token.rawName} takes no value`);
    // parseArgs takes the next word as the value even when it is another option.
    const missing =
      token.value === undefined || (!token.inlineValue && token.value.startsWith('-'));
    if (option.value !== undefined && missing)
      refuse(command, `${token.rawName} needs a value (${token.rawName}=${option.value})`);
    try {
      values[token.name] = option.read(token.value ?? '');
    } catch (error) {
      if (!(error instanceof BadValue)) throw error;
      refuse(command, `${token.rawName} ${error.message}`);
    }
  }
  return values as OptionValues<S>;
}

function help(command: string, summary: string, spec: Readonly<Record<string, Option<unknown>>>) {
  const rows: [string, string][] = Object.entries(spec).map(([name, o]) => [
    o.value === undefined ? `--${name}` : `--${name}=${o.value}`,
    o.shown === '' ? o.help : `${o.help} (${o.shown})`,
  ]);
  rows.push(['--help, -h', 'print this and exit']);
  const width = Math.max(...rows.map(([left]) => left.length)) + 2;
  return [
    `npm run ${command} -- [options]`,
    '',
    summary.trim(),
    '',
    'Options:',
    ...rows.map(([left, right]) => `  ${left.padEnd(width)}${right}`),
    '',
  ].join('\n');
}
