/** MOAT_* variables that no setting reads: a misspelt one is named, not silently ignored. */
import { SETTINGS } from '../config-settings.js';
import { didYouMean } from './did-you-mean.js';
import type { CliIO } from './io.js';

/**
 * MOAT_* variables in the environment that are no setting (a misspelt one would otherwise be
 * ignored silently, unlike a misspelt config file key), each with the closest setting's name
 * when it is a few edits away.
 */
export function unknownEnvironment(
  env: CliIO['env'],
): Array<{ readonly variable: string; readonly didYouMean: string | undefined }> {
  const known = SETTINGS.map((s) => s.env);
  return Object.keys(env)
    .filter((name) => name.startsWith('MOAT_') && !known.includes(name))
    .sort()
    .map((variable) => ({ variable, didYouMean: didYouMean(variable, known) }));
}

/** How an unknown variable is told: `MOAT_DNS_LISTN is not a Moat setting; did you mean ...?` */
export const unknownEnvironmentMessage = (unknown: {
  variable: string;
  didYouMean: string | undefined;
}): string =>
  `${unknown.variable} is not a Moat setting and is ignored${unknown.didYouMean ? `; did you mean ${unknown.didYouMean}?` : ''}`;

/** Every command says it on standard error, for people (serve logs it as well). */
export function warnUnknownEnvironment(io: CliIO): void {
  for (const unknown of unknownEnvironment(io.env))
    io.stderr.write(`moat: warning: ${unknownEnvironmentMessage(unknown)}\n`);
}
