/**
 * Readiness for GET /ready: the store takes writes and every listener still accepts. The API
 * listener is left out (it is answering the question).
 */
import net from 'node:net';
import { formatHostPort, type HostPort } from '../net/index.js';
import type { Store } from '../store/index.js';

const PROBE_TIMEOUT_MS = 1000;

/** Where to reach a listener from this host: its own address, loopback for an unspecified one. */
const reachable = (at: HostPort): HostPort =>
  at.host === '0.0.0.0'
    ? { ...at, host: '127.0.0.1' }
    : at.host === '::'
      ? { ...at, host: '::1' }
      : at;

/** Connects to a TCP listener and hangs up at once; false when it refuses or does not answer. */
function accepts(at: HostPort): Promise<boolean> {
  const { host, port } = reachable(at);
  return new Promise((resolve) => {
    const socket = net.connect({ host, port, timeout: PROBE_TIMEOUT_MS });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.once('connect', () => done(true));
    socket.once('timeout', () => done(false));
    socket.once('error', () => done(false));
  });
}

/** Why Moat is not ready, or undefined; `listeners` names each TCP listener to probe. */
export async function notReady(
  store: Store,
  listeners: () => ReadonlyArray<readonly [string, HostPort]>,
): Promise<string | undefined> {
  const storeProblem = await store.notReady();
  if (storeProblem !== undefined) return `store: ${storeProblem}`;
  const probed = await Promise.all(
    listeners().map(async ([name, at]) =>
      (await accepts(at)) ? undefined : ([name, at] as const),
    ),
  );
  const down = probed.find((entry) => entry !== undefined);
  return down && `${down[0]} ${formatHostPort(down[1])} does not accept connections`;
}
