/**
 * Programs a test leaves running in an SDK sandbox (its python sockets, which only the kernel
 * can hold), and how soon a publish ended their connections.
 */
import type { Sandbox } from 'e2b';
import { expect } from 'vitest';
import { until } from './native-relay.js';

/** A Python program as one shell word (single-quoted; newlines kept). */
export const python = (code: string) => `python3 -u -c '${code.replaceAll("'", `'"'"'`)}'`;

/**
 * A program for `watching`: `opening` (Python that connects `s`), then it only reads, so
 * nothing it sends could be refused and only Moat can end the connection. Prints `closed <ms>`
 * when it ends, or `still open after 5 s`.
 */
export const onlyReading = (opening: string) =>
  [
    'import socket, time',
    opening,
    "s.settimeout(5); print('open', flush=True)",
    'try:',
    '  s.recv(1)',
    'except TimeoutError:',
    "  print('still open after 5 s', flush=True); exit()",
    'except OSError: pass',
    "print('closed', int(time.time() * 1000), flush=True)",
  ].join('\n');

export type Watched = Awaited<ReturnType<typeof watching>>;

/** Runs a program that prints `open`, then a line per event, in the background. */
export async function watching(sandbox: Sandbox, code: string) {
  let printed = '';
  const handle = await sandbox.commands.run(python(code), {
    background: true,
    onStdout: (data: string) => void (printed += data),
  });
  const lines = () => printed.split('\n').filter((line) => line !== '');
  await until(() => lines().includes('open'), 10_000);
  expect(lines(), 'the program did not print open within 10 s').toContain('open');
  return { handle, lines };
}

/**
 * Each watched program (from `watching`) printed `closed <ms>` after the publish was asked for
 * and less than 100 ms after its 204.
 */
export async function endedWithin100ms(
  watched: Record<string, Watched>,
  requestedAt: number,
  appliedAt: number,
): Promise<void> {
  for (const [label, { handle, lines }] of Object.entries(watched)) {
    await handle.wait().catch(() => undefined);
    const closed = lines().find((line) => line.startsWith('closed '));
    expect(closed, `${label}: ${lines().join('\n')}`).toBeDefined();
    const closedAt = Number(closed!.split(' ')[1]);
    expect(closedAt, label).toBeGreaterThanOrEqual(requestedAt);
    expect(closedAt - appliedAt, label).toBeLessThan(100);
  }
}
