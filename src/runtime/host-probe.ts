/**
 * What sandboxes can have on this host, found out once at start: whether they can be confined
 * (and if not, whether they are refused), the id range, cgroups, disks, the base layer and the
 * agent socket, each with the reason start-up output gives.
 */
import { createHash } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { AgentSocket } from './agent-socket.js';
import { baseLayerSpec } from './base-layer.js';
import { type Cgroups, cgroupsProblem, findCgroups } from './cgroups.js';
import { confinementWorks } from './confinement.js';
import { Disks, disksProblem } from './disks.js';
import { LayerStore } from './layers.js';
import type { ProcessRuntimeOptions } from './process-runtime-options.js';
import { LOCK_DIR } from './range-lock.js';
import { IDS_PER_SANDBOX, SandboxIds } from './sandbox-ids.js';
import { writeTrustBundle } from './trust-store.js';

/** What confined sandboxes are made with. */
export interface ConfinedParts {
  readonly ids: SandboxIds;
  readonly cgroups: Cgroups;
  readonly layers: LayerStore;
  readonly disks: Disks | undefined;
}

export interface HostProbe {
  /** The data folder, absolute. */
  readonly data: string;
  readonly agents: AgentSocket;
  /** The host path of the CA bundle sandboxes trust, when Moat adds a CA. */
  readonly trustBundle: string | undefined;
  /** Set when sandboxes are confined. */
  readonly confinedParts: ConfinedParts | undefined;
  /** Why sandboxes are refused; undefined when they start (confined or by the override). */
  readonly refusal: string | undefined;
  readonly confinementReason: string;
}

/**
 * Finds out whether sandboxes can be confined here and prepares what they need. Where they
 * cannot be confined, sandboxes are refused unless `allowUnconfined`. Whoever takes the probe
 * stops its ids and closes its agent socket.
 */
export async function probeHost(
  dataDir: string,
  options: ProcessRuntimeOptions,
): Promise<HostProbe> {
  const data = path.resolve(dataDir);
  await mkdir(data, { recursive: true, mode: 0o700 });
  // Names this Moat's cgroups and agent socket apart from other Moats' on the host.
  const scope = createHash('sha256').update(data).digest('hex').slice(0, 16);
  const probe = confinementWorks(data);
  const cgroups = probe.ok ? findCgroups(scope) : undefined;
  const problem = !probe.ok
    ? probe.reason
    : cgroups && 'problem' in cgroups
      ? cgroups.problem
      : // Advertised only once written to.
        await cgroupsProblem((cgroups as { cgroups: Cgroups }).cgroups);
  const socketDir = process.getuid?.() === 0 ? LOCK_DIR : path.join(data, 'run');
  const agents = await AgentSocket.listen(path.join(socketDir, `agents-${scope}.sock`));
  const trustBundle =
    options.trustedCaPem === undefined
      ? undefined
      : await writeTrustBundle(data, options.trustedCaPem);
  if (problem !== undefined) {
    if (options.network) {
      await agents.close();
      throw new Error(
        `network namespaces need confined sandboxes, and sandboxes cannot be confined here: ${problem}; run with --enforcement proxy`,
      );
    }
    const confinementReason = options.allowUnconfined
      ? `UNCONFINED (--unconfined-sandboxes): ${problem}; sandbox processes run as Moat's own user and can read and change whatever Moat can`
      : `sandboxes are refused: they cannot be confined here (${problem}); --unconfined-sandboxes runs them unconfined`;
    return {
      data,
      agents,
      trustBundle,
      confinedParts: undefined,
      refusal: options.allowUnconfined ? undefined : confinementReason,
      confinementReason,
    };
  }
  const { cgroups: groups } = cgroups as { cgroups: Cgroups };
  let ids: SandboxIds | undefined;
  try {
    ids = await SandboxIds.acquire(options.ids, data);
    const layers = new LayerStore(data, ids.storeFirst, IDS_PER_SANDBOX);
    await layers.buildBase(
      baseLayerSpec({ idCount: IDS_PER_SANDBOX, resolver: options.network?.gateway }),
    );
    const diskProblem = disksProblem();
    const disks =
      diskProblem === undefined
        ? new Disks(path.join(data, 'disks'), options.defaultDiskMB)
        : undefined;
    return {
      data,
      agents,
      trustBundle,
      confinedParts: { ids, cgroups: groups, layers, disks },
      refusal: undefined,
      confinementReason: [
        `confined: own user, PID, mount, IPC, UTS and cgroup namespaces; host ids ${ids.first}+${ids.slots * IDS_PER_SANDBOX}; seccomp filter; ${groups.description}`,
        disks
          ? 'a disk image per sandbox bounds its writable layer'
          : `no disk bound (${diskProblem}): the writable layer can grow to the host's free space`,
      ].join('; '),
    };
  } catch (error) {
    await ids?.stop();
    await agents.close();
    throw error;
  }
}
