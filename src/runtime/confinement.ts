/**
 * The users of a sandbox, and whether this host can confine sandboxes.
 *
 * Confined (the default, and the only mode Moat starts sandboxes in unless the operator says
 * `--unconfined-sandboxes`): each sandbox has its own user, PID, mount, IPC, UTS and cgroup
 * namespaces, its ids mapped onto host ids of its own, a file system of its own layers, a
 * seccomp filter and cgroup limits (supervisor/, docs/sandbox-isolation.md).
 * Unconfined: processes run on the host as Moat's own user, in the sandbox's folder; nothing
 * stops them from reading or changing anything Moat can.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import { PYTHON, SUPERVISOR, supervisorProblem } from './supervisor.js';

export const SANDBOX_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

export interface SandboxUser {
  readonly name: string;
  readonly uid: number;
  readonly home: string;
}

export const USERS: ReadonlyMap<string, SandboxUser> = new Map([
  ['user', { name: 'user', uid: 1000, home: '/home/user' }],
  ['root', { name: 'root', uid: 0, home: '/root' }],
]);
export const DEFAULT_USER = USERS.get('user')!;

/**
 * Whether sandboxes can be confined here, tried for real in a throwaway namespace (a probe of
 * the supervisor's own code), with `folder` the parent of the folder holding sandbox layers.
 */
export function confinementWorks(folder: string): { ok: boolean; reason: string } {
  const missing = supervisorProblem();
  if (missing !== undefined) return { ok: false, reason: missing };
  if (process.getuid?.() !== 0) return { ok: false, reason: 'Moat is not running as root' };
  const scratch = mkdtempSync(path.join(folder, '.probe-'));
  try {
    const output = execFileSync(
      PYTHON,
      ['-I', '-S', '-B', path.join(path.dirname(SUPERVISOR), 'probe.py'), scratch],
      { timeout: 10_000, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const result = JSON.parse(output) as { ok: boolean; reason: string };
    return { ok: result.ok === true, reason: String(result.reason) };
  } catch (error) {
    return { ok: false, reason: `the confinement probe failed: ${(error as Error).message}` };
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

/** A command's working folder and environment as its launcher uses them. */
export function placeCommand(
  spec: {
    readonly user: SandboxUser;
    readonly cwd: string;
    readonly env: Readonly<Record<string, string>>;
  },
  /** Unconfined, the sandbox's folder on the host: paths are translated into it. */
  hostRoot: string | undefined,
): { cwd: string; env: Record<string, string> } {
  const inside = (view: string) => (hostRoot === undefined ? view : path.join(hostRoot, view));
  const home = inside(spec.user.home);
  return {
    cwd: inside(spec.cwd),
    env: {
      PATH: SANDBOX_PATH,
      HOME: home,
      USER: spec.user.name,
      LOGNAME: spec.user.name,
      ...spec.env,
    },
  };
}
