import type { Logger } from 'pino';

/**
 * A warning that can come in floods (a send buffer full under load, once per batch): logged
 * when it first comes, then at most once per `everyMs`, with how many times it came since the
 * one before (`occurrences`), so the log neither floods nor hides that it happened.
 */
export function warnEvery(
  logger: Logger,
  message: string,
  everyMs: number,
  now: () => number,
): (error: Error) => void {
  let lastLogged = -Infinity;
  let occurrences = 0;
  return (error) => {
    occurrences++;
    const at = now();
    if (at - lastLogged < everyMs) return;
    logger.warn({ err: error, occurrences }, message);
    lastLogged = at;
    occurrences = 0;
  };
}
