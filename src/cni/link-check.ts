/**
 * The plugin's looks inside the container's namespace at the interface Moat made there: its
 * hardware address (runtimes such as Podman want it in the result) and, for CHECK, whether it
 * still holds the sandbox's address. Absolute paths: a CNI runtime gives its plugins no PATH.
 */
import { execFile } from 'node:child_process';
import type { AttachedSandbox } from './result.js';

const NSENTER = '/usr/bin/nsenter';
const IP = '/usr/sbin/ip';

/** `ip -o ARGS` inside `netns`: its output, or the error it printed. */
function ipIn(netns: string, args: string[]): Promise<{ ok: boolean; text: string }> {
  return new Promise((resolve) => {
    execFile(
      NSENTER,
      [`--net=${netns}`, '--', IP, '-o', ...args],
      { timeout: 5_000 },
      (error, stdout, stderr) =>
        resolve(
          error
            ? { ok: false, text: String(stderr).trim() || error.message }
            : { ok: true, text: String(stdout) },
        ),
    );
  });
}

/** The interface's MAC address, or undefined when it cannot be read. */
export async function macOf(netns: string, ifname: string): Promise<string | undefined> {
  const shown = await ipIn(netns, ['link', 'show', 'dev', ifname]);
  return shown.ok ? /link\/ether ([0-9a-f:]{17})/.exec(shown.text)?.[1] : undefined;
}

/**
 * Undefined when `ifname` in `netns` holds the link's address (with guestLink "redirect": is
 * there, its address being the guest's); else what is wrong.
 */
export async function linkProblem(
  netns: string,
  attached: AttachedSandbox,
): Promise<string | undefined> {
  const { ifname, address } = attached.link;
  const shown = await ipIn(netns, ['-4', 'addr', 'show', 'dev', ifname]);
  if (!shown.ok) return `no interface ${ifname} in ${netns}: ${shown.text}`;
  if (attached.link.guestLink === 'redirect') return undefined;
  if (!shown.text.split(/\s+/).includes(address))
    return `interface ${ifname} in ${netns} does not hold the sandbox's address ${address}`;
  return undefined;
}
