/**
 * The client half of SOCKS5 (RFC 1928) with username/password authentication (RFC 1929), run on
 * a socket already connected to the operator's proxy. The proxy is treated as hostile: every
 * reply is read by exact size (never more than a reply can hold), checked field by field, and
 * must arrive before one deadline. Messages name the proxy by its address, never a credential.
 */
import type net from 'node:net';
import type { IPAddress } from '../policy/index.js';

const VERSION = 5;
const AUTH_VERSION = 1;
const NO_AUTH = 0x00;
const USER_PASS = 0x02;
const NO_ACCEPTABLE = 0xff;
const CMD_CONNECT = 1;
const ATYP_IPV4 = 1;
const ATYP_DOMAIN = 3;
const ATYP_IPV6 = 4;
/** RFC 1929 and RFC 1928 carry each of these in one length byte. */
const MAX_FIELD_BYTES = 255;

/** RFC 1928 section 6. */
const REPLIES: Readonly<Record<number, string>> = {
  1: 'general SOCKS server failure',
  2: 'connection not allowed by ruleset',
  3: 'network unreachable',
  4: 'host unreachable',
  5: 'connection refused',
  6: 'TTL expired',
  7: 'command not supported',
  8: 'address type not supported',
};

/** What to ask the proxy for, and how to log in. */
export interface SocksConnect {
  /** A host name is sent as a name (the proxy resolves it), an address as an address. */
  readonly destination: { readonly host?: string; readonly ip?: IPAddress; readonly port: number };
  readonly username?: string;
  readonly password?: string;
  /** For the whole exchange, greeting to the last byte of the reply. */
  readonly timeoutMs: number;
}

/** A failed handshake; the message says what the proxy did (or did not) do. */
export class SocksError extends Error {
  override readonly name = 'SocksError';
}

/**
 * Asks the proxy on `socket` to connect to the destination. Resolves once it has; the socket is
 * then paused, holding any bytes the proxy sent after its reply (the destination's first
 * bytes), for whoever joins it to the client. Rejects with a SocksError (the caller destroys
 * the socket).
 */
export async function socksConnect(socket: net.Socket, request: SocksConnect): Promise<void> {
  const exchange = new Exchange(socket, request.timeoutMs);
  try {
    await handshake(exchange, request);
    // A reply that came whole but late is still late.
    if (exchange.expired) throw exchange.expired;
  } finally {
    exchange.done();
  }
}

async function handshake(exchange: Exchange, request: SocksConnect): Promise<void> {
  const login = request.username !== undefined;
  exchange.write(Buffer.from(login ? [VERSION, 2, NO_AUTH, USER_PASS] : [VERSION, 1, NO_AUTH]));
  const [version, method] = await exchange.read(2, 'its method selection');
  if (version !== VERSION)
    throw new SocksError(`it does not speak SOCKS5 (version byte ${version} in its first reply)`);
  if (method === NO_ACCEPTABLE)
    throw new SocksError(
      login
        ? 'it accepts neither no authentication nor a username and password'
        : 'it requires authentication and no username was configured',
    );
  if (method === USER_PASS) {
    if (!login)
      throw new SocksError('it chose username/password authentication, which was not offered');
    const user = Buffer.from(request.username!);
    const pass = Buffer.from(request.password ?? '');
    exchange.write(
      Buffer.concat([
        Buffer.from([AUTH_VERSION, user.length]),
        user,
        Buffer.from([pass.length]),
        pass,
      ]),
    );
    const [authVersion, status] = await exchange.read(2, 'its authentication reply');
    if (authVersion !== AUTH_VERSION)
      throw new SocksError(`its authentication reply has version ${authVersion}, not 1`);
    if (status !== 0) throw new SocksError('it rejected the username and password');
  } else if (method !== NO_AUTH) {
    throw new SocksError(`it chose authentication method ${method}, which was not offered`);
  }
  exchange.write(connectRequest(request.destination));
  const head = await exchange.read(4, 'its reply to CONNECT');
  if (head[0] !== VERSION)
    throw new SocksError(`its reply to CONNECT has version ${head[0]}, not 5`);
  if (head[1] !== 0)
    throw new SocksError(
      `it could not connect: ${REPLIES[head[1]!] ?? `reply code ${head[1]}`} (SOCKS reply ${head[1]})`,
    );
  if (head[2] !== 0)
    throw new SocksError(`its reply to CONNECT has reserved byte ${head[2]}, not 0`);
  // The bound address is read and dropped: it says where the proxy is, not where we are going.
  switch (head[3]) {
    case ATYP_IPV4:
      await exchange.read(4 + 2, 'the bound address of its reply');
      return;
    case ATYP_IPV6:
      await exchange.read(16 + 2, 'the bound address of its reply');
      return;
    case ATYP_DOMAIN: {
      const [length] = await exchange.read(1, 'the bound address of its reply');
      await exchange.read(length! + 2, 'the bound address of its reply');
      return;
    }
    default:
      throw new SocksError(`its reply to CONNECT has unknown address type ${head[3]}`);
  }
}

