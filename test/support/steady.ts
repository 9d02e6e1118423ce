import { setTimeout as delay } from 'node:timers/promises';

/**
 * Polls `read` every `everyMs` until it has returned the same value for `quietMs`, and resolves
 * that value; throws once `withinMs` pass first. Backpressure tests wait with this instead of a
 * fixed sleep: a sender that is held back stops moving (on a slow machine, later), where one that
 * is not keeps going until it runs out of things to send.
 */
export async function steadyValue(
  read: () => number | Promise<number>,
  options: { quietMs: number; withinMs: number; everyMs?: number; what: string },
): Promise<number> {
  const { quietMs, withinMs, everyMs = 100, what } = options;
  const deadline = performance.now() + withinMs;
  let value = await read();
  let since = performance.now();
  for (;;) {
    await delay(everyMs);
    const next = await read();
    const now = performance.now();
    if (next !== value) {
      value = next;
      since = now;
    } else if (now - since >= quietMs) {
      return value;
    }
    if (now > deadline)
      throw new Error(`${what} still changing after ${withinMs} ms (last ${value})`);
  }
}
