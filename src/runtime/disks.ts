/**
 * A disk per sandbox: a sparse ext4 image, loop-mounted under `<data>/disks/<id>/`, holding the
 * sandbox's writable layer. Its size is the sandbox's disk bound: a sandbox that fills it gets
 * ENOSPC, and the host's own file system is not touched beyond what the sandbox wrote.
 *
 * Making one costs a mkfs and a mount (tens of milliseconds), so one spare of the default size
 * is kept ready and the next made in the background when it is taken.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, open, readdir, rm, rmdir } from 'node:fs/promises';
import path from 'node:path';

const MKFS = '/sbin/mkfs.ext4';
const MOUNT = '/bin/mount';
const UMOUNT = '/bin/umount';
const COMMAND_TIMEOUT_MS = 30_000;

function run(file: string, args: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: COMMAND_TIMEOUT_MS }, (error, _out, stderr) => {
      if (error === null) resolve();
      else
        reject(
          new Error(`${path.basename(file)} ${args.join(' ')}: ${stderr.trim() || error.message}`),
        );
    });
  });
}

/** Whether loop-mounted ext4 disks can be made here, and why not. */
export function disksProblem(): string | undefined {
  if (!existsSync('/dev/loop-control')) return 'no loop devices (/dev/loop-control is missing)';
  if (!existsSync(MKFS)) return `${MKFS} is missing (Debian package e2fsprogs)`;
  if (!existsSync(MOUNT)) return `${MOUNT} is missing (Debian package mount)`;
  return undefined;
}

function mounted(folder: string): boolean {
  try {
    const mountinfo = readFileSync('/proc/self/mountinfo', 'utf8');
    return mountinfo.split('\n').some((line) => line.split(' ')[4] === folder);
  } catch {
    return false;
  }
}

export class Disks {
  private spare: Promise<string | undefined> | undefined;

  constructor(
    private readonly dir: string,
    private readonly defaultSizeMB: number,
  ) {}

  /** Where disk `id` is mounted. */
  folder(id: string): string {
    return path.join(this.dir, id);
  }

  private image(id: string): string {
    return path.join(this.dir, `${id}.img`);
  }

  /** A new, mounted, empty disk of `sizeMB`; returns its id. */
  async create(sizeMB: number): Promise<string> {
    if (sizeMB === this.defaultSizeMB) {
      const ready = await (this.spare ?? Promise.resolve(undefined));
      this.spare = undefined;
      this.refill();
      if (ready !== undefined) return ready;
    }
    return this.make(sizeMB);
  }

  /** Starts making the next spare (its failure only means the next create makes its own). */
  refill(): void {
    this.spare ??= this.make(this.defaultSizeMB).catch(() => undefined);
  }

  private async make(sizeMB: number): Promise<string> {
    const id = `d${randomBytes(8).toString('hex')}`;
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    const image = this.image(id);
    try {
      const file = await open(image, 'wx', 0o600);
      await file.truncate(sizeMB * 2 ** 20);
      await file.close();
      await run(MKFS, [
        '-q',
        '-F',
        '-m',
        '0',
        '-E',
        'lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0',
        image,
      ]);
      await this.attach(id);
    } catch (error) {
      await this.remove(id).catch(() => undefined);
      throw error;
    }
    return id;
  }

  /** Mounts disk `id` if it is not (after a restart of the host). */
  async attach(id: string): Promise<string> {
    const folder = this.folder(id);
    if (mounted(folder)) return folder;
    if (!existsSync(this.image(id))) throw new Error(`the disk image ${this.image(id)} is missing`);
    await mkdir(folder, { recursive: true, mode: 0o700 });
    await run(MOUNT, ['-o', 'loop,nosuid,nodev,noatime', this.image(id), folder]);
    return folder;
  }

  async detach(id: string): Promise<void> {
    const folder = this.folder(id);
    if (!mounted(folder)) return;
    await run(UMOUNT, [folder]).catch(() => run(UMOUNT, ['-l', folder]));
  }

  /** Unmounts and deletes disk `id`. Idempotent. */
  async remove(id: string): Promise<void> {
    await this.detach(id);
    // Only the empty mount point: a sandbox's files are never walked on the host's view.
    await rmdir(this.folder(id)).catch((error: NodeJS.ErrnoException) => {
      if (error.code !== 'ENOENT') throw error;
    });
    await rm(this.image(id), { force: true });
  }

  /** Unmounts every disk (Moat is stopping: the spare goes, sandboxes' disks stay for restore). */
  async stop(): Promise<void> {
    const spare = await (this.spare ?? Promise.resolve(undefined));
    this.spare = undefined;
    if (spare !== undefined) await this.remove(spare);
    for (const id of await this.ids()) await this.detach(id).catch(() => undefined);
  }

  /** Removes disks no sandbox names (what a crash mid-create left, spares of an earlier run). */
  async reconcile(keep: ReadonlySet<string>): Promise<string[]> {
    const spare = await (this.spare ?? Promise.resolve(undefined));
    const unknown = (await this.ids()).filter((id) => !keep.has(id) && id !== spare);
    for (const id of unknown) await this.remove(id);
    return unknown;
  }

  private async ids(): Promise<string[]> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    return [...new Set(names.map((n) => n.replace(/\.img$/, '')))].filter((n) =>
      /^d[0-9a-f]{16}$/.test(n),
    );
  }
}
