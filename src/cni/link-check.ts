/**
 * CHECK's look inside the container's namespace: does the interface Moat made there still hold
 * the sandbox's address? Absolute paths: a CNI runtime gives its plugins no PATH.
 */
import { execFile } from 'node:child_process';
import type { AttachedSandbox } from './result.js';

const NSENTER = '/usr/bin/nsenter';
const IP = '/usr/sbin/ip';

/** Undefined when `ifname` in `netns` holds the link's address; else what is wrong. */
export function linkProblem(netns: string, attached: AttachedSandbox): Promise<string | undefined> {
  const { ifname, address } = attached.link;
  return new Promise((resolve) => {
    execFile(
      NSENTER,
      [`--net=${netns}`, '--', IP, '-o', '-4', 'addr', 'show', 'dev', ifname],
      { timeout: 5_000 },
      (error, stdout, stderr) => {
        if (error)
          resolve(`no interface ${ifname} in ${netns}: ${String(stderr).trim() || error.message}`);
        else if (!String(stdout).split(/\s+/).includes(address))
          resolve(`interface ${ifname} in ${netns} does not hold the sandbox's address ${address}`);
        else resolve(undefined);
      },
    );
  });
}
