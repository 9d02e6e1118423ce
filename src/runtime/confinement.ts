/**
 * Where a sandbox's processes see its root: inside bubblewrap (own user, PID, IPC and UTS
 * namespaces, own mount namespace in which the sandbox's writable areas are the only writable
 * places, the host's system folders read-only) when bwrap works here, or else unconfined with
 * paths translated to the sandbox's folder on the host.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { NSENTER } from './nft-session.js';

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

/** Host folders every sandbox sees read-only (what programs need to run). */
const SYSTEM = ['/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32', '/etc', '/opt'];
/** Names at the top of a sandbox root that are never bound over the system folders. */
const RESERVED = new Set([...SYSTEM.map((p) => p.slice(1)), 'proc', 'dev', 'sys', '.moat']);

const PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

export interface LaunchSpec {
  readonly root: string;
  readonly user: SandboxUser;
  /** Working folder as the sandbox sees it. */
  readonly cwd: string;
  readonly env: Readonly<Record<string, string>>;
  readonly argv: readonly string[];
}

export interface Confinement {
  readonly kind: 'bubblewrap' | 'none';
  /** argv and env to spawn `spec.argv` confined, and the host folder to start in. */
  launch(spec: LaunchSpec): { argv: string[]; env: Record<string, string>; cwd: string };
  /** Working folder and environment of a command as a launcher inside the sandbox sees them. */
  place(spec: Omit<LaunchSpec, 'argv'>): { cwd: string; env: Record<string, string> };
}

/** bwrap exists and can make the namespaces it needs on this host. */
export function bubblewrapWorks(): { ok: boolean; reason: string } {
  if (!existsSync('/usr/bin/bwrap')) return { ok: false, reason: 'bwrap is not installed' };
  try {
    execFileSync(
      '/usr/bin/bwrap',
      ['--unshare-user', '--unshare-pid', '--ro-bind', '/', '/', '--', '/bin/true'],
      { stdio: 'ignore', timeout: 5000 },
    );
    return { ok: true, reason: 'bubblewrap: own user, PID, IPC, UTS and mount namespaces' };
  } catch (error) {
    return { ok: false, reason: `bwrap cannot make namespaces here: ${(error as Error).message}` };
  }
}

const baseEnv = (spec: Omit<LaunchSpec, 'argv'>, home: string): Record<string, string> => ({
  PATH,
  HOME: home,
  USER: spec.user.name,
  LOGNAME: spec.user.name,
  ...spec.env,
});

export const bubblewrap: Confinement = {
  kind: 'bubblewrap',
  launch(spec) {
    const args = [
      '--unshare-user',
      '--uid',
      String(spec.user.uid),
      '--gid',
      String(spec.user.uid),
      '--unshare-pid',
      '--unshare-ipc',
      '--unshare-uts',
      '--hostname',
      'sandbox',
      '--die-with-parent',
    ];
    for (const folder of SYSTEM) if (existsSync(folder)) args.push('--ro-bind', folder, folder);
    for (const name of readdirSync(spec.root)) {
      if (!RESERVED.has(name)) args.push('--bind', path.join(spec.root, name), `/${name}`);
    }
    const identity = path.join(spec.root, '.moat');
    args.push(
      '--ro-bind',
      path.join(identity, 'passwd'),
      '/etc/passwd',
      '--ro-bind',
      path.join(identity, 'group'),
      '/etc/group',
      '--ro-bind',
      path.join(identity, 'profile'),
      '/etc/profile',
    );
    // In its own network namespace the sandbox's resolver is Moat's DNS on the gateway.
    const resolver = path.join(identity, 'resolv.conf');
    if (existsSync(resolver)) args.push('--ro-bind', resolver, '/etc/resolv.conf');
    args.push('--proc', '/proc', '--dev', '/dev', '--chdir', spec.cwd, '--clearenv');
    for (const [key, value] of Object.entries(baseEnv(spec, spec.user.home))) {
      args.push('--setenv', key, value);
    }
    return {
      argv: ['/usr/bin/bwrap', ...args, '--', ...spec.argv],
      env: { PATH },
      cwd: spec.root,
    };
  },
  place: (spec) => ({ cwd: spec.cwd, env: baseEnv(spec, spec.user.home) }),
};

/** The same confinement, started inside a network namespace (`/run/netns/<name>`). */
export function inNetworkNamespace(confinement: Confinement, netns: string): Confinement {
  return {
    ...confinement,
    launch(spec) {
      const launch = confinement.launch(spec);
      return { ...launch, argv: [NSENTER, `--net=${netns}`, '--', ...launch.argv] };
    },
  };
}

/** No namespaces: the process runs on the host, in the host folder behind `cwd`. */
export const unconfined: Confinement = {
  kind: 'none',
  launch(spec) {
    const hostHome = path.join(spec.root, spec.user.home);
    return {
      argv: [...spec.argv],
      env: baseEnv(spec, hostHome),
      cwd: path.join(spec.root, spec.cwd),
    };
  },
  place: (spec) => ({
    cwd: path.join(spec.root, spec.cwd),
    env: baseEnv(spec, path.join(spec.root, spec.user.home)),
  }),
};

/**
 * The sandbox's /etc/profile: the SDK runs every command as a login shell (`bash -l -c`), and the
 * host's profile forks `id -u` and sources the host's profile.d on each of them.
 */
const PROFILE = `# /etc/profile of a Moat sandbox
PATH=${PATH}
export PATH
[ -n "\${BASH_VERSION-}" ] && [ -n "\${PS1-}" ] && [ -r /etc/bash.bashrc ] && . /etc/bash.bashrc
`;

/**
 * /etc/passwd, /etc/group and /etc/profile as the sandbox sees them, and /etc/resolv.conf when
 * it has its own resolver address.
 */
export function identityFiles(resolver?: string): Record<string, string> {
  const users = [...USERS.values()];
  return {
    ...(resolver
      ? { 'resolv.conf': `nameserver ${resolver}\noptions timeout:2 attempts:2\n` }
      : {}),
    passwd: users
      .map((u) => `${u.name}:x:${u.uid}:${u.uid}:${u.name}:${u.home}:/bin/bash`)
      .join('\n')
      .concat('\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n'),
    group: users
      .map((u) => `${u.name}:x:${u.uid}:`)
      .join('\n')
      .concat('\nnogroup:x:65534:\n'),
    profile: PROFILE,
  };
}
