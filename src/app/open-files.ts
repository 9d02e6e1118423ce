/**
 * Moat's own file descriptors: the process's open-file limit, and how many connections
 * sandboxes may hold together so that a reserve always stays for the API, /health, metrics and
 * the store. Node raises the soft limit to the hard one itself when it starts (node.cc,
 * PlatformInit), so the limit read here is already the highest an unprivileged process gets;
 * raising the hard limit needs privilege (systemd's LimitNOFILE=, a container's ulimits).
 */
import { readFile } from 'node:fs/promises';

/** Sandboxes at their full connection budget the limit should leave room for, or Moat warns. */
export const SANDBOXES_WITHOUT_WARNING = 16;

/** The soft RLIMIT_NOFILE from `/proc/self/limits`; undefined when unlimited or not readable. */
export async function openFileLimit(limitsFile = '/proc/self/limits'): Promise<number | undefined> {
  const text = await readFile(limitsFile, 'utf8').catch(() => undefined);
  const soft = text === undefined ? undefined : /^Max open files\s+(\S+)/m.exec(text)?.[1];
  return soft === undefined || !/^[0-9]+$/.test(soft) ? undefined : Number(soft);
}

/**
 * Connections all sandboxes together may hold: half of what the limit leaves beyond the
 * reserve, since each may dial one upstream connection (its origin, or an idle pooled one).
 */
export function sandboxConnectionShare(limit: number | undefined, reserve: number): number {
  return limit === undefined ? Infinity : Math.max(0, Math.floor((limit - reserve) / 2));
}

/** Why the limit is too low for a reasonable number of sandboxes at their budget, if it is. */
export function openFileWarning(
  limit: number | undefined,
  reserve: number,
  perSandbox: number,
): string | undefined {
  const share = sandboxConnectionShare(limit, reserve);
  const sandboxes = Math.floor(share / perSandbox);
  if (sandboxes >= SANDBOXES_WITHOUT_WARNING) return undefined;
  return `the open-file limit (${limit}) less --fd-reserve ${reserve} leaves room for ${share} sandbox connections: ${sandboxes} sandboxes at --proxy-max-tunnels ${perSandbox}, fewer than ${SANDBOXES_WITHOUT_WARNING}; raise LimitNOFILE (systemd) or --ulimit nofile (containers)`;
}
