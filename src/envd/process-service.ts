/**
 * `process.Process`: start, attach to, list, feed, signal and resize a sandbox's processes.
 * Output goes to whoever is attached; a client that goes away leaves the process running (as
 * the reference daemon does), and Connect-Timeout-Ms ends it.
 */
import {
  type ProcessEnd,
  type ProcessTable,
  RoleStalled,
  type SandboxProcess,
} from '../runtime/index.js';
import { ConnectError, EnvelopeReader, type ServerStream } from './connect.js';
import type { CallContext, Method } from './context.js';

type Message = Record<string, unknown>;

const invalid = (message: string) => new ConnectError('invalid_argument', message);

function objectAt(message: Message, field: string, required: boolean): Message | undefined {
  const value = message[field];
  if (value === undefined || value === null) {
    if (required) throw invalid(`${field} is required`);
    return undefined;
  }
  if (typeof value !== 'object' || Array.isArray(value))
    throw invalid(`${field} must be an object`);
  return value as Message;
}

/**
 * A oneof as the spec defines it: exactly one of `members`, nothing else. Returns the member set.
 */
function exactlyOne(value: Message, members: readonly string[], field: string): string {
  const keys = Object.keys(value);
  const unknown = keys.find((k) => !members.includes(k));
  if (unknown !== undefined) {
    throw invalid(
      `${field} has unknown member ${JSON.stringify(unknown)}; allowed: ${members.join(', ')}`,
    );
  }
  if (keys.length !== 1) {
    throw invalid(`${field} must have exactly one of ${members.join(', ')} (got ${keys.length})`);
  }
  return keys[0]!;
}

/** The process a `{pid}` or `{tag}` selector names. */
function selected(message: Message, processes: ProcessTable): SandboxProcess {
  const selector = objectAt(message, 'process', true)!;
  const member = exactlyOne(selector, ['pid', 'tag'], 'process');
  const value = selector[member];
  if (member === 'pid') {
    if (!Number.isSafeInteger(value) || (value as number) <= 0) {
      throw invalid('process.pid must be a positive integer');
    }
    const found = processes.byPid(value as number);
    if (!found) throw new ConnectError('not_found', `process with pid ${String(value)} not found`);
    return found;
  }
  if (typeof value !== 'string') throw invalid('process.tag must be a string');
  const found = processes.byTag(value);
  if (!found) throw new ConnectError('not_found', `process with tag ${value} not found`);
  return found;
}

function bytesOf(value: unknown, field: string): Buffer {
  if (typeof value !== 'string' || !/^[A-Za-z0-9+/\-_]*={0,2}$/.test(value)) {
    throw invalid(`${field} must be base64 bytes`);
  }
  return Buffer.from(value, 'base64');
}

/** Sends input once the process has room for it (it has taken what came before). */
async function applyInput(process: SandboxProcess, input: Message): Promise<void> {
  const member = exactlyOne(input, ['stdin', 'pty'], 'input');
  const bytes = bytesOf(input[member], `input.${member}`);
  await process.inputRoom();
  if (!process.write(member as 'stdin' | 'pty', bytes)) {
    throw new ConnectError(
      'failed_precondition',
      `process ${process.pid} does not take ${member} input`,
    );
  }
}

/**
 * A terminal with no size (the SDK run from CI, where stdout is no terminal, asks for 0x0; the
 * JSON form of a zero leaves the field out) gets the classic 80x24, as the reference daemon's
 * terminals do.
 */
const DEFAULT_TERMINAL = { cols: 80, rows: 24 } as const;

function terminalSize(pty: Message | undefined): { cols: number; rows: number } | undefined {
  if (pty === undefined) return undefined;
  const size = objectAt(pty, 'size', false) ?? {};
  const dimension = (field: 'cols' | 'rows') => {
    const value = size[field] ?? 0;
    if (!Number.isSafeInteger(value) || (value as number) < 0 || (value as number) > 10_000) {
      throw invalid(
        `pty.size.${field} must be from 0 (the default, ${DEFAULT_TERMINAL[field]}) to 10000`,
      );
    }
    return (value as number) === 0 ? DEFAULT_TERMINAL[field] : (value as number);
  };
  return { cols: dimension('cols'), rows: dimension('rows') };
}

const endEvent = (end: ProcessEnd) => ({
  event: {
    end: {
      ...(end.exitCode !== 0 ? { exitCode: end.exitCode } : {}),
      ...(end.exited ? { exited: true } : {}),
      status: end.status,
      ...(end.error ? { error: end.error } : {}),
    },
  },
});

/**
 * Streams a process's events (after `start`) until it ends, the deadline passes (the process is
 * killed, as the reference daemon does), or the client leaves (the process lives on).
 */
