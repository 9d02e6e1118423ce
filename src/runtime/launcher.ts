/**
 * Moat's side of a sandbox launcher (supervisor/launcher.py): the process role of one user,
 * inside the sandbox, that forks the sandbox's commands on request and relays their output.
 * Its frames are checked field by field; one that is wrong ends the launcher (RoleConnection).
 *
 * Both directions are flow-controlled, so neither a client that stops reading nor a command
 * that stops reading its input makes Moat buffer without bound: the launcher may send at most
 * OUTPUT_WINDOW bytes of a command's output that Moat has not credited back (credit goes back
 * once the output is delivered), and Moat keeps at most INPUT_WINDOW bytes of a command's input
 * in flight before the launcher reports them taken.
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

/** Must equal OUTPUT_WINDOW in supervisor/launcher.py. */
export const OUTPUT_WINDOW = 1 << 20;
/** Input sent ahead of what the command has taken; callers wait for room past it. */
export const INPUT_WINDOW = 1 << 20;

export interface LaunchedCallbacks {
  /** Output of the command; `delivered` is called once it has gone where it goes. */
  output(fd: 1 | 2, bytes: Buffer, delivered: () => void): void;
  exit(code: number | null, signal: number | null): void;
}

interface Pending {
  readonly callbacks: LaunchedCallbacks;
  readonly started: { resolve: () => void; reject: (error: Error) => void };
  /** The launcher said it runs (before that, an ended launcher started nothing). */
  running: boolean;
  /** Output bytes sent by the launcher and not yet credited back. */
  outputUncredited: number;
  /** Input bytes sent and not yet reported taken. */
  inputInFlight: number;
  /** Called when input in flight falls (or the command ends). */
  inputWaiters: Array<() => void>;
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
      // Until it says the command runs (or could not), Moat waits on the launcher.
      const over = this.connection.waitOn();
      this.commands.set(id, {
        callbacks,
        started: {
          resolve: () => {
            over();
            resolve(id);
          },
          reject: (error) => {
            over();
            reject(error);
          },
        },
        running: false,
        outputUncredited: 0,
        inputInFlight: 0,
        inputWaiters: [],
      });
      this.connection.send({ op: 'start', id, ...command });
    });
  }

  write(id: number, bytes: Buffer): void {
    const command = this.commands.get(id);
    if (command === undefined) return;
    command.inputInFlight += bytes.length;
    this.connection.send({ op: 'stdin', id }, bytes);
  }

  /** Resolves once less than INPUT_WINDOW of the command's input is in flight (or it ended). */
  async inputRoom(id: number): Promise<void> {
    for (;;) {
      const command = this.commands.get(id);
      if (command === undefined || command.inputInFlight < INPUT_WINDOW) return;
      await new Promise<void>((resolve) => command.inputWaiters.push(resolve));
    }
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
    // Every event of a command comes before its exit: one for no command is a lie.
    if (command === undefined) throw new FrameError(`event for unknown command ${id}`);
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
        command.outputUncredited += payload.length;
        if (command.outputUncredited > OUTPUT_WINDOW) {
          throw new FrameError(
            `command ${id} sent output past its window of ${OUTPUT_WINDOW} bytes`,
          );
        }
        command.callbacks.output(fd, payload, () => this.credit(id, command, payload.length));
        break;
      }
      case 'taken': {
        const bytes = field.int(header, 'bytes');
        if (bytes <= 0 || bytes > command.inputInFlight) {
          throw new FrameError(
            `command ${id} took ${bytes} bytes of ${command.inputInFlight} sent`,
          );
        }
        command.inputInFlight -= bytes;
        this.wakeInput(command);
        break;
      }
      case 'exit':
        this.commands.delete(id);
        this.wakeInput(command);
        command.callbacks.exit(
          header.code === undefined ? null : field.int(header, 'code'),
          header.signal === undefined ? null : field.int(header, 'signal'),
        );
        break;
      default:
        throw new FrameError(`unknown launcher event ${JSON.stringify(header.ev)}`);
    }
  }

  /** Output delivered: the launcher may read that much more of the command's output. */
  private credit(id: number, command: Pending, bytes: number): void {
    command.outputUncredited -= bytes;
    if (this.commands.get(id) === command) this.connection.send({ op: 'credit', id, bytes });
  }

  private wakeInput(command: Pending): void {
    const waiters = command.inputWaiters.splice(0);
    for (const wake of waiters) wake();
  }

  /**
   * The launcher ended: every command it ran is reported ended with it; those it had not yet
   * started fail to start (their caller may try another launcher).
   */
  private onGone(error: Error): void {
    if (this.gone) return;
    this.gone = error;
    for (const command of this.commands.values()) {
      this.wakeInput(command);
      if (command.running) command.callbacks.exit(null, 9);
      else command.started.reject(error);
    }
    this.commands.clear();
  }
}
