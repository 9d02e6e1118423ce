/**
 * Moat's layer store: the base layer (made anew at each start), and one flattened layer per
 * template (a snapshot of a sandbox). A sandbox's file system is its own writable layer over its
 * template's layer over the base layer and the host's system folders (overlayfs).
 *
 *   <data>/base/                      the base layer
 *   <data>/layers/<id>/<part>/        a template's layer (parts: root, etc, usr...)
 *   <data>/templates/<key>.json       {"layer": id}: which layer a template is
 *
 * Replacing a template is atomic: the new layer is complete before its manifest is renamed over
 * the old one, and only then is the old layer retired. A crash leaves the old template or the
 * new one whole; layers no manifest and no sandbox names are removed at start-up.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { LAYER_TOOL, PYTHON } from './supervisor.js';

const TOOL_TIMEOUT_MS = 30 * 60_000;
/** Before layers, every file a sandbox made was Moat's; adopted, they are the sandbox user's. */
const ADOPTED_OWNER = 1000;

interface Manifest {
  readonly layer: string;
}

function tool(args: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(
      PYTHON,
      ['-I', '-S', '-B', LAYER_TOOL, ...args],
      { timeout: TOOL_TIMEOUT_MS, maxBuffer: 1 << 20 },
      (error, _out, stderr) => {
        if (error === null) resolve();
        else
          reject(
            new Error(
              `layer_tool ${args[0]}: ${stderr.trim().split('\n').at(-1) ?? error.message}`,
            ),
          );
      },
    );
  });
}

/** What a snapshot is made of. */
export interface SnapshotSource {
  /** The sandbox's writable layer (one folder per part). */
  readonly upper: string;
  /** The first host id owning `upper`'s files. */
  readonly upperFirst: number;
  /** The stored layer the sandbox was made from, if any. */
  readonly lower: string | undefined;
  /** The most data `upper` may hold (its holes not counted). */
  readonly budgetBytes: number;
}

export class LayerStore {
  readonly base: string;
  private readonly layers: string;
  private readonly templates: string;
  /** Layers being made (staging, or complete without a manifest yet): never collected. */
  private readonly building = new Set<string>();

  constructor(
    private readonly dataDir: string,
    /** The first of the store ids (owners of stored layers). */
    private readonly storeFirst: number,
    private readonly idCount: number,
  ) {
    this.base = path.join(dataDir, 'base');
    this.layers = path.join(dataDir, 'layers');
    this.templates = path.join(dataDir, 'templates');
  }

  layer(id: string): string {
    return path.join(this.layers, id);
  }

  private manifest(key: string): string {
    // Keys like `team/alias:tag` become one file name; encodeURIComponent escapes `/`.
    return path.join(this.templates, `${encodeURIComponent(key)}.json`);
  }

  /** Makes the base layer from `spec` (see base-layer.ts), replacing the last one. */
  async buildBase(spec: object): Promise<void> {
    const staging = `${this.base}.new`;
    await rm(staging, { recursive: true, force: true });
    await mkdir(this.dataDir, { recursive: true, mode: 0o700 });
    const specFile = path.join(this.dataDir, 'base-spec.json');
    await writeFile(specFile, JSON.stringify(spec), { mode: 0o600 });
    try {
      await tool(['base', staging, String(this.storeFirst), specFile]);
    } finally {
      await rm(specFile, { force: true });
    }
    await rm(this.base, { recursive: true, force: true });
    await rename(staging, this.base);
  }

