/** Shell one-liners that tests run inside a sandbox through the E2B SDK, as a user's program would. */
import { CommandExitError, type Sandbox } from 'e2b';
import { WORLD_PORTS } from '../../bench/lib/world.js';

/** Runs a bash script inside the sandbox: its stdout, or `exit N: <stderr>` when it failed. */
export async function shellOutput(
  sandbox: Sandbox,
  script: string,
  timeoutMs = 20_000,
): Promise<string> {
  try {
    return (await sandbox.commands.run(script, { timeoutMs })).stdout;
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error;
    return `exit ${error.exitCode}: ${error.stderr.trim()}`;
  }
}

/** TCP echo through bash's /dev/tcp (no proxy variables read): `ping` when it came back. */
export const tcpEchoScript = (host: string, port = WORLD_PORTS.echo) =>
  `timeout 4 bash -c 'exec 3<>/dev/tcp/${host}/${port} && printf ping >&3 && timeout 3 head -c4 <&3'`;
