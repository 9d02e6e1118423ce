/**
 * The Redis the Redis store tests use: the one on 127.0.0.1:6379. CI machines have none
 * running, so the global set-up starts a throwaway one when redis-server is installed.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { type AddressInfo, connect, createServer, type Server, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

export const REDIS_PORT = 6379;

/** Undefined when Redis answers PING on 127.0.0.1, else why not. */
export function redisProblem(timeoutMs = 500): Promise<string | undefined> {
  return new Promise((resolve) => {
    const socket = connect(REDIS_PORT, '127.0.0.1');
    const done = (problem: string | undefined) => {
      socket.destroy();
      resolve(problem);
    };
    socket.setTimeout(timeoutMs, () => done(`no answer within ${timeoutMs} ms`));
    socket.on('error', (error) => done(error.message));
    socket.on('connect', () => socket.write('PING\r\n'));
    socket.once('data', (reply) => {
      const text = reply.toString().trim();
      done(text === '+PONG' ? undefined : `PING answered ${text}`);
    });
  });
}

/** Starts redis-server on 127.0.0.1:6379 unless a Redis answers there already. */
export async function startLocalRedis(): Promise<void> {
  if ((await redisProblem()) === undefined) return;
  const skipped = (why: string) => console.warn(`Redis store tests will be skipped: ${why}`);
  if (spawnSync('redis-server', ['--version']).error) {
    skipped(`no Redis on 127.0.0.1:${REDIS_PORT} and redis-server is not installed`);
    return;
  }
  try {
    mkdirSync('/var/lib/redis', { recursive: true });
    mkdirSync('/var/log/redis', { recursive: true });
    execFileSync(
      'redis-server',
      [
        ...['--daemonize', 'yes', '--bind', '127.0.0.1', '-::1', '--port', String(REDIS_PORT)],
        ...['--save', '', '--appendonly', 'no', '--dir', '/var/lib/redis'],
        ...['--logfile', '/var/log/redis/ci.log'],
      ],
      { stdio: 'inherit' },
    );
  } catch (error) {
    skipped(`could not start redis-server (${(error as Error).message})`);
    return;
  }
  const deadline = Date.now() + 5000;
  while (Date.now() < deadline) {
    if ((await redisProblem()) === undefined) return;
    await sleep(100);
  }
  skipped(
    `redis-server started but 127.0.0.1:${REDIS_PORT} did not answer within 5 s; see /var/log/redis/ci.log`,
  );
}

/**
 * A loopback TCP relay to the local Redis. `cut` drops its connections and resets new ones (as
 * a Redis that went away); `stall` keeps connections open but forwards nothing (as a silent
 * network partition); `restore` passes traffic again. `holdRepliesAfter` lets a connection's
 * command through and withholds every reply from then on (a reply lost on its way).
 */
export class RedisRelay {
  private static readonly all: RedisRelay[] = [];

  static async closeAll(): Promise<void> {
    await Promise.all(RedisRelay.all.splice(0).map((relay) => relay.close()));
  }

  /** Connections accepted so far. */
  accepted = 0;
  private mode: 'pass' | 'cut' | 'stall' = 'pass';
  private readonly sockets = new Set<Socket>();
  private readonly server: Server = createServer((socket) => this.accept(socket));
  /** The command whose sender gets no more replies, and who waits for one to send it. */
  private holding: { command: string; held: () => void } | undefined;
  private readonly heldClients = new Set<Socket>();

  static async start(): Promise<RedisRelay> {
    const relay = new RedisRelay();
    RedisRelay.all.push(relay);
    await new Promise<void>((resolve) => relay.server.listen(0, '127.0.0.1', resolve));
    return relay;
  }

  get url(): string {
    return `redis://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  cut(): void {
    this.mode = 'cut';
    this.dropAll();
  }

  stall(): void {
    this.mode = 'stall';
  }

  restore(): void {
    // Stalled connections have lost bytes mid-reply: they cannot carry on.
    this.dropAll();
    this.mode = 'pass';
  }

  /**
   * The next connection to send `command` (as a RESP bulk string, e.g. `subscribe`) has it
   * passed on but gets no reply from then on; resolves once one has sent it.
   */
  holdRepliesAfter(command: string): Promise<void> {
    return new Promise((held) => {
      this.holding = { command: `\r\n${command.toLowerCase()}\r\n`, held };
    });
  }

  async close(): Promise<void> {
    this.dropAll();
    await new Promise((resolve) => this.server.close(resolve));
  }

  private accept(socket: Socket): void {
    this.accepted += 1;
    if (this.mode === 'cut') {
      socket.resetAndDestroy();
      return;
    }
    this.track(socket);
    if (this.mode === 'stall') return;
    const upstream = this.track(connect(REDIS_PORT, '127.0.0.1'));
    socket.on('data', (data) => {
      if (this.mode !== 'pass') return;
      upstream.write(data);
      const holding = this.holding;
      if (holding && data.toString('latin1').toLowerCase().includes(holding.command)) {
        this.holding = undefined;
        this.heldClients.add(socket);
        holding.held();
      }
    });
    upstream.on('data', (data) => {
      if (this.mode === 'pass' && !this.heldClients.has(socket)) socket.write(data);
    });
    socket.on('close', () => upstream.destroy());
    upstream.on('close', () => socket.destroy());
  }

  private track(socket: Socket): Socket {
    this.sockets.add(socket);
    // Resets are what these tests provoke.
    socket.on('error', () => {});
    socket.on('close', () => {
      this.sockets.delete(socket);
      this.heldClients.delete(socket);
    });
    return socket;
  }

  private dropAll(): void {
    for (const socket of this.sockets) socket.resetAndDestroy();
  }
}
