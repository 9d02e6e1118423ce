/**
 * A small SOCKS5 server (RFC 1928 CONNECT, RFC 1929 username/password) for tests: the operator's
 * proxy that Moat tunnels a sandbox's traffic through. Names are resolved from the test's own
 * table (never a real resolver), and every request is recorded.
 */
import net from 'node:net';

export interface SocksServerOptions {
  /** Where it listens (port 0: any). */
  readonly host: string;
  /** Required credentials; absent: it asks for none. */
  readonly credentials?: { readonly username: string; readonly password: string };
  /** The address its own connections to destinations come from (what the origin sees). */
  readonly localAddress?: string;
  /** The test's names. */
  readonly names?: ReadonlyMap<string, string>;
}

export interface SocksRequestSeen {
  /** 'domain', 'ipv4' or 'ipv6': how the client named the destination. */
  readonly kind: 'domain' | 'ipv4' | 'ipv6';
  readonly host: string;
  readonly port: number;
  /** The username the client logged in with, if any. */
  readonly username?: string;
}

export class SocksServer {
  readonly requests: SocksRequestSeen[] = [];
  /** Logins it refused. */
  readonly refusedLogins: string[] = [];
  /** Connections accepted, handshakes finished or not. */
  accepted = 0;
  private readonly sockets = new Set<net.Socket>();

  private constructor(
    private readonly server: net.Server,
    private readonly options: SocksServerOptions,
  ) {}

  static async start(options: SocksServerOptions): Promise<SocksServer> {
    const server = net.createServer();
    const instance = new SocksServer(server, options);
    server.on('connection', (socket: net.Socket) => instance.accept(socket));
    await new Promise<void>((resolve) => server.listen(0, options.host, resolve));
    return instance;
  }

  get address(): string {
    const { port } = this.server.address() as net.AddressInfo;
    return `${this.options.host}:${port}`;
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private accept(socket: net.Socket): void {
    this.accepted++;
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
    socket.on('error', () => socket.destroy());
    socket.setTimeout(10_000, () => socket.destroy());
    void this.serve(socket).catch(() => socket.destroy());
  }

  private async serve(socket: net.Socket): Promise<void> {
    const { read, stop } = reader(socket);
    const [version, count] = await read(2);
    if (version !== 5) return void socket.destroy();
    const methods = [...(await read(count!))];
    const wanted = this.options.credentials ? 2 : 0;
    if (!methods.includes(wanted)) return void socket.end(Buffer.from([5, 0xff]));
    socket.write(Buffer.from([5, wanted]));
    let username: string | undefined;
    if (wanted === 2) {
      const [, userLength] = await read(2);
      username = (await read(userLength!)).toString();
      const [passLength] = await read(1);
      const password = (await read(passLength!)).toString();
      const { credentials } = this.options;
      if (username !== credentials!.username || password !== credentials!.password) {
        this.refusedLogins.push(username);
        return void socket.end(Buffer.from([1, 1]));
      }
      socket.write(Buffer.from([1, 0]));
    }
    const [, command, , atyp] = await read(4);
    let kind: SocksRequestSeen['kind'];
    let host: string;
    if (atyp === 3) {
      const [length] = await read(1);
      kind = 'domain';
      host = (await read(length!)).toString('ascii');
    } else if (atyp === 1) {
      kind = 'ipv4';
      host = [...(await read(4))].join('.');
    } else if (atyp === 4) {
      kind = 'ipv6';
      const bytes = await read(16);
      host = [0, 2, 4, 6, 8, 10, 12, 14].map((i) => bytes.readUInt16BE(i).toString(16)).join(':');
    } else return void socket.destroy();
    const port = (await read(2)).readUInt16BE(0);
    this.requests.push({ kind, host, port, ...(username === undefined ? {} : { username }) });
    const reply = (code: number) => Buffer.from([5, code, 0, 1, 0, 0, 0, 0, 0, 0]);
    if (command !== 1) return void socket.end(reply(7));
    const address = kind === 'domain' ? this.options.names?.get(host) : host;
    if (address === undefined) return void socket.end(reply(4));
    const upstream = net.connect({
      host: address,
      port,
      ...(this.options.localAddress ? { localAddress: this.options.localAddress } : {}),
    });
    this.sockets.add(upstream);
    upstream.once('close', () => this.sockets.delete(upstream));
    upstream.once('error', () => {
      socket.end(reply(5));
    });
    upstream.once('connect', () => {
      upstream.removeAllListeners('error');
      upstream.on('error', () => socket.destroy());
      socket.on('close', () => upstream.destroy());
      upstream.on('close', () => socket.destroy());
      socket.write(reply(0));
      const early = stop();
      if (early.length > 0) upstream.write(early);
      socket.pipe(upstream);
      upstream.pipe(socket);
    });
  }
}

/** Reads exact sizes from a socket; `stop` hands back what was read past the last one. */
function reader(socket: net.Socket): {
  read: (size: number) => Promise<Buffer>;
  stop: () => Buffer;
} {
  let buffered = Buffer.alloc(0);
  let waiting: (() => void) | undefined;
  let ended = false;
  const onData = (chunk: Buffer) => {
    buffered = Buffer.concat([buffered, chunk]);
    waiting?.();
  };
  const onEnd = () => {
    ended = true;
    waiting?.();
  };
  socket.on('data', onData);
  socket.once('end', onEnd);
  return {
    read: (size) =>
      new Promise((resolve, reject) => {
        const attempt = () => {
          if (buffered.length >= size) {
            waiting = undefined;
            const taken = buffered.subarray(0, size);
            buffered = buffered.subarray(size);
            return resolve(taken);
          }
          if (ended) reject(new Error('client ended'));
        };
        waiting = attempt;
        attempt();
      }),
    stop: () => {
      socket.off('data', onData);
      socket.off('end', onEnd);
      return buffered;
    },
  };
}
