/**
 * Where a sandbox's files are on this host, and the record (`sandbox.json`) by which a restart
 * takes a confined sandbox back:
 *
 *   <data>/sandboxes/<id>/sandbox.json   its slot, disk and template layer (for restore)
 *   <data>/sandboxes/<id>/mnt, scratch   empty folders the supervisor mounts on, in the sandbox's
 *                                        own mount namespace only
 *   <data>/disks/<disk>/{upper,work}/    its writable layer, one folder per part (root, etc...)
 *
 * Unconfined, a sandbox is the folder `<data>/sandboxes/<id>/root`; a confined Moat adopts such
 * a folder from before confinement as the sandbox's writable layer.
 */
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { Disks } from './disks.js';
import type { LayerStore } from './layers.js';
import type { SandboxIds } from './sandbox-ids.js';

/** What a sandbox's folder records, so that a restart can take it back. */
export interface SandboxMeta {
  readonly slot: number;
  readonly disk: string | null;
  readonly layer: string | null;
}

export class SandboxFolders {
  constructor(
    /** `<data>/sandboxes` */
    readonly root: string,
    private readonly disks: Disks | undefined,
  ) {}

  folder(sandboxID: string): string {
    return path.join(this.root, sandboxID);
  }

  /** The host folder of an unconfined sandbox's files (its `/`). */
  unconfinedRoot(sandboxID: string): string {
    return path.join(this.folder(sandboxID), 'root');
  }

  upperBase(sandboxID: string, meta: SandboxMeta): string {
    return meta.disk !== null && this.disks
      ? path.join(this.disks.folder(meta.disk), 'upper')
      : path.join(this.folder(sandboxID), 'upper');
  }

  workBase(sandboxID: string, meta: SandboxMeta): string {
    return path.join(path.dirname(this.upperBase(sandboxID, meta)), 'work');
  }

  /** What the sandbox's folder records; undefined when it records nothing (none, or legacy). */
  async readMeta(sandboxID: string): Promise<SandboxMeta | undefined> {
    const file = path.join(this.folder(sandboxID), 'sandbox.json');
    let text: string;
    try {
      text = await readFile(file, 'utf8');
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw error;
    }
    let meta: unknown;
    try {
      meta = JSON.parse(text);
    } catch {
      meta = undefined;
    }
    const record = meta as Record<string, unknown> | undefined;
    const nameOrNull = (v: unknown) =>
      v === null || (typeof v === 'string' && /^[a-z0-9]+$/.test(v));
    if (
      typeof record !== 'object' ||
      record === null ||
      !Number.isSafeInteger(record.slot) ||
      !nameOrNull(record.disk) ||
      !nameOrNull(record.layer)
    ) {
      throw new Error(`sandbox ${sandboxID}: ${file} is damaged (not the record this Moat writes)`);
    }
    return record as unknown as SandboxMeta;
  }

  async writeMeta(sandboxID: string, meta: SandboxMeta): Promise<void> {
    await writeFile(path.join(this.folder(sandboxID), 'sandbox.json'), JSON.stringify(meta), {
      mode: 0o600,
    });
  }

  /** A sandbox folder from before confinement (`root/`, every file Moat's) as a layer of its own. */
  async adoptLegacySandbox(
    sandboxID: string,
    diskSizeMB: number,
    { ids, layers }: { readonly ids: SandboxIds; readonly layers: LayerStore },
  ): Promise<SandboxMeta> {
    const legacy = this.unconfinedRoot(sandboxID);
    if (!existsSync(legacy)) throw new Error(`sandbox ${sandboxID} has no files on this node`);
    const slot = ids.allocate(sandboxID);
    const disk = this.disks ? await this.disks.create(diskSizeMB) : null;
    const meta: SandboxMeta = { slot, disk, layer: null };
    const upper = this.upperBase(sandboxID, meta);
    await mkdir(upper, { recursive: true, mode: 0o700 });
    // The legacy folder becomes the root part of the sandbox's writable layer, owned by its ids.
    const adopted = path.join(upper, `.adopt-${randomBytes(4).toString('hex')}`);
    await layers.adoptInto(adopted, ids.hostFirst(slot), legacy);
    await rm(path.join(upper, 'root'), { recursive: true, force: true });
    await rename(path.join(adopted, 'root'), path.join(upper, 'root'));
    await rm(adopted, { recursive: true, force: true });
    await this.writeMeta(sandboxID, meta);
    await rm(legacy, { recursive: true, force: true });
    return meta;
  }
}

/** Templates from before layers, each made a layer of its own. */
export async function adoptLegacyTemplates(layers: LayerStore): Promise<void> {
  for (const { key, folder } of await layers.legacyTemplates()) {
    await layers.adoptLegacy(key, folder);
    await layers.removeLegacyTemplate(folder);
  }
}
