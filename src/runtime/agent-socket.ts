/**
 * Where sandbox roles reach Moat: a Unix socket in a folder only root may enter. A sandbox's
 * supervisor (host root, outside the sandbox) connects once per role, says which spawn it
 * answers with the one-time token Moat gave it, and hands the connection to the sandbox's init.
 * No sandbox process can see the socket: it is in none of their mount namespaces.
 */
import { randomBytes } from 'node:crypto';
import { lstat, mkdir, readdir, rm } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { FrameReader } from './frames.js';
import { RoleConnection, type RoleDeadline } from './role-connection.js';
import { sameSecret } from '../secret-compare/index.js';

const HELLO_TIMEOUT_MS = 10_000;
/** A hello is a few dozen bytes; a connection that sends more without one is dropped. */
const MAX_HELLO_BYTES = 4096;
/** Agent sockets are named `agents-<scope>.sock`, one per data folder (see probeHost). */
const AGENT_SOCKET_NAME = /^agents-[0-9a-f]{16}\.sock$/;
/**
 * How old an agent socket nobody listens on must be to count as a dead Moat's: a Moat starting
 * this moment has bound its socket (the file exists) a little before it listens.
 */
const DEAD_AFTER_MS = 60_000;

interface Pending {
  readonly token: Buffer;
  readonly label: string;
  readonly deadline: RoleDeadline | undefined;
  readonly resolve: (connection: RoleConnection) => void;
  readonly reject: (error: Error) => void;
  readonly timer: NodeJS.Timeout;
}

export class AgentSocket {
  private readonly pending = new Map<string, Pending>();
  private nextSpawn = 1;

  private constructor(
    private readonly server: net.Server,
    readonly path: string,
  ) {
    server.on('connection', (socket) => this.greet(socket));
  }

  /**
   * Listens at `file` (its folder is made, mode 0700; a stale socket there is replaced), and
   * removes the agent sockets of dead Moats beside it.
   */
  static async listen(file: string): Promise<AgentSocket> {
    await mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
    await rm(file, { force: true });
    await removeDeadSockets(path.dirname(file));
    const server = net.createServer();
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(file, () => {
        server.off('error', reject);
        resolve();
      });
    });
    return new AgentSocket(server, file);
  }

  /**
   * A spawn that a supervisor will answer: its number and token (to send to the supervisor),
   * and the connection once it arrives (rejected after a timeout), held to `deadline`.
   */
  expect(
    label: string,
    deadline?: RoleDeadline,
  ): { spawn: string; token: string; connection: Promise<RoleConnection> } {
    const spawn = String(this.nextSpawn++);
    const token = randomBytes(32).toString('hex');
    const connection = new Promise<RoleConnection>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(spawn);
        reject(new Error(`the ${label} did not connect within ${HELLO_TIMEOUT_MS / 1000} s`));
      }, HELLO_TIMEOUT_MS);
      timer.unref();
      this.pending.set(spawn, {
        token: Buffer.from(token),
        label,
        deadline,
        resolve,
        reject,
        timer,
      });
    });
    return { spawn, token, connection };
  }

  /** Gives up on a spawn (its supervisor said it failed). */
  cancel(spawn: string, error: Error): void {
    const pending = this.pending.get(spawn);
    if (pending === undefined) return;
    this.pending.delete(spawn);
    clearTimeout(pending.timer);
    pending.reject(error);
  }

  async close(): Promise<void> {
    for (const spawn of [...this.pending.keys()]) {
      this.cancel(spawn, new Error('Moat is stopping'));
    }
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    await rm(this.path, { force: true });
  }

  private greet(socket: net.Socket): void {
    const reader = new FrameReader();
    let received = 0;
    const drop = () => socket.destroy();
    const timer = setTimeout(drop, HELLO_TIMEOUT_MS);
    socket.on('error', drop);
    const onData = (chunk: Buffer) => {
      received += chunk.length;
      let frames;
      try {
        frames = reader.push(chunk);
      } catch {
        drop();
        return;
      }
      if (frames.length === 0) {
        if (received > MAX_HELLO_BYTES) drop();
        return;
      }
      // A role speaks only when spoken to: anything behind the hello breaks the protocol.
      if (frames.length > 1) {
        drop();
        return;
      }
      socket.off('data', onData);
      clearTimeout(timer);
      const hello = frames[0]!.header;
      const pending = typeof hello.spawn === 'string' ? this.pending.get(hello.spawn) : undefined;
      const token = typeof hello.token === 'string' ? hello.token : '';
      if (pending === undefined || !sameSecret(token, pending.token)) {
        drop();
        return;
      }
      this.pending.delete(hello.spawn as string);
      clearTimeout(pending.timer);
      socket.off('error', drop);
      pending.resolve(new RoleConnection(socket, pending.label, pending.deadline));
    };
    socket.on('data', onData);
  }
}

/**
 * Removes the agent sockets in `dir` that Moats killed before they could close them left behind
 * (each data folder that ever ran has its own name, so a crashed test Moat's would stay
 * forever): those nobody listens on, made more than DEAD_AFTER_MS ago. The folder is root's
 * alone (0700), so no sandbox puts anything there.
 */
async function removeDeadSockets(dir: string): Promise<void> {
  const names = (await readdir(dir).catch(() => [])).filter((name) => AGENT_SOCKET_NAME.test(name));
  await Promise.all(
    names.map(async (name) => {
      const file = path.join(dir, name);
      const stat = await lstat(file).catch(() => undefined);
      if (!stat?.isSocket() || Date.now() - stat.mtimeMs < DEAD_AFTER_MS) return;
      if (await nobodyListens(file)) await rm(file, { force: true });
    }),
  );
}

/** True when connecting to the Unix socket `file` is refused (no process listens there). */
function nobodyListens(file: string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(file);
    socket.setTimeout(1000, () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('error', (error: NodeJS.ErrnoException) => resolve(error.code === 'ECONNREFUSED'));
  });
}
