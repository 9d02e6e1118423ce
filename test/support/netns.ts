/** Whether kernel enforcement can be tested here: root, iproute2, nftables and confinement. */
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { confinementWorks, namespacesWork } from '../../src/runtime/index.js';

/** Why confined sandboxes cannot run here (printed once per suite); undefined when they can. */
export function confinementSkipReason(suite: string): string | undefined {
  const folder = mkdtempSync(path.join(os.tmpdir(), 'moat-probe-'));
  try {
    const works = confinementWorks(folder);
    if (!works.ok) console.warn(`${suite}: skipped: ${works.reason}`);
    return works.ok ? undefined : works.reason;
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
}

/** Why namespace tests cannot run on this machine, printed once per suite; undefined when they can. */
export function namespaceSkipReason(suite: string): string | undefined {
  const namespaces = namespacesWork();
  if (!namespaces.ok) {
    console.warn(`${suite}: skipped: ${namespaces.reason}`);
    return namespaces.reason;
  }
  return confinementSkipReason(suite);
}

export { hostNetworkLines } from '../../bench/lib/world.js';

/** The scope a Moat names its namespaces, links and host table by, for its namespace pool. */
export const poolScope = (pool: string) =>
  createHash('sha256').update(pool).digest('hex').slice(0, 6);

/**
 * A server of the host's on every address it has (answering "host"), which no sandbox may
 * reach: its port, and its close.
 */
export async function hostServer(): Promise<{ port: number; close: () => void }> {
  const server = net.createServer((socket) => socket.end('host\n'));
  await new Promise<void>((resolve) => server.listen(0, '0.0.0.0', resolve));
  return { port: (server.address() as net.AddressInfo).port, close: () => server.close() };
}
