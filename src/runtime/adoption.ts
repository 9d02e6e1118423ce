/**
 * Network-only sandboxes: what Moat checks before it adopts a network namespace it did not make
 * (a VM's, a container's), and how it tells that a path still names the namespace it adopted.
 * A namespace is known by its identity on the nsfs file system (device and inode), which a
 * reused pid or a re-made `/run/netns` name cannot fake.
 */
import { stat } from 'node:fs/promises';

/** The namespace Moat adopts for a network-only sandbox, as the create request names it. */
export interface AdoptRequest {
  /** `/run/netns/<name>`, `/proc/<pid>/ns/net`, or any other file naming a network namespace. */
  readonly netns: string;
  /**
   * The name of Moat's end of the link inside the namespace; with `guestLink` "redirect", the
   * guest's end of Moat's inner pair (see GuestLink).
   */
  readonly ifname: string;
  /** Absent: "routed". */
  readonly guestLink?: GuestLink;
}

/**
 * How a guest behind the namespace reaches Moat's link. "routed": through the namespace's IP
 * stack (a tap or bridge with a route), so `ifname` is Moat's link itself. "redirect": a runtime
 * joins `ifname` to a tap below the IP stack (firecracker-containerd's tc-redirect-tap mirrors
 * the two with tc), so what the guest sends would leave by `ifname` unseen by any hook there:
 * `ifname` is then one end of a veth pair inside the namespace whose other end (INNER_DEVICE)
 * is Moat's, the guest is routed through the namespace from that end, and Moat's link to the
 * host is UPLINK_DEVICE.
 */
export type GuestLink = 'routed' | 'redirect';
export const GUEST_LINKS: readonly GuestLink[] = ['routed', 'redirect'];

/** "redirect": Moat's link to the host inside the namespace. */
export const UPLINK_DEVICE = 'moat-up';
/** "redirect": Moat's end of the inner pair, whose peer is `ifname`. */
export const INNER_DEVICE = 'moat-in';
/**
 * "redirect": the inner pair's /30, the same in every namespace (it never leaves one: the
 * namespace's firewall translates the guest's address to the sandbox's). From RFC 7335's
 * 192.0.0.0/29, which IANA lists as not global: no destination a guest wants is there.
 */
export const INNER_LINK = { router: '192.0.0.1', guest: '192.0.0.2', prefixLength: 30 } as const;

/** The device inside the namespace that leads to the host: what its firewall lets out. */
export const uplinkOf = (request: Pick<AdoptRequest, 'ifname' | 'guestLink'>): string =>
  request.guestLink === 'redirect' ? UPLINK_DEVICE : request.ifname;

/** A namespace's identity: its nsfs device and inode. */
export interface NamespaceIdentity {
  readonly device: number;
  readonly inode: number;
}

/** Why a namespace cannot be adopted: the request's fault (the API answers 400). */
export class AdoptRefused extends Error {
  override readonly name = 'AdoptRefused';
}

export const DEFAULT_IFNAME = 'moat0';

/**
 * Refuses an interface name the kernel would refuse (dev_valid_name: 1 to 15 bytes, not `.` or
 * `..`, no `/`, `:` or whitespace), one the kernel enforcer cannot write into nft's text (it takes
 * letters, digits, `.`, `-` and `_`), and `lo`, which every namespace has.
 */
export function checkIfname(ifname: string): void {
  const problem =
    ifname === ''
      ? 'is empty'
      : ifname.length > 15
        ? 'is longer than 15 characters'
        : !/^[A-Za-z0-9_.-]+$/.test(ifname)
          ? "holds a character other than letters, digits, '.', '-' and '_'"
          : ifname === '.' || ifname === '..'
            ? 'is not a device name'
            : ifname === 'lo'
              ? 'is the loopback every namespace has'
              : undefined;
  if (problem !== undefined) throw new AdoptRefused(`ifname ${JSON.stringify(ifname)} ${problem}`);
}

/** The devices Moat makes in the namespace for `request` (checkIfname'd), refused if clashing. */
export function devicesOf(request: AdoptRequest): string[] {
  checkIfname(request.ifname);
  if (request.guestLink === undefined || request.guestLink === 'routed') return [request.ifname];
  if (request.guestLink !== 'redirect')
    throw new AdoptRefused(
      `guestLink ${JSON.stringify(request.guestLink)} is not one of ${GUEST_LINKS.join(', ')}`,
    );
  if ([UPLINK_DEVICE, INNER_DEVICE].includes(request.ifname))
    throw new AdoptRefused(
      `ifname ${JSON.stringify(request.ifname)} is a name Moat gives its own devices with guestLink "redirect"`,
    );
  return [request.ifname, UPLINK_DEVICE, INNER_DEVICE];
}

export const sameNamespace = (a: NamespaceIdentity, b: NamespaceIdentity) =>
  a.device === b.device && a.inode === b.inode;

/** The identity of the namespace `path` names now; undefined when nothing is there. */
export async function identityOf(path: string): Promise<NamespaceIdentity | undefined> {
  const found = await stat(path).catch(() => undefined);
  return found && { device: found.dev, inode: found.ino };
}

/**
 * The identity of the namespace `netns` names, refused when it names nothing or a file that is
 * no namespace. (Whether it is a network namespace, and not another kind, entering it tells.)
 */
export async function namespaceFile(netns: string): Promise<NamespaceIdentity> {
  if (!netns.startsWith('/'))
    throw new AdoptRefused(`netns ${JSON.stringify(netns)} is not an absolute path`);
  const found = await stat(netns).catch((error: NodeJS.ErrnoException) => {
    throw new AdoptRefused(
      error.code === 'ENOENT' || error.code === 'ENOTDIR'
        ? `netns ${netns} does not exist`
        : `netns ${netns} cannot be read: ${error.code ?? error.message}`,
    );
  });
  // Every namespace file is on nsfs: the device of Moat's own tells which that is.
  const nsfs = (await stat('/proc/self/ns/net')).dev;
  if (found.dev !== nsfs) {
    const kind = found.isDirectory()
      ? 'a directory'
      : found.isFile()
        ? 'a regular file'
        : 'not a namespace file';
    throw new AdoptRefused(`netns ${netns} is not a network namespace (it is ${kind})`);
  }
  return { device: found.dev, inode: found.ino };
}

/** Refuses Moat's own namespace and the host's (process 1's): never a sandbox's to hold. */
export async function refuseHostNamespaces(
  netns: string,
  identity: NamespaceIdentity,
): Promise<void> {
  for (const [path, whose] of [
    ['/proc/self/ns/net', "Moat's own network namespace"],
    ['/proc/1/ns/net', "the host's network namespace (process 1's)"],
  ] as const) {
    const other = await identityOf(path);
    if (other !== undefined && sameNamespace(identity, other))
      throw new AdoptRefused(`netns ${netns} is ${whose}`);
  }
}
