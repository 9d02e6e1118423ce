/**
 * Programs a test leaves running in an SDK sandbox (its python sockets, which only the kernel
 * can hold), and whether a publish ended their connections by its 204.
 *
 * What is measured is the kernel's view, not when the program woke: on a loaded host a program
 * can wake a few hundred ms after its socket ended, which says nothing of Moat. So a connection
 * is checked gone from the namespace's socket table right after the 204, and a datagram's time
 * is when the kernel received it (SO_TIMESTAMP), not when the program read it.
 */
import { spawnSync } from 'node:child_process';
import type { Sandbox } from 'e2b';
import { expect } from 'vitest';
import { until } from './native-relay.js';

/** A Python program as one shell word (single-quoted; newlines kept). */
export const python = (code: string) => `python3 -u -c '${code.replaceAll("'", `'"'"'`)}'`;

/** Python that prints `port <n>`, the local port of the connected socket `s` (see `endedByThe204`). */
export const PRINT_PORT = "print('port', s.getsockname()[1], flush=True)";

/**
 * A program for `watching`: `opening` (Python that connects `s`), then it only reads, so
 * nothing it sends could be refused and only Moat can end the connection. Prints `closed <ms>`
 * when it ends, or `still open after 5 s`.
 */
export const onlyReading = (opening: string) =>
  [
    'import socket, time',
    opening,
    PRINT_PORT,
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
 * Each watched program's connection (its `port <n>` line) is gone from the sandbox's namespace
 * when the PUT's 204 has been read (Moat ends them before it answers), and the program then saw
 * it end: `closed <ms>` after the publish was asked for, and not by its own 5 s timeout.
 */
export async function endedByThe204(
  netns: string,
  watched: Record<string, Watched>,
  requestedAt: number,
  appliedAt: number,
): Promise<void> {
  const ports = Object.entries(watched).map(([label, { lines }]) => {
    const line = lines().find((printed) => printed.startsWith('port '));
    expect(line, `${label} printed no port line: ${lines().join('\n')}`).toBeDefined();
    return Number(line!.split(' ')[1]);
  });
  const filter = ports.map((port) => `sport = :${port}`).join(' or ');
  const listed = spawnSync(
    '/usr/bin/nsenter',
    [`--net=${netns}`, '--', '/usr/bin/ss', '-Htan', 'exclude', 'time-wait', `( ${filter} )`],
    { encoding: 'utf8', timeout: 15_000 },
  );
  expect(listed.status, listed.stderr).toBe(0);
  expect(listed.stdout, 'connections still in the namespace after the 204').toBe('');
  for (const [label, { handle, lines }] of Object.entries(watched)) {
    await handle.wait().catch(() => undefined);
    const closed = lines().find((line) => line.startsWith('closed '));
    expect(closed, `${label}: ${lines().join('\n')}`).toBeDefined();
    const closedAt = Number(closed!.split(' ')[1]);
    expect(closedAt, label).toBeGreaterThanOrEqual(requestedAt);
    console.log(
      `${label}: the program saw its connection end ${closedAt - appliedAt} ms after the 204`,
    );
  }
}

/**
 * A program that asks `host:port` (a UDP talker answering one datagram with a stream, one
 * every 10 ms) and prints `open`, then for 2 s the kernel's receive time (ms) of each datagram,
 * then `done`.
 */
export const udpArrivals = (host: string, port: number) =>
  [
    'import socket, struct, time',
    // SO_TIMESTAMP is 29 on Linux (Python has no name for it); its message is a timeval.
    's = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.2); s.setsockopt(socket.SOL_SOCKET, 29, 1)',
    `s.connect(('${host}', ${port})); s.send(b'go')`,
    "s.recv(64); print('open', flush=True)",
    'end = time.time() + 2',
    'while time.time() < end:',
    '  try:',
    '    _, extra, _, _ = s.recvmsg(64, 64)',
    '  except OSError: continue',
    '  sec, usec = struct.unpack("qq", extra[0][2][:16])',
    '  print(sec * 1000 + usec // 1000, flush=True)',
    "print('done', flush=True)",
  ].join('\n');

/** The receive times `udpArrivals` printed. */
export const arrivalsOf = (printed: string[]) =>
  printed.filter((line) => /^\d+$/.test(line)).map(Number);
