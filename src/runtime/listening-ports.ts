/**
 * The TCP ports a sandbox's own processes listen on, read from /proc: ingress, where a sandbox
 * shares the host's network, may reach those and nothing else of the host.
 */
import { readdir, readFile, readlink } from 'node:fs/promises';

const LISTEN = '0A';

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

/** `pids` and every process below them (a server a shell started is the shell's child). */
async function withDescendants(pids: readonly number[]): Promise<number[]> {
  const seen = new Set<number>();
  let level = [...pids];
  while (level.length > 0) {
    level = level.filter((pid) => !seen.has(pid));
    for (const pid of level) seen.add(pid);
    level = (await Promise.all(level.map(childrenOf))).flat();
  }
  return [...seen];
}

/** Inodes of the sockets a process holds open (`socket:[12345]` links in /proc/<pid>/fd). */
async function socketInodes(pid: number): Promise<string[]> {
  const fds = await readdir(`/proc/${pid}/fd`).catch(() => [] as string[]);
  const links = await Promise.all(
    fds.map((fd) => readlink(`/proc/${pid}/fd/${fd}`).catch(() => '')),
  );
  return links.flatMap((link) => /^socket:\[(\d+)\]$/.exec(link)?.[1] ?? []);
}

/** The ports of the LISTEN sockets in /proc/net/tcp-format `tables` whose inodes are `inodes`. */
function listening(tables: readonly string[], inodes: ReadonlySet<string>): Set<number> {
  const ports = new Set<number>();
  for (const text of tables) {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      if (fields[3] === LISTEN && inodes.has(fields[9] ?? ''))
        ports.add(parseInt(fields[1]!.split(':')[1]!, 16));
    }
  }
  return ports;
}

/**
 * The TCP ports that `pids`, or processes below them, listen on. Processes that are gone by
 * the time they are read count for nothing: the answer only ever errs towards fewer ports.
 */
export async function listeningPortsOf(pids: readonly number[]): Promise<Set<number>> {
  const all = await withDescendants(pids);
  const inodes = new Set((await Promise.all(all.map(socketInodes))).flat());
  if (inodes.size === 0) return new Set();
  // One network namespace for all of them, read through the first that is still there.
  for (const pid of all) {
    const tables = await Promise.all(
      ['tcp', 'tcp6'].map((table) => readFile(`/proc/${pid}/net/${table}`, 'utf8').catch(() => '')),
    );
    if (tables[0] !== '') return listening(tables, inodes);
  }
  return new Set();
}