function follow(
  process: SandboxProcess,
  context: CallContext,
  stream: ServerStream,
  killAtDeadline: boolean,
): Promise<void> {
  return new Promise((resolve) => {
    const onData = (kind: string, bytes: Buffer) => {
      stream.send({ event: { data: { [kind]: bytes.toString('base64') } } });
      // A client that reads slowly slows the process (as a pipe would), not Moat's memory.
      if (stream.backedUp) process.holdOutput(stream.drained());
    };
    const timers: NodeJS.Timeout[] = [];
    let deadlinePassed = false;
    let done = false;
    const finish = (end: ProcessEnd | undefined) => {
      if (done) return;
      done = true;
      process.off('data', onData);
      process.off('end', onEnd);
      for (const timer of timers) clearTimeout(timer);
      if (end && !context.sandbox.running()) {
        // The sandbox was killed: no end event (`signal: killed` would read as the command's
        // own failure). The cut stream, then a /health that answers 502, is how the SDK
        // tells that the sandbox is gone.
        context.response.destroy();
        resolve();
        return;
      }
      if (end) stream.send(endEvent(end));
      stream.end(
        deadlinePassed
          ? new ConnectError(
              'deadline_exceeded',
              `process ${process.pid} ran past Connect-Timeout-Ms and was killed`,
            )
          : undefined,
      );
      resolve();
    };
    const onEnd = (end: ProcessEnd) => finish(end);
    process.on('data', onData);
    process.on('end', onEnd);
    context.response.once('close', () => {
      if (stream.open) finish(undefined);
    });
    if (context.keepaliveMs !== undefined) {
      const ping = setInterval(() => {
        if (!stream.backedUp) stream.send({ event: { keepalive: {} } });
      }, context.keepaliveMs);
      timers.push(ping as unknown as NodeJS.Timeout);
    }
    if (context.deadlineMs !== undefined) {
      timers.push(
        setTimeout(() => {
          deadlinePassed = true;
          if (killAtDeadline) process.signal('SIGKILL');
          else finish(undefined);
        }, context.deadlineMs),
      );
    }
    // Replays what came before anyone listened; a process that ended long ago ends the stream.
    process.release();
    if (process.ended) finish(process.ended);
  });
}

async function checkCwd(cwd: unknown, context: CallContext): Promise<string | undefined> {
  if (cwd === undefined || cwd === '') return undefined;
  if (typeof cwd !== 'string') throw invalid('process.cwd must be a string');
  // Looked at inside the sandbox, as the user the command runs as.
  const entry = await context.sandbox.runtime.files
    .stat(context.user.name, cwd, true)
    .catch(() => undefined);
  if (entry?.type !== 'FILE_TYPE_DIRECTORY') throw invalid(`cwd '${cwd}' does not exist`);
  return entry.path;
}

function stringMap(value: unknown, field: string): Record<string, string> {
  if (value === undefined || value === null) return {};
  if (
    typeof value !== 'object' ||
    Array.isArray(value) ||
    !Object.values(value).every((v) => typeof v === 'string')
  ) {
    throw invalid(`${field} must be an object of strings`);
  }
  return value as Record<string, string>;
}

const start: Method = {
  kind: 'server-stream',
  async run(message, context, stream) {
    const config = objectAt(message, 'process', true)!;
    if (typeof config.cmd !== 'string' || config.cmd === '')
      throw invalid('process.cmd is required');
    const args = config.args ?? [];
    if (!Array.isArray(args) || !args.every((a) => typeof a === 'string'))
      throw invalid('process.args must be an array of strings');
    const tag = message.tag;
    if (tag !== undefined && typeof tag !== 'string') throw invalid('tag must be a string');
    const cwd = await checkCwd(config.cwd, context);
    let started: SandboxProcess;
    try {
      started = await context.sandbox.runtime.processes.start({
        config: {
          cmd: config.cmd,
          args: args as string[],
          envs: stringMap(config.envs, 'process.envs'),
          ...(cwd ? { cwd } : {}),
        },
        user: context.user,
        ...(tag !== undefined ? { tag } : {}),
        ...(message.pty !== undefined
          ? { pty: terminalSize(objectAt(message, 'pty', false)) }
          : {}),
        stdin: message.stdin === true,
      });
    } catch (error) {
      const message = `could not start ${config.cmd}: ${(error as Error).message}`;
      throw error instanceof RoleStalled
        ? new ConnectError('deadline_exceeded', message)
        : invalid(message);
    }
    context.log.info(
      { sandboxID: context.sandbox.sandboxID, pid: started.pid, cmd: config.cmd },
      'process started',
    );
    stream.send({ event: { start: { pid: started.pid } } });
    await follow(started, context, stream, true);
  },
};

