import { cp, mkdir, readdir, rename, rm } from 'node:fs/promises';
import path from 'node:path';
import type { EnforcementMode, SandboxRuntime } from './runtime.js';

/** The writable areas every sandbox root has, relative to the root. */
const SKELETON = ['home/user', 'tmp'];

export const BASE_TEMPLATE = 'base';

/**
 * The embedded runtime: a sandbox is a folder under `<dataDir>/sandboxes/<id>/root` holding its
 * writable areas, made from `<dataDir>/templates/<key>/root` (the built-in `base` template is
 * the empty skeleton).
 */
export class ProcessRuntime implements SandboxRuntime {
  readonly enforcement: EnforcementMode = 'proxy';
  readonly enforcementReason =
    'sandboxes share the host network; egress is enforced for programs that use the injected proxy variables';
  private readonly sandboxes: string;
  private readonly templates: string;

  constructor(dataDir: string) {
    this.sandboxes = path.join(dataDir, 'sandboxes');
    this.templates = path.join(dataDir, 'templates');
  }

  rootOf(sandboxID: string): string {
    return path.join(this.sandboxes, sandboxID, 'root');
  }

  private templateRoot(templateKey: string): string {
    // Keys like `team/alias:tag` become one path segment; encodeURIComponent escapes `/`.
    return path.join(this.templates, encodeURIComponent(templateKey), 'root');
  }

  async create(sandboxID: string, templateKey: string): Promise<void> {
    const root = this.rootOf(sandboxID);
    await rm(path.dirname(root), { recursive: true, force: true });
    if (templateKey === BASE_TEMPLATE) {
      for (const area of SKELETON) await mkdir(path.join(root, area), { recursive: true });
    } else {
      await cp(this.templateRoot(templateKey), root, {
        recursive: true,
        preserveTimestamps: true,
        verbatimSymlinks: true,
      });
    }
  }

  // Processes arrive with the sandbox runtime issue; a root alone has nothing to freeze.
  async pause(): Promise<void> {}

  async resume(): Promise<void> {}

  async destroy(sandboxID: string): Promise<void> {
    await rm(path.join(this.sandboxes, sandboxID), { recursive: true, force: true });
  }

  async snapshot(sandboxID: string, templateKey: string): Promise<void> {
    const target = this.templateRoot(templateKey);
    const staging = `${path.dirname(target)}.tmp`;
    await rm(staging, { recursive: true, force: true });
    await cp(this.rootOf(sandboxID), path.join(staging, 'root'), {
      recursive: true,
      preserveTimestamps: true,
      verbatimSymlinks: true,
    });
    // Replace a previous snapshot of the same name only once the new copy is complete.
    await rm(path.dirname(target), { recursive: true, force: true });
    await mkdir(this.templates, { recursive: true });
    await rename(staging, path.dirname(target));
  }

  async removeTemplate(templateKey: string): Promise<void> {
    await rm(path.dirname(this.templateRoot(templateKey)), { recursive: true, force: true });
  }

  async reconcile(known: ReadonlySet<string>): Promise<string[]> {
    const present = await readdir(this.sandboxes).catch(() => [] as string[]);
    const leftovers = present.filter((id) => !known.has(id));
    for (const id of leftovers) await this.destroy(id);
    return leftovers;
  }
}
