import net from 'node:net';

/** Whether this machine has IPv6 loopback (some containers do not). */
export async function hasIpv6Loopback(): Promise<boolean> {
  const server = net.createServer();
  return new Promise((resolve) => {
    server.once('error', () => resolve(false));
    server.listen(0, '::1', () => server.close(() => resolve(true)));
  });
}
