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
  /** The name of Moat's end of the link inside the namespace. */
  readonly ifname: string;
}

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
 * `..`, no `/`, `:` or whitespace), and `lo`, which every namespace has.
 */
export function checkIfname(ifname: string): void {
  const problem =
    ifname === ''
      ? 'is empty'
      : Buffer.byteLength(ifname) > 15
        ? 'is longer than 15 bytes'
        : ifname === '.' || ifname === '..'
          ? 'is not a device name'
          : /[/:\s]/.test(ifname)
            ? 'holds "/", ":" or whitespace'
            : ifname === 'lo'
              ? 'is the loopback every namespace has'
              : undefined;
  if (problem !== undefined) throw new AdoptRefused(`ifname ${JSON.stringify(ifname)} ${problem}`);
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
