/**
 * The processes of one sandbox: started through its confinement and containment, with output
 * delivered as events to whoever is attached (the Start stream, Connect streams).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { EventEmitter } from 'node:events';
import os from 'node:os';
import nodePty from 'node-pty';
import type { Confinement, SandboxUser } from './confinement.js';
import type { Containment } from './containment.js';

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

/** One running (or just ended) process of a sandbox. */
export class SandboxProcess extends EventEmitter<ProcessEvents> {
  private stdinOpen: boolean;
  private finished: ProcessEnd | undefined;

  private constructor(
    readonly pid: number,
    readonly tag: string | undefined,
    readonly config: ProcessConfig,
    private readonly io:
      | { readonly kind: 'pipes'; readonly child: ChildProcess }
      | { readonly kind: 'pty'; readonly pty: nodePty.IPty },
    stdin: boolean,
  ) {
    super();
    this.stdinOpen = stdin || io.kind === 'pty';
  }

  static start(
    request: StartRequest,
    launch: { argv: string[]; env: Record<string, string>; cwd: string },
  ): SandboxProcess {
    const [file, ...args] = launch.argv as [string, ...string[]];
    if (request.pty) {
      const pty = nodePty.spawn(file, args, {
        cols: request.pty.cols,
        rows: request.pty.rows,
        cwd: launch.cwd,
        env: launch.env,
        encoding: null,
        name: 'xterm-256color',
      } as nodePty.IPtyForkOptions);
      const process = new SandboxProcess(
        pty.pid,
        request.tag,
        request.config,
        { kind: 'pty', pty },
        true,
      );
      pty.onData((data) => process.emit('data', 'pty', Buffer.from(data as unknown as Uint8Array)));
      pty.onExit(({ exitCode, signal }) =>
        process.finish(describeEnd(signal ? null : exitCode, signal ? signalName(signal) : null)),
      );
      return process;
    }
    const child = spawn(file, args, {
      cwd: launch.cwd,
      env: launch.env,
      detached: true, // its own process group, so pause and kill reach its children
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    if (child.pid === undefined) {
      throw new Error(`could not start ${request.config.cmd}`);
    }
    const process = new SandboxProcess(
      child.pid,
      request.tag,
      request.config,
      { kind: 'pipes', child },
      request.stdin,
    );
    child.stdout!.on('data', (bytes: Buffer) => process.emit('data', 'stdout', bytes));
    child.stderr!.on('data', (bytes: Buffer) => process.emit('data', 'stderr', bytes));
    // A write after the process closed its stdin must not take Moat down.
    child.stdin!.on('error', () => undefined);
    if (!request.stdin) child.stdin!.end();
    child.on('close', (code, signal) => process.finish(describeEnd(code, signal)));
    return process;
  }

  get ended(): ProcessEnd | undefined {
    return this.finished;
  }

  /** Bytes for standard input (or the terminal); false when input is closed. */
  write(stream: 'stdin' | 'pty', bytes: Buffer): boolean {
    if (this.finished) return false;
    if (this.io.kind === 'pty') {
      this.io.pty.write(bytes);
      return true;
    }
    if (stream !== 'stdin' || !this.stdinOpen) return false;
    this.io.child.stdin!.write(bytes);
    return true;
  }

  closeStdin(): void {
    this.stdinOpen = false;
    if (this.io.kind === 'pipes') this.io.child.stdin!.end();
  }

  resize(cols: number, rows: number): boolean {
    if (this.io.kind !== 'pty' || this.finished) return false;
    this.io.pty.resize(cols, rows);
    return true;
  }

  /** Signals the whole process group. */
  signal(signal: 'SIGTERM' | 'SIGKILL'): void {
    if (this.finished) return;
    try {
      process.kill(-this.pid, signal);
    } catch {
      // Its group is gone already; the end event follows.
    }
  }

  private finish(end: ProcessEnd): void {
    if (this.finished) return;
    this.finished = end;
    this.emit('end', end);
  }
}

const signalName = (signal: number): NodeJS.Signals =>
  (Object.entries(os.constants.signals).find(([, n]) => n === signal)?.[0] ??
    'SIGKILL') as NodeJS.Signals;

/** The processes of one sandbox. */
export class ProcessTable {
  private readonly running = new Map<number, SandboxProcess>();

  constructor(
    private readonly root: string,
    private readonly sandboxEnv: () => Readonly<Record<string, string>>,
    private readonly confinement: Confinement,
    private readonly containment: Containment,
  ) {}

  start(request: StartRequest): SandboxProcess {
    const launch = this.confinement.launch({
      root: this.root,
      user: request.user,
      cwd: request.config.cwd ?? request.user.home,
      env: { ...this.sandboxEnv(), ...request.config.envs },
      argv: [request.config.cmd, ...request.config.args],
    });
    launch.argv = this.containment.wrap(launch.argv);
    const started = SandboxProcess.start(request, launch);
    this.running.set(started.pid, started);
    this.containment.track(started.pid);
    started.once('end', () => {
      this.running.delete(started.pid);
      this.containment.untrack(started.pid);
    });
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

  pause(): Promise<void> {
    return this.containment.pause();
  }

  resume(): Promise<void> {
    return this.containment.resume();
  }

  killAll(): Promise<void> {
    return this.containment.killAll();
  }
}
