/**
 * A numeric range one Moat holds on this host (its namespace addresses, its sandbox ids): a
 * lock file in /run/moat naming the holder by pid. Two Moats whose ranges overlap would hand
 * the same addresses or ids to two sandboxes, so a range is refused while a live process holds
 * one that overlaps it. A holder that died leaves a file that the next taker replaces.
 *
 * A lock may name its owner (a data folder): the file then stays after release or a crash,
 * naming it, so that a Moat choosing a range for itself can leave that one to its owner's
 * next start (sandbox ids recorded in a data folder are only of use with the same range).
 */
import { existsSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { processRuns } from '../process/index.js';

export const LOCK_DIR = '/run/moat';
/** Ranges held by this process (its own pid is alive, so files cannot tell them apart). */
const heldHere = new Set<string>();

interface Conflict {
  readonly start: number;
  readonly end: number;
  readonly holder: string;
}

export class RangeLock {
  private held = false;

  constructor(
    /** Names the kind of range in file names and messages (`pool`, `ids`). */
    private readonly kind: string,
    readonly start: number,
    readonly end: number,
    /** How messages name the range (`the namespace pool 10.213.0.0/16`). */
    private readonly description: string,
    /** What to do about a conflict (`give each Moat on a host its own --namespace-pool`). */
    private readonly advice: string,
    /** How messages write another range (`10.217.0.0/24`). */
    private readonly format: (start: number, end: number) => string,
    /** The data folder the range is for, recorded in the file for as long as it exists. */
    private readonly owner?: string,
    private readonly dir = LOCK_DIR,
  ) {}

  private get content(): string {
    return `${process.pid}\n${this.owner ?? ''}\n`;
  }

  /**
   * Whether the range was last taken for another data folder that still exists (its owner
   * would want it back), whether or not that Moat runs now.
   */
  async keptForAnother(): Promise<boolean> {
    const lines = (await readFile(this.file, 'utf8').catch(() => '')).split('\n');
    const recorded = lines[1] ?? '';
    return recorded !== '' && recorded !== this.owner && existsSync(recorded);
  }

  /** When its file was last written (taken or released; 0: never), in ms since the epoch. */
  async lastWritten(): Promise<number> {
    return (await stat(this.file).catch(() => undefined))?.mtimeMs ?? 0;
  }

  private get file(): string {
    return `${this.dir}/${this.kind}-${this.start}-${this.end}.pid`;
  }

  get isHeld(): boolean {
    return this.held;
  }

  /** Takes the range, or throws naming who holds it (or an overlapping one). */
  async acquire(): Promise<void> {
    const refuse = (conflict: Conflict) =>
      new Error(
        conflict.start === this.start && conflict.end === this.end
          ? `${this.description} is in use by another Moat (${conflict.holder}); ${this.advice}`
          : `${this.description} overlaps ${this.format(conflict.start, conflict.end)}, held by ${conflict.holder}; ${this.advice}`,
      );
    if (heldHere.has(this.file)) {
      throw refuse({ start: this.start, end: this.end, holder: 'this process' });
    }
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    try {
      await writeFile(this.file, this.content, { flag: 'wx', mode: 0o600 });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      const holder = Number.parseInt(await readFile(this.file, 'utf8').catch(() => ''), 10);
      if (holder !== process.pid && processRuns(holder)) {
        throw refuse({ start: this.start, end: this.end, holder: `process ${holder}` });
      }
      await writeFile(this.file, this.content, { mode: 0o600 });
    }
    heldHere.add(this.file);
    this.held = true;
    // Checked after taking ours, so that of two Moats starting at once at least one sees the other.
    const overlapping = await this.conflict();
    if (overlapping !== undefined) {
      await this.release();
      throw refuse(overlapping);
    }
  }

  /** Whether acquire() would succeed now. */
  async available(): Promise<boolean> {
    return (await this.conflict()) === undefined;
  }

  async release(): Promise<void> {
    if (!this.held) return;
    heldHere.delete(this.file);
    this.held = false;
    if (this.owner === undefined) await rm(this.file, { force: true });
    else await writeFile(this.file, `0\n${this.owner}\n`, { mode: 0o600 });
  }

  /** A live holder (other than this lock) of a range that overlaps this one. */
  private async conflict(): Promise<Conflict | undefined> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    const pattern = new RegExp(`^${this.kind}-(\\d+)-(\\d+)\\.pid$`);
    for (const name of names) {
      const match = pattern.exec(name);
      if (match === null) continue;
      const [start, end] = [Number(match[1]), Number(match[2])];
      if (end < this.start || start > this.end) continue;
      const file = `${this.dir}/${name}`;
      if (file === this.file && this.held) continue;
      if (heldHere.has(file)) return { start, end, holder: 'this process' };
      const holder = Number.parseInt(await readFile(file, 'utf8').catch(() => ''), 10);
      if (holder !== process.pid && processRuns(holder)) {
        return { start, end, holder: `process ${holder}` };
      }
    }
    return undefined;
  }
}
