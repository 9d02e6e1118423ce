/**
 * Debian's Podman driven as an operator would, with everything it keeps in one scratch folder:
 * a containers.conf (CONTAINERS_CONF) choosing the CNI backend, runc (crun 1.8 refuses this
 * machine kind's mixed cgroup set-up), file locks (nothing left in /dev/shm), open-file and
 * process limits root may set here, and the CNI folders `moat cni install` wrote; storage (vfs)
 * and run state in the folder too. The image is a busybox-static root made here and loaded with
 * `podman import` (no registry is reachable). Every command runs inside `netns`, the namespace
 * playing the host, so the plugin it runs reaches Moat's API there.
 */
import { spawnSync } from 'node:child_process';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { removeMoatFolder } from '../../bench/lib/scratch.js';

export const IMAGE = 'localhost/moat-busybox:test';
const BUSYBOX = '/bin/busybox';
const APPLETS = ['sh', 'cat', 'echo', 'sleep', 'timeout', 'wget', 'nc', 'nslookup', 'ip', 'true'];

export interface Ran {
  readonly status: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

export class Podman {
  private constructor(
    readonly dir: string,
    private readonly netns: string | undefined,
  ) {}

  /** A scratch Podman whose CNI plugins and networks are `cniBin` and `cniConf`. */
  static create(cniBin: string, cniConf: string, netns?: string): Podman {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'moat-podman-'));
    const tmp = path.join(dir, 'tmp');
    mkdirSync(tmp);
    writeFileSync(
      path.join(dir, 'containers.conf'),
      [
        '[containers]',
        'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]',
        '[engine]',
        'runtime = "runc"',
        'cgroup_manager = "cgroupfs"',
        'events_logger = "file"',
        `events_logfile_path = "${path.join(tmp, 'events.log')}"`,
        'lock_type = "file"',
        `tmp_dir = "${tmp}"`,
        `static_dir = "${path.join(dir, 'static')}"`,
        `volume_path = "${path.join(dir, 'volumes')}"`,
        '[network]',
        'network_backend = "cni"',
        `cni_plugin_dirs = ["${cniBin}", "/usr/lib/cni"]`,
        `network_config_dir = "${cniConf}"`,
        '',
      ].join('\n'),
    );
    return new Podman(dir, netns);
  }

  /** `podman ARGS`, with `input` on its standard input (bounded: 60 s). */
  run(args: string[], input?: Buffer): Ran {
    const podman = [
      '/usr/bin/podman',
      ...['--root', path.join(this.dir, 'root'), '--runroot', path.join(this.dir, 'run')],
      ...['--storage-driver', 'vfs', ...args],
    ];
    const command =
      this.netns === undefined
        ? podman
        : ['/usr/bin/nsenter', `--net=/run/netns/${this.netns}`, '--', ...podman];
    const result = spawnSync(command[0]!, command.slice(1), {
      input,
      encoding: 'utf8',
      timeout: 60_000,
      env: {
        PATH: process.env.PATH ?? '',
        CONTAINERS_CONF: path.join(this.dir, 'containers.conf'),
      },
    });
    return {
      status: result.status,
      stdout: result.stdout ?? '',
      stderr: `${result.error ? `${result.error.message}\n` : ''}${result.stderr ?? ''}`,
    };
  }

  /** Loads the busybox image (a root with the static busybox and its applets). */
  importImage(): Ran {
    const root = path.join(this.dir, 'image');
    for (const folder of ['bin', 'etc', 'tmp', 'proc', 'sys', 'dev'])
      mkdirSync(path.join(root, folder), { recursive: true });
    copyFileSync(BUSYBOX, path.join(root, 'bin', 'busybox'));
    for (const applet of APPLETS) symlinkSync('busybox', path.join(root, 'bin', applet));
    const tar = spawnSync('/bin/tar', ['-C', root, '-c', '.'], {
      maxBuffer: 64 << 20,
      timeout: 30_000,
    });
    if (tar.status !== 0) return { status: tar.status, stdout: '', stderr: String(tar.stderr) };
    return this.run(['import', '-', IMAGE], tar.stdout);
  }

  /** Removes every container (their networks torn down), then the folder. */
  remove(): void {
    this.run(['rm', '--all', '--force', '--time', '0']);
    removeMoatFolder(this.dir);
  }
}

/**
 * Why Podman cannot run a container here (after installing what the project's script installs
 * with --cni), or undefined when it can: checked by running one, without a network.
 */
export function podmanSkipReason(suite: string): string | undefined {
  spawnSync(process.execPath, ['scripts/system-packages.mjs', '--cni'], {
    stdio: 'inherit',
    timeout: 600_000,
  });
  const missing = ['/usr/bin/podman', '/usr/sbin/runc', '/usr/lib/cni/loopback', BUSYBOX].filter(
    (file) => !existsSync(file),
  );
  let reason: string | undefined =
    missing.length > 0
      ? `missing ${missing.join(', ')} (podman, runc, containernetworking-plugins, busybox-static)`
      : undefined;
  if (reason === undefined) {
    const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-podman-probe-'));
    const podman = Podman.create(scratch, scratch);
    try {
      const imported = podman.importImage();
      const ran =
        imported.status === 0
          ? podman.run(['run', '--rm', '--network', 'none', IMAGE, '/bin/true'])
          : imported;
      if (ran.status !== 0) reason = `podman cannot run a container here: ${ran.stderr.trim()}`;
    } finally {
      podman.remove();
      removeMoatFolder(scratch);
    }
  }
  if (reason !== undefined) console.warn(`${suite}: skipped: ${reason}`);
  return reason;
}
