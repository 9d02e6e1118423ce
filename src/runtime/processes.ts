/**
 * The processes of one sandbox: started through its confinement and containment, with output
 * delivered as events to whoever is attached (the Start stream, Connect streams).
 */
import { EventEmitter } from 'node:events';
import os from 'node:os';
import type { Confinement, SandboxUser } from './confinement.js';
import type { Containment } from './containment.js';
import { Launcher, PYTHON } from './launcher.js';
import { LAUNCHER_SOURCE } from './launcher-source.js';

export interface ProcessConfig {
  readonly cmd: string;
  readonly args: readonly string[];
  readonly envs: Readonly<Record<string, string>>;
  /** As the sandbox sees it; the user's home when absent. */
  readonly cwd?: string;
}

export interface StartRequest {
  readonly config: ProcessConfig;
  readonly user: SandboxUser;
  readonly tag?: string;
  readonly pty?: { readonly cols: number; readonly rows: number };
  /** Keep stdin open for SendInput (otherwise it is closed at once). */
  readonly stdin: boolean;
}

export type OutputStream = 'stdout' | 'stderr' | 'pty';

/** How a process ended, in the words the reference daemon uses (`exit status 1`, `signal: killed`). */
export interface ProcessEnd {
  readonly exitCode: number;
  readonly exited: boolean;
  readonly status: string;
  /** Set when it did not exit with 0. */
  readonly error: string | undefined;
}

export interface ProcessEvents {
  data: [stream: OutputStream, bytes: Buffer];
  end: [end: ProcessEnd];
}

const SIGNAL_NAMES: Record<string, string> = {
  SIGKILL: 'killed',
  SIGTERM: 'terminated',
  SIGINT: 'interrupt',
  SIGHUP: 'hangup',
  SIGPIPE: 'broken pipe',
};

function describeEnd(code: number | null, signal: NodeJS.Signals | null): ProcessEnd {
  if (signal !== null) {
    const status = `signal: ${SIGNAL_NAMES[signal] ?? signal}`;
    return { exitCode: -1, exited: false, status, error: status };
  }
  const exitCode = code ?? -1;
  const status = `exit status ${exitCode}`;
  return { exitCode, exited: true, status, error: exitCode === 0 ? undefined : status };
}

/** How Moat reaches one process: its number at the sandbox's launcher. */
interface ProcessIO {
  readonly launcher: Launcher;
  id: number;
  readonly terminal: boolean;
  stdinOpen: boolean;
}

/** One running (or just ended) process of a sandbox. */
export class SandboxProcess extends EventEmitter<ProcessEvents> {
  private finished: ProcessEnd | undefined;
  /**
   * Events that came before anyone listened: output can arrive in the same read as the launcher's
   * "started", before the caller has attached. `release()` replays them.
   */
  private held: Array<() => void> | undefined = [];

  constructor(
    /** Moat's number for it (what the sandbox API calls its pid). */
    readonly pid: number,
    readonly tag: string | undefined,
    readonly config: ProcessConfig,
    private readonly io: ProcessIO,
  ) {
    super();
  }

  get ended(): ProcessEnd | undefined {
    return this.finished;
  }

  /** Bytes for standard input (or the terminal); false when input is closed. */
  write(stream: 'stdin' | 'pty', bytes: Buffer): boolean {
    if (this.finished || !this.io.stdinOpen || (stream === 'pty') !== this.io.terminal) {
      return false;
    }
    this.io.launcher.write(this.io.id, bytes);
    return true;
  }

  closeStdin(): void {
    if (!this.io.stdinOpen || this.io.terminal) return;
    this.io.stdinOpen = false;
    this.io.launcher.closeStdin(this.io.id);
  }

  resize(cols: number, rows: number): boolean {
    if (!this.io.terminal || this.finished) return false;
    this.io.launcher.resize(this.io.id, cols, rows);
    return true;
  }

  /** Signals the process and (where processes get their own group) its children. */
  signal(signal: 'SIGTERM' | 'SIGKILL'): void {
    if (!this.finished) this.io.launcher.signal(this.io.id, signal);
  }

  /** Output of the process (held until released). */
  output(stream: OutputStream, bytes: Buffer): void {
    if (this.held) this.held.push(() => this.emit('data', stream, bytes));
    else this.emit('data', stream, bytes);
  }

