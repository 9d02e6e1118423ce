import net from 'node:net';
import type { HostPort } from '../net/index.js';

/** Starts a server on an address; resolves to the bound port (useful when 0 was asked for). */
export function listenOn(server: net.Server, address: HostPort): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(address.port, address.host, () => {
      server.off('error', reject);
      resolve((server.address() as net.AddressInfo).port);
    });
  });
}

/**
 * One server reachable on several addresses: the first `listen` binds the server itself, later
 * ones bind plain TCP listeners that hand each connection to it (http.Server documents
 * emitting 'connection' for exactly this).
 */
export class ListenerGroup {
  private readonly extra: net.Server[] = [];
  private bound = false;

  constructor(private readonly server: net.Server) {}

  async listen(address: HostPort): Promise<number> {
    if (!this.bound) {
      this.bound = true;
      return listenOn(this.server, address);
    }
    const relay = net.createServer({ allowHalfOpen: true, noDelay: true }, (socket) =>
      this.server.emit('connection', socket),
    );
    const port = await listenOn(relay, address);
    this.extra.push(relay);
    return port;
  }

  /** Stops the extra listeners (the server itself is closed by its owner). */
  async closeExtra(): Promise<void> {
    await Promise.all(
      this.extra
        .splice(0)
        .map((relay) => new Promise<void>((resolve) => relay.close(() => resolve()))),
    );
  }
}
