/**
 * Network-only sandboxes: the built-in template `network-only` adopts a network namespace Moat
 * did not make (a VM's, a container's) and holds it to a policy like any sandbox, with no
 * process, no file and no envd. What the create request must say for it, what it shows, and
 * what it refuses.
 */
import { AddressPool } from '../enforce/index.js';
import { parseIP } from '../policy/index.js';
import {
  type AdoptRequest,
  DEFAULT_IFNAME,
  devicesOf,
  type EnforcementMode,
  type GuestLink,
  INNER_LINK,
} from '../runtime/index.js';
import type { SandboxRecord } from './records.js';
import { type CreateRequest, SandboxError } from './requests.js';

export const NETWORK_ONLY = 'network-only';

/**
 * A network-only sandbox's expiry when its create request gave no timeout: none, written as the
 * last millisecond an RFC 3339 date can hold (the API shows endAt 9999-12-31T23:59:59.999Z).
 */
export const NO_EXPIRY = Date.UTC(9999, 11, 31, 23, 59, 59, 999);

/**
 * The namespace a create request asks Moat to adopt, or undefined for a sandbox Moat runs;
 * refuses `netns`/`ifname`/`guestLink` with another template, `network-only` without `netns`,
 * a bad `ifname` or `guestLink`, what a network-only sandbox cannot do (pause), and, without namespace enforcement,
 * the template itself (501).
 */
export function adoptionOf(
  request: CreateRequest,
  enforcement: { readonly mode: EnforcementMode; readonly reason: string },
): AdoptRequest | undefined {
  const { netns, ifname, guestLink } = request;
  if (request.templateID !== NETWORK_ONLY) {
    const field = [
      ['netns', netns],
      ['ifname', ifname],
      ['guestLink', guestLink],
    ].find(([, value]) => value !== undefined)?.[0];
    if (field === undefined) return undefined;
    throw new SandboxError(
      400,
      `body.${field} is only for the template ${NETWORK_ONLY} (templateID is ${JSON.stringify(request.templateID)})`,
    );
  }
  if (netns === undefined)
    throw new SandboxError(
      400,
      `the template ${NETWORK_ONLY} needs body.netns: the path of the network namespace to adopt (/run/netns/<name> or /proc/<pid>/ns/net)`,
    );
  if (enforcement.mode !== 'namespace')
    throw new SandboxError(
      501,
      `the template ${NETWORK_ONLY} needs namespace enforcement; this Moat enforces with its proxy only (${enforcement.reason})`,
    );
  const adopt = {
    netns,
    ifname: ifname ?? DEFAULT_IFNAME,
    // "routed" is the default, and not stored.
    ...(guestLink === undefined || guestLink === 'routed'
      ? {}
      : { guestLink: guestLink as GuestLink }),
  };
  try {
    devicesOf(adopt);
  } catch (error) {
    throw new SandboxError(400, `body.${(error as Error).message}`);
  }
  if (request.autoPause === true)
    throw new SandboxError(
      400,
      `autoPause is not possible for the template ${NETWORK_ONLY}: it has no processes to pause (its timeout ends it)`,
    );
  return adopt;
}

/** Refuses (501) what needs a sandbox's processes or files, for a network-only sandbox. */
export function refuseNetworkOnly(record: SandboxRecord, what: string): void {
  if (record.link !== undefined) throw networkOnlyRefusal(record.sandboxID, what);
}

export const networkOnlyRefusal = (sandboxID: string, what: string) =>
  new SandboxError(
    501,
    `sandbox ${sandboxID} runs the template ${NETWORK_ONLY}: it has no processes or files${what === '' ? '' : ` to ${what}`}`,
  );

/**
 * A network-only sandbox's link as the API shows it: the namespace and interface as given, the
 * address the interface's holder uses with its prefix, and the router (its default route's next
 * hop): routed, the sandbox's address and the host's end of Moat's link; with guestLink
 * "redirect", the guest's address and Moat's inner end (the namespace translates the one to the
 * sandbox's address).
 */
export function linkView(record: SandboxRecord):
  | {
      readonly netns: string;
      readonly ifname: string;
      readonly address: string;
      readonly router: string;
      readonly guestLink: GuestLink;
    }
  | undefined {
  if (record.link === undefined) return undefined;
  const { netns, ifname, guestLink = 'routed' } = record.link;
  if (guestLink === 'redirect') {
    const { guest, router, prefixLength } = INNER_LINK;
    return { netns, ifname, address: `${guest}/${prefixLength}`, router, guestLink };
  }
  const address = parseIP(record.sourceAddress);
  return {
    netns,
    ifname,
    guestLink,
    address: `${record.sourceAddress}/30`,
    router: address.ok ? AddressPool.offset(address.value, -1).text : '',
  };
}
