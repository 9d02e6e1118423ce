/** What tests read of this host: a free loopback port, the command lines of its processes. */
import { execFileSync } from 'node:child_process';
import net from 'node:net';

/** A TCP port of 127.0.0.1 free a moment ago (the kernel chose it). */
export async function freePort(): Promise<number> {
  const probe = net.createServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const { port } = probe.address() as net.AddressInfo;
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

/** Command lines of every process on the host (sandboxes' processes among them), trimmed. */
export const hostProcesses = (): string[] =>
  execFileSync('ps', ['-eo', 'args'])
    .toString()
    .split('\n')
    .map((l) => l.trim());
