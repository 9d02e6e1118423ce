import type net from 'node:net';

/** Starts a server on an address; resolves to the bound port (useful when 0 was asked for). */
export function listenOn(
  server: net.Server,
  address: { host: string; port: number },
): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(address.port, address.host, () => {
      server.off('error', reject);
      resolve((server.address() as net.AddressInfo).port);
    });
  });
}
