/**
 * The processes of one sandbox: started through its confinement and containment, with output
 * delivered as events to whoever is attached (the Start stream, Connect streams).
 */
import { EventEmitter } from 'node:events';
import os from 'node:os';
import type { SandboxUser } from './confinement.js';
import type { Launcher } from './launcher.js';

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
  launcher: Launcher;
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

  /**
   * Bytes for standard input (or the terminal); false when input is closed. Callers wait for
   * inputRoom() first: input in flight is bounded only by callers that do.
   */
  write(stream: 'stdin' | 'pty', bytes: Buffer): boolean {
    if (this.finished || !this.io.stdinOpen || (stream === 'pty') !== this.io.terminal) {
      return false;
    }
    this.io.launcher.write(this.io.id, bytes);
    return true;
  }

  /** Resolves once the process has taken enough of its input for more to be sent. */
  inputRoom(): Promise<void> {
    return this.io.launcher.inputRoom(this.io.id);
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

  /**
   * Output of the process (held until released); `delivered` once every listener has taken it
   * (the launcher then reads more of it: a listener that cannot keep up slows the process).
   */
  output(stream: OutputStream, bytes: Buffer, delivered: () => void): void {
    const deliver = () => {
      const waits: Promise<void>[] = [];
      this.slowListeners = waits;
      try {
        this.emit('data', stream, bytes);
      } finally {
        this.slowListeners = undefined;
      }
      if (waits.length === 0) delivered();
      else void Promise.all(waits).then(delivered);
    };
    if (this.held) this.held.push(deliver);
    else deliver();
  }

  private slowListeners: Promise<void>[] | undefined;

  /**
   * For a `data` listener, while handling the event: it cannot take more until `ready`
   * (which must settle, when it can take more or when it goes away).
   */
  holdOutput(ready: Promise<void>): void {
    this.slowListeners?.push(ready);
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

/** How a sandbox's commands are started: its launchers and where a command runs. */
export interface ProcessOrigin {
  /** The launcher of `user`, started on first use and again if it ended. */
  launcher(user: SandboxUser): Promise<Launcher>;
  /** Working folder and environment of a command as its launcher uses them. */
  place(spec: { user: SandboxUser; cwd: string; env: Readonly<Record<string, string>> }): {
    cwd: string;
    env: Record<string, string>;
  };
  /** Whether each command leads its own process group (signals then reach its children). */
  readonly ownGroups: boolean;
}

/** The processes of one sandbox. Commands and terminals go through a launcher per user. */
export class ProcessTable {
  private readonly running = new Map<number, SandboxProcess>();
  private nextPid = 1000;

  constructor(
    private readonly sandboxEnv: () => Readonly<Record<string, string>>,
    private readonly origin: ProcessOrigin,
  ) {}

  async start(request: StartRequest): Promise<SandboxProcess> {
    const placed = this.origin.place({
      user: request.user,
      cwd: request.config.cwd ?? request.user.home,
      env: { ...this.sandboxEnv(), ...request.config.envs },
    });
    const argv = [request.config.cmd, ...request.config.args];
    const pid = this.nextPid++;
    let launcher = await this.origin.launcher(request.user);
    const terminal = request.pty !== undefined;
    const io = { launcher, id: 0, terminal, stdinOpen: request.stdin || terminal };
    const started = new SandboxProcess(pid, request.tag, request.config, io);
    const command = {
      argv,
      ...placed,
      stdin: request.stdin,
      group: this.origin.ownGroups,
      ...(request.pty ? { pty: request.pty } : {}),
    };
    const callbacks = {
      output: (fd: 1 | 2, bytes: Buffer, delivered: () => void) =>
        started.output(terminal ? 'pty' : fd === 1 ? 'stdout' : 'stderr', bytes, delivered),
      exit: (code: number | null, signal: number | null) =>
        started.finish(describeEnd(code, signal === null ? null : signalName(signal))),
    };
    try {
      io.id = await launcher.start(command, callbacks);
    } catch (error) {
      // A launcher that ended just before (killed from inside, or closed for breaking the
      // protocol) started nothing: once more, on a new one.
      if (launcher.alive) throw error;
      launcher = await this.origin.launcher(request.user);
      Object.assign(io, { launcher });
      io.id = await launcher.start(command, callbacks);
    }
    this.running.set(pid, started);
    started.whenEnded(() => this.running.delete(pid));
    return started;
  }

  list(): SandboxProcess[] {
    return [...this.running.values()];
  }

  byPid(pid: number): SandboxProcess | undefined {
    return this.running.get(pid);
  }

  byTag(tag: string): SandboxProcess | undefined {
    return this.list().find((p) => p.tag === tag);
  }
}