  /** The layer of template `key`, or undefined when there is no such template. */
  async templateLayer(key: string): Promise<string | undefined> {
    try {
      const manifest = JSON.parse(await readFile(this.manifest(key), 'utf8')) as Manifest;
      return typeof manifest.layer === 'string' ? manifest.layer : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * Flattens a sandbox's writable layer over its template's layer into a new layer, and makes
   * it template `key` (replacing any before). Fails when the writable layer holds more than
   * `budgetBytes` of data.
   */
  async snapshot(key: string, from: SnapshotSource): Promise<void> {
    await mkdir(this.layers, { recursive: true, mode: 0o700 });
    const id = `l${randomBytes(8).toString('hex')}`;
    const staging = `${this.layer(id)}.new`;
    this.building.add(id);
    try {
      await tool([
        'flatten',
        staging,
        String(this.storeFirst),
        String(from.upperFirst),
        String(this.idCount),
        String(from.budgetBytes),
        from.upper,
        ...(from.lower === undefined ? [] : [this.layer(from.lower)]),
      ]);
      await rename(staging, this.layer(id));
      await this.setManifest(key, { layer: id });
    } catch (error) {
      await rm(staging, { recursive: true, force: true });
      throw error;
    } finally {
      this.building.delete(id);
    }
  }

  /**
   * Copies a folder from before layers (one owner: Moat) into `out/root`, owned by the ids from
   * `first`: the user's, but /root the root's.
   */
  adoptInto(out: string, first: number, folder: string): Promise<void> {
    return tool(['adopt', out, String(first), String(this.idCount), String(ADOPTED_OWNER), folder]);
  }

  /** Takes a template folder from before layers (`<templates>/<key>/root`) as a layer. */
  async adoptLegacy(key: string, folder: string): Promise<void> {
    await mkdir(this.layers, { recursive: true, mode: 0o700 });
    const id = `l${randomBytes(8).toString('hex')}`;
    const staging = `${this.layer(id)}.new`;
    this.building.add(id);
    try {
      await this.adoptInto(staging, this.storeFirst, folder);
      await rename(staging, this.layer(id));
      await this.setManifest(key, { layer: id });
    } finally {
      this.building.delete(id);
    }
  }

  private async setManifest(key: string, manifest: Manifest): Promise<void> {
    await mkdir(this.templates, { recursive: true, mode: 0o700 });
    const file = this.manifest(key);
    const staging = `${file}.${randomBytes(4).toString('hex')}.new`;
    await writeFile(staging, JSON.stringify(manifest), { mode: 0o600 });
    await rename(staging, file);
  }

  /** Keys of every template with a manifest. */
  async templateKeys(): Promise<string[]> {
    const names = await readdir(this.templates).catch(() => [] as string[]);
    return names
      .filter((name) => name.endsWith('.json'))
      .map((name) => decodeURIComponent(name.slice(0, -'.json'.length)));
  }

  async removeTemplate(key: string): Promise<void> {
    await rm(this.manifest(key), { force: true });
  }

  /** Template folders from before layers: key and folder of each. */
  async legacyTemplates(): Promise<Array<{ key: string; folder: string }>> {
    const names = await readdir(this.templates).catch(() => [] as string[]);
    return names
      .filter(
        (name) => !name.endsWith('.json') && existsSync(path.join(this.templates, name, 'root')),
      )
      .map((name) => ({
        key: decodeURIComponent(name),
        folder: path.join(this.templates, name, 'root'),
      }));
  }

  async removeLegacyTemplate(folder: string): Promise<void> {
    await rm(path.dirname(folder), { recursive: true, force: true });
  }

  /** Removes layers that no template and no sandbox (`inUse`) names, and staging left by a crash. */
  async collect(inUse: ReadonlySet<string>): Promise<string[]> {
    const named = new Set(inUse);
    for (const name of await readdir(this.templates).catch(() => [] as string[])) {
      if (!name.endsWith('.json')) continue;
      const layer = await this.templateLayer(decodeURIComponent(name.slice(0, -'.json'.length)));
      if (layer !== undefined) named.add(layer);
    }
    const removed: string[] = [];
    for (const name of await readdir(this.layers).catch(() => [] as string[])) {
      if (named.has(name) || this.building.has(name.replace(/\.new$/, ''))) continue;
      await rm(path.join(this.layers, name), { recursive: true, force: true });
      removed.push(name);
    }
    return removed;
  }

  /** Removes manifests half-written by a crash (only at start-up: none is being written). */
  async removeStaging(): Promise<void> {
    for (const name of await readdir(this.templates).catch(() => [] as string[])) {
      if (name.endsWith('.new')) await rm(path.join(this.templates, name), { force: true });
    }
  }
}
