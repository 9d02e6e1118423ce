/**
 * Moat's side of a sandbox launcher (see launcher-source.ts): one long-lived process per sandbox
 * and user, inside the sandbox, that forks the sandbox's commands on request and relays their
 * output.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';

export const PYTHON = '/usr/bin/python3';

export interface LaunchCommand {
  readonly argv: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  /** Working folder as the launcher sees it. */
  readonly cwd: string;
  readonly stdin: boolean;
  /** Give the command its own process group (signals then reach its children). */
  readonly group: boolean;
  /** Run it on a pseudo-terminal of this size (its output then arrives as fd 1). */
  readonly pty?: { readonly cols: number; readonly rows: number };
}

export interface LaunchedCallbacks {
  output(fd: 1 | 2, bytes: Buffer): void;
  exit(code: number | null, signal: number | null): void;
}

type LauncherEvent =
  | { ev: 'started'; id: number }
  | { ev: 'failed'; id: number; error: string }
  | { ev: 'out'; id: number; fd: 1 | 2; data: string }
  | { ev: 'exit'; id: number; code?: number; signal?: number };

interface Pending {
  readonly callbacks: LaunchedCallbacks;
  readonly started: { resolve: () => void; reject: (error: Error) => void };
}

export class Launcher {
  private nextId = 1;
  private readonly commands = new Map<number, Pending>();
  private buffered = '';
  private gone: Error | undefined;
  private markExited: () => void = () => undefined;
  /** Resolves once the launcher process is gone (killed with its sandbox, or stopped). */
  readonly exited = new Promise<void>((resolve) => (this.markExited = resolve));

  private constructor(private readonly child: ChildProcess) {
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => this.onData(chunk));
    child.stderr!.resume();
    child.stdin!.on('error', () => undefined);
    child.on('close', (code, signal) =>
      this.onGone(new Error(`the sandbox launcher ended (${signal ?? `exit ${code}`})`)),
    );
    child.on('error', (error) => this.onGone(error));
  }

  /** Starts a launcher with the argv/env/cwd its confinement and containment give. */
  static spawn(launch: { argv: string[]; env: Record<string, string>; cwd: string }): Launcher {
    if (!existsSync(PYTHON)) {
      throw new Error(
        `${PYTHON} is needed to start sandbox processes (Debian package python3-minimal)`,
      );
    }
    const [file, ...args] = launch.argv as [string, ...string[]];
    return new Launcher(
      spawn(file, args, {
        cwd: launch.cwd,
        env: launch.env,
        // Its own process group: without a freezer cgroup, signals to the group reach everything
        // it started.
        detached: true,
        stdio: ['pipe', 'pipe', 'pipe'],
      }),
    );
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  get alive(): boolean {
    return this.gone === undefined;
  }

  /** Resolves once the command runs (its exec succeeded); rejects with why it could not. */
  start(command: LaunchCommand, callbacks: LaunchedCallbacks): Promise<number> {
    if (this.gone) return Promise.reject(this.gone);
    const id = this.nextId++;
    return new Promise<number>((resolve, reject) => {
      this.commands.set(id, { callbacks, started: { resolve: () => resolve(id), reject } });
      this.send({ op: 'start', id, ...command });
    });
  }

  write(id: number, bytes: Buffer): void {
    this.send({ op: 'stdin', id, data: bytes.toString('base64') });
  }

  closeStdin(id: number): void {
    this.send({ op: 'close', id });
  }

  resize(id: number, cols: number, rows: number): void {
    this.send({ op: 'resize', id, cols, rows });
  }

  signal(id: number, signal: 'SIGTERM' | 'SIGKILL'): void {
    this.send({ op: 'signal', id, signal: signal === 'SIGKILL' ? 9 : 15 });
  }

  /** Closing its stdin ends the launcher (and, with it gone, nothing new starts). */
  stop(): void {
    this.child.stdin!.end();
  }

  private send(message: object): void {
    if (!this.gone) this.child.stdin!.write(`${JSON.stringify(message)}\n`);
  }

  private onData(chunk: string): void {
    this.buffered += chunk;
    let newline: number;
    while ((newline = this.buffered.indexOf('\n')) >= 0) {
      const line = this.buffered.slice(0, newline);
      this.buffered = this.buffered.slice(newline + 1);
      if (line !== '') this.onEvent(JSON.parse(line) as LauncherEvent);
    }
  }

  private onEvent(event: LauncherEvent): void {
    const command = this.commands.get(event.id);
    if (command === undefined) return;
    switch (event.ev) {
      case 'started':
        command.started.resolve();
        break;
      case 'failed':
        this.commands.delete(event.id);
        command.started.reject(new Error(event.error));
        break;
      case 'out':
        command.callbacks.output(event.fd, Buffer.from(event.data, 'base64'));
        break;
      case 'exit':
        this.commands.delete(event.id);
        command.callbacks.exit(event.code ?? null, event.signal ?? null);
        break;
    }
  }

  /** The launcher died (killed with its sandbox): every command it ran ended with it. */
  private onGone(error: Error): void {
    if (this.gone) return;
    this.gone = error;
    this.markExited();
    for (const command of this.commands.values()) {
      command.started.reject(error);
      command.callbacks.exit(null, 9);
    }
    this.commands.clear();
  }
}