  finish(end: ProcessEnd): void {
    if (this.finished) return;
    this.finished = end;
    for (const hook of this.endHooks) hook();
    if (this.held) this.held.push(() => this.emit('end', end));
    else this.emit('end', end);
  }

  private readonly endHooks: Array<() => void> = [];

  /** Runs `hook` the moment the process ends, whether or not its events are held. */
  whenEnded(hook: () => void): void {
    if (this.finished) hook();
    else this.endHooks.push(hook);
  }

  /** Called once the first listener is attached: from now on events flow as they come. */
  release(): void {
    const held = this.held;
    this.held = undefined;
    for (const replay of held ?? []) replay();
  }
}

const signalName = (signal: number): NodeJS.Signals =>
  (Object.entries(os.constants.signals).find(([, n]) => n === signal)?.[0] ??
    'SIGKILL') as NodeJS.Signals;

/**
 * The processes of one sandbox. Commands and terminals go through a launcher per user that runs
 * inside the sandbox (started on first use, again if it died).
 */
export class ProcessTable {
  private readonly running = new Map<number, SandboxProcess>();
  private readonly launchers = new Map<string, Launcher>();
  private nextPid = 1000;

  constructor(
    private readonly root: string,
    private readonly sandboxEnv: () => Readonly<Record<string, string>>,
    private readonly confinement: Confinement,
    private readonly containment: Containment,
  ) {}

  async start(request: StartRequest): Promise<SandboxProcess> {
    const spec = {
      root: this.root,
      user: request.user,
      cwd: request.config.cwd ?? request.user.home,
      env: { ...this.sandboxEnv(), ...request.config.envs },
    };
    const argv = [request.config.cmd, ...request.config.args];
    const pid = this.nextPid++;
    const started = await this.launch(pid, request, { argv, ...this.confinement.place(spec) });
    this.running.set(pid, started);
    started.whenEnded(() => this.running.delete(pid));
    return started;
  }

  private launcherFor(user: SandboxUser): Launcher {
    const current = this.launchers.get(user.name);
    if (current?.alive) return current;
    const launch = this.confinement.launch({
      root: this.root,
      user,
      cwd: user.home,
      env: {},
      argv: [PYTHON, '-c', LAUNCHER_SOURCE],
    });
    const launcher = Launcher.spawn({ ...launch, argv: this.containment.wrap(launch.argv) });
    const pid = launcher.pid;
    if (pid !== undefined) {
      this.containment.track(pid);
      // Forget it once gone: its pid may be reused by an unrelated process group.
      void launcher.exited.then(() => this.containment.untrack(pid));
    }
    this.launchers.set(user.name, launcher);
    return launcher;
  }

  private async launch(
    pid: number,
    request: StartRequest,
    placed: { argv: string[]; cwd: string; env: Record<string, string> },
  ): Promise<SandboxProcess> {
    const launcher = this.launcherFor(request.user);
    const terminal = request.pty !== undefined;
    const io = { launcher, id: 0, terminal, stdinOpen: request.stdin || terminal };
    const started = new SandboxProcess(pid, request.tag, request.config, io);
    io.id = await launcher.start(
      {
        ...placed,
        stdin: request.stdin,
        group: this.containment.ownGroups,
        ...(request.pty ? { pty: request.pty } : {}),
      },
      {
        output: (fd, bytes) =>
          started.output(terminal ? 'pty' : fd === 1 ? 'stdout' : 'stderr', bytes),
        exit: (code, signal) =>
          started.finish(describeEnd(code, signal === null ? null : signalName(signal))),
      },
    );
    return started;
  }

  list(): SandboxProcess[] {
    return [...this.running.values()];
  }

  /** The host pids of the launchers still running (every command runs below one). */
  launcherPids(): number[] {
    return [...this.launchers.values()].flatMap((launcher) =>
      launcher.alive && launcher.pid !== undefined ? [launcher.pid] : [],
    );
  }

  byPid(pid: number): SandboxProcess | undefined {
    return this.running.get(pid);
  }

  byTag(tag: string): SandboxProcess | undefined {
    return this.list().find((p) => p.tag === tag);
  }

  pause(): Promise<void> {
    return this.containment.pause();
  }

  resume(): Promise<void> {
    return this.containment.resume();
  }

  async killAll(): Promise<void> {
    for (const launcher of this.launchers.values()) launcher.stop();
    await this.containment.killAll();
  }
}
