/**
 * The TCP listeners of sandboxes that share the host's network (proxy mode), read from the
 * kernel's tables: ingress may reach a sandbox's own listeners and nothing else of the host,
 * and dials the very address the listener is bound to.
 *
 * A port number alone is not enough: one sandbox listening on [::1]:P and another on
 * 127.0.0.1:P coexist (different families), and dialing 127.0.0.1 for the first reached the
 * second. Dialing the listener's own address (a wildcard as that family's loopback) cannot be
 * squatted: no other socket may hold an overlapping address of the same family and port.
 */
import { open, readdir, readFile, readlink } from 'node:fs/promises';
import os from 'node:os';

/** A listening socket: the port, where to dial it, whose it is. */
interface Listener {
  readonly port: number;
  readonly dial: string;
  readonly uid: number;
  readonly inode: string;
}

/** Port -> the address ingress dials for it. */
export type SandboxListeners = ReadonlyMap<number, string>;

const LISTEN = '0A';
/** How old a reading of the tables may be when it answers (bounds the cost under load too). */
const FRESH_MS = 100;
const READ_CHUNK = 1 << 16;
/** For sandboxes without an id range of their own: how much of their processes is looked at. */
const MAX_PROCESSES = 4096;
const MAX_DESCRIPTORS = 65_536;

const littleEndian = os.endianness() === 'LE';

/** A 32-bit word of /proc/net/tcp* (printed in host order) as its four bytes in network order. */
function wordBytes(hex: string): number[] {
  const bytes = [0, 2, 4, 6].map((at) => parseInt(hex.slice(at, at + 2), 16));
  return littleEndian ? bytes.reverse() : bytes;
}

/** The address to dial for a listener bound to `hex` (/proc/net/tcp or tcp6 format). */
export function dialAddress(hex: string): string | undefined {
  if (hex.length === 8) {
    const v4 = wordBytes(hex).join('.');
    return v4 === '0.0.0.0' ? '127.0.0.1' : v4;
  }
  if (hex.length !== 32) return undefined;
  const bytes = [0, 8, 16, 24].flatMap((at) => wordBytes(hex.slice(at, at + 8)));
  if (bytes.every((b) => b === 0)) return '::1';
  const mapped = bytes.slice(0, 10).every((b) => b === 0) && bytes[10] === 255 && bytes[11] === 255;
  if (mapped) return bytes.slice(12).join('.');
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(((bytes[i]! << 8) | bytes[i + 1]!).toString(16));
  return groups.join(':');
}

/**
 * The LISTEN entries of one table. The kernel lists listening sockets before all others, so
 * reading stops at the first entry that is not one: a host with many connections costs no
 * more than its listeners.
 */
async function readListeners(file: string): Promise<Listener[]> {
  const found: Listener[] = [];
  const handle = await open(file, 'r').catch(() => undefined);
  if (handle === undefined) return found;
  try {
    const buffer = Buffer.alloc(READ_CHUNK);
    let rest = '';
    let header = true;
    for (;;) {
      const { bytesRead } = await handle.read(buffer, 0, READ_CHUNK, null);
      if (bytesRead === 0) return found;
      const lines = (rest + buffer.toString('latin1', 0, bytesRead)).split('\n');
      rest = lines.pop()!;
      for (const line of lines) {
        if (header) {
          header = false;
          continue;
        }
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
        const fields = line.trim().split(/\s+/);
        if (fields[3] !== LISTEN) return found;
        const [hex, port] = fields[1]!.split(':');
        const dial = dialAddress(hex!);
        if (dial !== undefined)
          found.push({
            port: parseInt(port!, 16),
            dial,
            uid: Number(fields[7]),
            inode: fields[9]!,
          });
      }
    }
  } finally {
    await handle.close();
  }
}

/**
 * The host's TCP listeners (Moat's network namespace: the one sandboxes share in proxy mode),
 * read at most every FRESH_MS however many ask; each answer is at most that old.
 */
export class HostListeners {
  private reading: { at: number; listeners: Promise<Listener[]> } | undefined;

  private current(): Promise<Listener[]> {
    const now = Date.now();
    if (this.reading === undefined || now - this.reading.at >= FRESH_MS) {
      const listeners = Promise.all(
        ['/proc/self/net/tcp', '/proc/self/net/tcp6'].map(readListeners),
      ).then((tables) => tables.flat());
      this.reading = { at: now, listeners };
    }
    return this.reading.listeners;
  }

  /** The listeners of sockets owned by host uids first..first+count-1 (a confined sandbox). */
  async ownedBy(first: number, count: number): Promise<SandboxListeners> {
    return portsOf((await this.current()).filter((l) => l.uid >= first && l.uid < first + count));
  }

  /** The listeners of sockets that `pids` (and the processes below them) hold open. */
  async heldBy(pids: readonly number[]): Promise<SandboxListeners> {
    const inodes = await socketInodes(await withDescendants(pids));
    if (inodes.size === 0) return new Map();
    return portsOf((await this.current()).filter((l) => inodes.has(l.inode)));
  }
}

function portsOf(listeners: readonly Listener[]): SandboxListeners {
  const ports = new Map<number, string>();
  for (const { port, dial } of listeners) if (!ports.has(port)) ports.set(port, dial);
  return ports;
}

/** Every thread's children, so that a child of any thread of a process counts. */
async function childrenOf(pid: number): Promise<number[]> {
  const tasks = await readdir(`/proc/${pid}/task`).catch(() => [] as string[]);
  const lists = await Promise.all(
    tasks.map((task) => readFile(`/proc/${pid}/task/${task}/children`, 'utf8').catch(() => '')),
  );
  return lists.flatMap((text) =>
    text
      .split(' ')
      .filter((word) => word !== '')
      .map(Number),
  );
}

/** `pids` and the processes below them, at most MAX_PROCESSES. */
async function withDescendants(pids: readonly number[]): Promise<number[]> {
  const seen = new Set<number>();
  let level = [...pids];
  while (level.length > 0 && seen.size < MAX_PROCESSES) {
    level = level.filter((pid) => !seen.has(pid)).slice(0, MAX_PROCESSES - seen.size);
    for (const pid of level) seen.add(pid);
    level = (await Promise.all(level.map(childrenOf))).flat();
  }
  return [...seen];
}

/** Inodes of the sockets the processes hold, looking at MAX_DESCRIPTORS descriptors at most. */
async function socketInodes(pids: readonly number[]): Promise<Set<string>> {
  const inodes = new Set<string>();
  let budget = MAX_DESCRIPTORS;
  for (const pid of pids) {
    if (budget <= 0) break;
    const fds = (await readdir(`/proc/${pid}/fd`).catch(() => [] as string[])).slice(0, budget);
    budget -= fds.length;
    const links = await Promise.all(
      fds.map((fd) => readlink(`/proc/${pid}/fd/${fd}`).catch(() => '')),
    );
    for (const link of links) {
      const inode = /^socket:\[(\d+)\]$/.exec(link)?.[1];
      if (inode !== undefined) inodes.add(inode);
    }
  }
  return inodes;
}