const connect: Method = {
  kind: 'server-stream',
  async run(message, context, stream) {
    const process = selected(message, context.sandbox.runtime.processes);
    stream.send({ event: { start: { pid: process.pid } } });
    await follow(process, context, stream, false);
  },
};

const list: Method = {
  kind: 'unary',
  async run(_message, context) {
    return {
      processes: context.sandbox.runtime.processes.list().map((p) => ({
        config: {
          cmd: p.config.cmd,
          args: p.config.args,
          envs: p.config.envs,
          ...(p.config.cwd ? { cwd: p.config.cwd } : {}),
        },
        pid: p.pid,
        ...(p.tag !== undefined ? { tag: p.tag } : {}),
      })),
    };
  },
};

/** Only `process` and `input`, as the spec says: anything else is refused. */
function onlyMembers(message: Message, allowed: readonly string[], method: string): void {
  const unknown = Object.keys(message).find((k) => !allowed.includes(k));
  if (unknown !== undefined) {
    throw invalid(
      `${method} has unknown member ${JSON.stringify(unknown)}; allowed: ${allowed.join(', ')}`,
    );
  }
}

const sendInput: Method = {
  kind: 'unary',
  async run(message, context) {
    onlyMembers(message, ['process', 'input'], 'SendInput');
    const input = objectAt(message, 'input', true)!;
    await applyInput(selected(message, context.sandbox.runtime.processes), input);
    return {};
  },
};

const SIGNALS: Record<string, 'SIGTERM' | 'SIGKILL'> = {
  SIGNAL_SIGTERM: 'SIGTERM',
  SIGNAL_SIGKILL: 'SIGKILL',
  15: 'SIGTERM',
  9: 'SIGKILL',
};

const sendSignal: Method = {
  kind: 'unary',
  async run(message, context) {
    onlyMembers(message, ['process', 'signal'], 'SendSignal');
    const process = selected(message, context.sandbox.runtime.processes);
    const signal = SIGNALS[String(message.signal)];
    if (signal === undefined) {
      throw invalid(
        `signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL, not ${JSON.stringify(message.signal)}`,
      );
    }
    process.signal(signal);
    return {};
  },
};

const closeStdin: Method = {
  kind: 'unary',
  async run(message, context) {
    onlyMembers(message, ['process'], 'CloseStdin');
    selected(message, context.sandbox.runtime.processes).closeStdin();
    return {};
  },
};

const update: Method = {
  kind: 'unary',
  async run(message, context) {
    onlyMembers(message, ['process', 'pty'], 'Update');
    const process = selected(message, context.sandbox.runtime.processes);
    const size = terminalSize(objectAt(message, 'pty', false));
    if (size && !process.resize(size.cols, size.rows)) {
      throw new ConnectError('failed_precondition', `process ${process.pid} has no terminal`);
    }
    return {};
  },
};

/**
 * Client stream: `{start: {process}}` first, then `{data: {input}}` or `{keepalive: {}}`
 * messages, each applied in turn. The request is read no faster than the process takes its
 * input: while it has no room, the client's bytes wait in the client's own socket.
 */
const streamInput: Method = {
  kind: 'client-stream',
  run(context) {
    return new Promise((resolve, reject) => {
      const reader = new EnvelopeReader(1 << 20);
      let target: SandboxProcess | undefined;
      let failed = false;
      let applied = Promise.resolve();
      const fail = (error: unknown) => {
        if (failed) return;
        failed = true;
        // Stop reading but keep the connection: the error still has to be written back.
        context.request.removeAllListeners('data');
        context.request.resume();
        reject(error);
      };
      const apply = async (message: Message) => {
        const member = exactlyOne(message, ['start', 'data', 'keepalive'], 'StreamInputRequest');
        if (member === 'start') {
          target = selected(objectAt(message, 'start', true)!, context.sandbox.runtime.processes);
        } else if (member === 'data') {
          if (!target) throw invalid('the first StreamInput message must be start');
          await applyInput(target, objectAt(objectAt(message, 'data', true)!, 'input', true)!);
        }
      };
      context.request.on('data', (chunk: Buffer) => {
        let messages;
        try {
          messages = reader.push(chunk);
        } catch (error) {
          fail(error);
          return;
        }
        context.request.pause();
        applied = applied
          .then(async () => {
            for (const { end, message } of messages) {
              if (!end && !failed) await apply(message);
            }
            if (!failed) context.request.resume();
          })
          .catch(fail);
      });
      context.request.on('end', () => void applied.then(() => failed || resolve({})));
      context.request.on('error', reject);
    });
  },
};

export const PROCESS_METHODS: Readonly<Record<string, Method>> = {
  Start: start,
  Connect: connect,
  List: list,
  SendInput: sendInput,
  StreamInput: streamInput,
  SendSignal: sendSignal,
  CloseStdin: closeStdin,
  Update: update,
};
