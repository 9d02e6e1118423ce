/**
 * What every sandbox starts from (the `base` template): the host's system folders, shown
 * read-only through idmapped mounts so that the sandbox's root owns them in its own writable
 * layer, plus a base layer Moat makes at each start:
 *
 * - root: the skeleton of a Debian system (/home/user, /root, /tmp, /var, mount points, the
 *   host's top-level symlinks such as /bin -> usr/bin);
 * - etc: the host's /etc as any host user may read it (nothing that is not world-readable: no
 *   /etc/shadow, no private keys, no Moat configuration), with the sandbox's own passwd, group,
 *   shadow, hostname, hosts, profile and (in its own network namespace) resolv.conf.
 *
 * The host's system folders are /usr, /opt, the top-level library and binary folders where they
 * are folders (not symlinks), and the package database (/var/lib/dpkg, /var/lib/apt), so that
 * a sandbox's root can install packages into its own layer.
 */
import { lstatSync, readFileSync, readlinkSync } from 'node:fs';
import { SANDBOX_PATH, USERS } from './confinement.js';

const CANDIDATES = ['usr', 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32', 'opt'];
const PACKAGE_DATABASE = ['var/lib/dpkg', 'var/lib/apt'];

export interface SystemFolder {
  /** Path inside the sandbox (and on the host), without the leading slash. */
  readonly path: string;
}

type SkeletonEntry =
  | { readonly path: string; readonly mode: number; readonly uid: number }
  | { readonly path: string; readonly link: string };

function kindOf(hostPath: string): 'dir' | 'link' | undefined {
  try {
    const stats = lstatSync(hostPath);
    return stats.isSymbolicLink() ? 'link' : stats.isDirectory() ? 'dir' : undefined;
  } catch {
    return undefined;
  }
}

/** The host folders every sandbox sees (each an overlay with the host's folder below). */
export function systemFolders(): SystemFolder[] {
  return [...CANDIDATES, ...PACKAGE_DATABASE]
    .filter((name) => kindOf(`/${name}`) === 'dir')
    .map((name) => ({ path: name }));
}

/**
 * sudo for bash (exported, so scripts bash starts have it too). No process of a sandbox can gain
 * privileges (no_new_privs), so a real sudo cannot work; commands written for E2B's sandboxes,
 * where \`user\` may sudo, still run: as the caller, who is told so when that is not root.
 */
const SUDO = `if [ -n "\${BASH_VERSION-}" ]; then
sudo() {
  while [ $# -gt 0 ]; do
    case "$1" in
      -u|-g|-p|-C|-h|-U|-r|-t|-T|-D) shift 2 ;;
      --) shift; break ;;
      -*) shift ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || { echo 'usage: sudo command [args]' >&2; return 1; }
  [ "$EUID" = 0 ] || echo "sudo: a Moat sandbox cannot raise privileges; running as \${USER:-uid $EUID}. For root, run the command with user: 'root' (commands.run(cmd, { user: 'root' }))" >&2
  "$@"
}
export -f sudo
fi
`;

/**
 * The sandbox's /etc/profile: the SDK runs every command as a login shell (`bash -l -c`), and the
 * host's profile forks `id -u` and sources the host's profile.d on each of them.
 */
const PROFILE = `# /etc/profile of a Moat sandbox
PATH=${SANDBOX_PATH}
export PATH
[ -n "\${BASH_VERSION-}" ] && [ -n "\${PS1-}" ] && [ -r /etc/bash.bashrc ] && . /etc/bash.bashrc
${SUDO}`;

/** Lines of a host account file whose id is a system id (below 1000, or nobody's). */
function systemEntries(file: string, reserved: ReadonlySet<string>): string[] {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return [];
  }
  return text.split('\n').filter((line) => {
    const [name, , id] = line.split(':');
    const number = Number(id);
    return (
      name !== undefined &&
      !reserved.has(name) &&
      Number.isInteger(number) &&
      (number < 1000 || number === 65534)
    );
  });
}

function accountFiles(): Record<string, { content: string; mode: number; gid?: number }> {
  const users = [...USERS.values()];
  const own = new Set(users.map((u) => u.name));
  const passwd = [
    ...users.map((u) => `${u.name}:x:${u.uid}:${u.uid}:${u.name}:${u.home}:/bin/bash`),
    ...systemEntries('/etc/passwd', own),
  ];
  // Group members are host account names: none is carried over.
  const group = [
    ...users.map((u) => `${u.name}:x:${u.uid}:`),
    ...systemEntries('/etc/group', own).map((line) => line.split(':').slice(0, 3).join(':') + ':'),
  ];
  const names = passwd.map((line) => line.split(':')[0]!);
  const shadowGroup = group.find((line) => line.startsWith('shadow:'))?.split(':')[2];
  const locked = { mode: 0o640, ...(shadowGroup ? { gid: Number(shadowGroup) } : {}) };
  return {
    passwd: { content: `${passwd.join('\n')}\n`, mode: 0o644 },
    group: { content: `${group.join('\n')}\n`, mode: 0o644 },
    // Every account locked: no password exists inside a sandbox.
    shadow: { content: names.map((n) => `${n}:*:19000:0:99999:7:::\n`).join(''), ...locked },
    gshadow: {
      content: group.map((line) => `${line.split(':')[0]}:*::\n`).join(''),
      ...locked,
    },
  };
}

/** The base layer's spec for supervisor/layer_tool.py (`base`). */
export function baseLayerSpec(options: {
  readonly idCount: number;
  /** The sandbox's resolver when it has its own network namespace. */
  readonly resolver: string | undefined;
}): object {
  const skeleton: SkeletonEntry[] = [];
  const folder = (path: string, mode = 0o755, uid = 0) => skeleton.push({ path, mode, uid });
  for (const name of CANDIDATES) {
    const kind = kindOf(`/${name}`);
    if (kind === 'dir') folder(name);
    if (kind === 'link') skeleton.push({ path: name, link: readlinkSync(`/${name}`) });
  }
  folder('etc');
  folder('proc', 0o555);
  folder('sys', 0o555);
  folder('dev');
  folder('home');
  for (const user of USERS.values()) {
    if (user.home !== '/root') folder(user.home.slice(1), 0o755, user.uid);
  }
  folder('root', 0o700);
  folder('tmp', 0o1777);
  folder('run');
  folder('srv');
  folder('mnt');
  folder('media');
  folder('var');
  folder('var/tmp', 0o1777);
  folder('var/log');
  folder('var/cache');
  folder('var/cache/apt');
  folder('var/cache/apt/archives');
  folder('var/lib');
  for (const name of PACKAGE_DATABASE) if (kindOf(`/${name}`) === 'dir') folder(name);
  return {
    count: options.idCount,
    etc: '/etc',
    skeleton,
    files: {
      ...accountFiles(),
      hostname: { content: 'sandbox\n', mode: 0o644 },
      hosts: {
        content: '127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost\n',
        mode: 0o644,
      },
      profile: { content: PROFILE, mode: 0o644 },
      ...(options.resolver
        ? {
            'resolv.conf': {
              content: `nameserver ${options.resolver}\noptions timeout:2 attempts:2\n`,
              mode: 0o644,
            },
          }
        : {}),
    },
  };
}
