/**
 * Moat's side of a sandbox launcher (supervisor/launcher.py): the process role of one user,
 * inside the sandbox, that forks the sandbox's commands on request and relays their output.
 * Its frames are checked field by field; one that is wrong ends the launcher (RoleConnection).
 */
import { field, FrameError, type FrameHeader } from './frames.js';
import type { RoleConnection } from './role-connection.js';

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

interface Pending {
  readonly callbacks: LaunchedCallbacks;
  readonly started: { resolve: () => void; reject: (error: Error) => void };
  /** The launcher said it runs (before that, an ended launcher started nothing). */
  running: boolean;
}

export class Launcher {
  private nextId = 1;
  private readonly commands = new Map<number, Pending>();
  private gone: Error | undefined;

  constructor(private readonly connection: RoleConnection) {
    connection.onFrame(({ header, payload }) => this.onEvent(header, payload));
    void connection.closed.then((error) => this.onGone(error));
  }

  get alive(): boolean {
    return this.gone === undefined;
  }

  /** Resolves once the command runs (its exec succeeded); rejects with why it could not. */
  start(command: LaunchCommand, callbacks: LaunchedCallbacks): Promise<number> {
    if (this.gone) return Promise.reject(this.gone);
    const id = this.nextId++;
    return new Promise<number>((resolve, reject) => {
      this.commands.set(id, {
        callbacks,
        started: { resolve: () => resolve(id), reject },
        running: false,
      });
      this.connection.send({ op: 'start', id, ...command });
    });
  }

  write(id: number, bytes: Buffer): void {
    this.connection.send({ op: 'stdin', id }, bytes);
  }

  closeStdin(id: number): void {
    this.connection.send({ op: 'close', id });
  }

  resize(id: number, cols: number, rows: number): void {
    this.connection.send({ op: 'resize', id, cols, rows });
  }

  signal(id: number, signal: 'SIGTERM' | 'SIGKILL'): void {
    this.connection.send({ op: 'signal', id, signal: signal === 'SIGKILL' ? 9 : 15 });
  }

  stop(): void {
    this.connection.close();
  }

  private onEvent(header: FrameHeader, payload: Buffer): void {
    const id = field.int(header, 'id');
    const command = this.commands.get(id);
    if (command === undefined) return; // a command Moat no longer follows
    switch (header.ev) {
      case 'started':
        command.running = true;
        command.started.resolve();
        break;
      case 'failed':
        this.commands.delete(id);
        command.started.reject(new Error(field.string(header, 'error').slice(0, 4000)));
        break;
      case 'out': {
        const fd = field.int(header, 'fd');
        if (fd !== 1 && fd !== 2) throw new FrameError(`output fd ${fd} is neither 1 nor 2`);
        command.callbacks.output(fd, payload);
        break;
      }
      case 'exit':
        this.commands.delete(id);
        command.callbacks.exit(
          header.code === undefined ? null : field.int(header, 'code'),
          header.signal === undefined ? null : field.int(header, 'signal'),
        );
        break;
      default:
        throw new FrameError(`unknown launcher event ${JSON.stringify(header.ev)}`);
    }
  }

  /**
   * The launcher ended: every command it ran is reported ended with it; those it had not yet
   * started fail to start (their caller may try another launcher).
   */
  private onGone(error: Error): void {
    if (this.gone) return;
    this.gone = error;
    for (const command of this.commands.values()) {
      if (command.running) command.callbacks.exit(null, 9);
      else command.started.reject(error);
    }
    this.commands.clear();
  }
}
