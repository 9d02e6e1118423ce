/**
 * What a sandbox's supervisor is told: early (a spare's cgroups and ids, before its sandbox is
 * known), then the whole sandbox: its users, limits, mounts (an overlay per part of its file
 * system), network namespace, trust bundle and seccomp.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { systemFolders } from './base-layer.js';
import type { SandboxCgroup, SandboxLimits } from './cgroups.js';
import { USERS } from './confinement.js';
import type { LayerStore } from './layers.js';
import type { NamespaceNetwork } from './network.js';
import type { SandboxFolders, SandboxMeta } from './sandbox-folders.js';
import { IDS_PER_SANDBOX, type SandboxIds } from './sandbox-ids.js';
import type { EarlyConfig, SupervisorConfig } from './supervisor.js';

const HOSTNAME = 'sandbox';
const NOFILE = 65_536;

/** The parts of a sandbox's file system, each an overlay: name in a layer, and mount point. */
interface Part {
  readonly name: string;
  readonly target: string;
  /** Below the layers: the host's folder (system folders) or the base layer's part. */
  readonly bottom: { readonly path: string; readonly ids: 'host' | 'store' };
}

/** A sandbox's shares of kernel resources that every user of the host draws on. */
export interface KernelBudgets {
  /**
   * inotify instances and watches of each user of a sandbox. They are charged to the sandbox's
   * own host uid (its user namespace's owner), so the sandbox as a whole has at most the host's
   * per-user limits (fs.inotify.max_user_*), and never takes the host root's.
   */
  readonly inotifyInstances: number;
  readonly inotifyWatches: number;
  /** Pseudo-terminals open at once in a sandbox (its devpts `max=`). */
  readonly ptys: number;
}

export interface SupervisorConfigParts {
  /** The agent socket's path, where the supervisor brings the sandbox's roles. */
  readonly socket: string;
  readonly folders: SandboxFolders;
  /** Set when sandboxes are confined. */
  readonly confined: { readonly ids: SandboxIds; readonly layers: LayerStore } | undefined;
  /** The host path of the CA bundle sandboxes trust, when Moat adds a CA. */
  readonly trustBundle: string | undefined;
  readonly network: NamespaceNetwork | undefined;
  readonly budgets: KernelBudgets;
}

export class SupervisorConfigs {
  private readonly parts: Part[] = [
    { name: 'root', target: '/', bottom: { path: '', ids: 'store' } },
    { name: 'etc', target: '/etc', bottom: { path: '', ids: 'store' } },
    ...systemFolders().map((folder) => ({
      name: folder.path.replaceAll('/', '.'),
      target: `/${folder.path}`,
      bottom: { path: `/${folder.path}`, ids: 'host' as const },
    })),
  ];

  constructor(private readonly options: SupervisorConfigParts) {}

  early(slot: number, cgroup: SandboxCgroup): EarlyConfig {
    const { ids } = this.options.confined!;
    const { inotifyInstances, inotifyWatches } = this.options.budgets;
    return {
      cgroups: cgroup.folders,
      ids: { host: ids.hostFirst(slot), store: ids.storeFirst, count: IDS_PER_SANDBOX },
      userLimits: {
        max_inotify_instances: inotifyInstances,
        max_inotify_watches: inotifyWatches,
      },
    };
  }

  sandbox(
    sandboxID: string,
    limits: SandboxLimits,
    meta: SandboxMeta | undefined,
    cgroup: SandboxCgroup | undefined,
  ): SupervisorConfig {
    const { folders } = this.options;
    const users = Object.fromEntries(
      [...USERS.values()].map((u) => [u.name, { uid: u.uid, gid: u.uid, home: u.home }]),
    );
    const common = {
      sandboxID,
      socket: this.options.socket,
      hostname: HOSTNAME,
      users,
      limits: { nofile: NOFILE, ptys: this.options.budgets.ptys },
      shmBytes: Math.max(64, Math.floor(limits.memoryMB / 2)) * 2 ** 20,
    };
    if (meta === undefined) {
      return {
        ...common,
        mode: 'unconfined',
        netns: null,
        cgroups: [],
        ids: { host: process.getuid?.() ?? 0, store: 0, count: 1 },
        root: folders.unconfinedRoot(sandboxID),
        scratch: folders.folder(sandboxID),
        overlays: [],
        trustBundle: null,
        seccomp: false,
      };
    }
    const { ids, layers } = this.options.confined!;
    const upper = folders.upperBase(sandboxID, meta);
    const work = folders.workBase(sandboxID, meta);
    return {
      ...common,
      mode: 'confined',
      netns: this.options.network?.namespaceOf(sandboxID) ?? null,
      cgroups: cgroup!.folders,
      ids: { host: ids.hostFirst(meta.slot), store: ids.storeFirst, count: IDS_PER_SANDBOX },
      root: path.join(folders.folder(sandboxID), 'mnt'),
      scratch: path.join(folders.folder(sandboxID), 'scratch'),
      overlays: this.parts.map((part) => {
        const template =
          meta.layer === null ? undefined : path.join(layers.layer(meta.layer), part.name);
        const bottom =
          part.bottom.ids === 'host'
            ? part.bottom
            : { path: path.join(layers.base, part.name), ids: 'store' as const };
        return {
          target: part.target,
          lowers: [
            ...(template !== undefined && existsSync(template)
              ? [{ path: template, ids: 'store' as const }]
              : []),
            bottom,
          ],
          upper: path.join(upper, part.name),
          work: path.join(work, part.name),
        };
      }),
      trustBundle: this.options.trustBundle ?? null,
      seccomp: true,
    };
  }
}