/** The CONNECT request: a name as ATYP domain, an address as ATYP IPv4 or IPv6. */
function connectRequest(destination: SocksConnect['destination']): Buffer {
  const port = Buffer.alloc(2);
  port.writeUInt16BE(destination.port);
  let address: Buffer;
  if (destination.host !== undefined) {
    const name = Buffer.from(destination.host, 'ascii');
    if (name.length === 0 || name.length > MAX_FIELD_BYTES)
      throw new SocksError(`the name ${destination.host} does not fit a SOCKS5 request`);
    address = Buffer.concat([Buffer.from([ATYP_DOMAIN, name.length]), name]);
  } else {
    const ip = destination.ip!;
    address = Buffer.alloc(1 + 4 * ip.words.length);
    address[0] = ip.version === 4 ? ATYP_IPV4 : ATYP_IPV6;
    ip.words.forEach((word, index) => address.writeUInt32BE(word >>> 0, 1 + 4 * index));
  }
  return Buffer.concat([Buffer.from([VERSION, CMD_CONNECT, 0]), address, port]);
}

/**
 * Reads a socket by exact sizes, in paused mode: what is not asked for stays in the socket (a
 * proxy sending more than its reply holds cannot make Moat buffer it), and fails on close,
 * error or the deadline.
 */
class Exchange {
  private failure: SocksError | undefined;
  expired: SocksError | undefined;
  private wake: (() => void) | undefined;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly socket: net.Socket,
    timeoutMs: number,
  ) {
    this.timer = setTimeout(() => {
      this.expired = new SocksError(`it did not finish the handshake within ${timeoutMs} ms`);
      this.fail(this.expired);
    }, timeoutMs);
    socket.on('readable', this.poke);
    socket.on('end', this.ended);
    socket.on('close', this.ended);
    socket.on('error', this.errored);
  }

  private readonly poke = () => this.wake?.();
  private readonly ended = () =>
    this.fail(new SocksError('it closed the connection mid-handshake'));
  private readonly errored = (error: NodeJS.ErrnoException) =>
    this.fail(
      new SocksError(`the connection failed mid-handshake (${error.code ?? error.message})`),
    );

  private fail(error: SocksError): void {
    this.failure ??= error;
    this.poke();
  }

  write(bytes: Buffer): void {
    if (this.failure === undefined) this.socket.write(bytes);
  }

  /** Exactly `size` bytes (at most 257: one length byte's worth plus a port), or a SocksError. */
  read(size: number, what: string): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const attempt = () => {
        const chunk = this.socket.read(size) as Buffer | null;
        if (chunk === null) {
          if (this.failure === undefined) return;
          this.wake = undefined;
          return reject(this.failure);
        }
        this.wake = undefined;
        // At the end of the stream read() hands over what is left, however short.
        if (chunk.length < size)
          return reject(new SocksError(`${what} was cut short (${chunk.length} of ${size} bytes)`));
        resolve(chunk);
      };
      this.wake = attempt;
      attempt();
    });
  }

  /** Stops watching; the socket stays paused with whatever followed the reply. */
  done(): void {
    clearTimeout(this.timer);
    this.socket.off('readable', this.poke);
    this.socket.off('end', this.ended);
    this.socket.off('close', this.ended);
    this.socket.off('error', this.errored);
    this.socket.pause();
  }
}
