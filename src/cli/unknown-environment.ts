/** MOAT_* variables that no setting reads: a misspelt one is named, not silently ignored. */
import { SETTINGS } from '../config-settings.js';
import type { CliIO } from './io.js';

/** Edits (insert, delete, replace) between two short strings. */
function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++)
      next[j] = Math.min(
        row[j]! + 1,
        next[j - 1]! + 1,
        row[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    row = next;
  }
  return row[b.length]!;
}

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
    .map((variable) => {
      const [closest] = known
        .map((name) => ({ name, distance: editDistance(variable, name) }))
        .sort((a, b) => a.distance - b.distance);
      return { variable, didYouMean: closest && closest.distance <= 3 ? closest.name : undefined };
    });
}

/** How an unknown variable is told: `MOAT_DNS_LISTN is not a Moat setting; did you mean ...?` */
export const unknownEnvironmentMessage = (unknown: {
  variable: string;
  didYouMean: string | undefined;
}): string =>
  `${unknown.variable} is not a Moat setting and is ignored${unknown.didYouMean ? `; did you mean ${unknown.didYouMean}?` : ''}`;

/** check and lint say it on standard error (serve logs it). */
export function warnUnknownEnvironment(io: CliIO): void {
  for (const unknown of unknownEnvironment(io.env))
    io.stderr.write(`moat: warning: ${unknownEnvironmentMessage(unknown)}\n`);
}
