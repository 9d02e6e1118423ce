/**
 * The dialer's last word on the host: a connection that turns out to have reached the host
 * itself (its two ends have one address, which is how the kernel sources a connection to a local
 * address) is closed before a byte and refused as the host, whatever the reading of the host's
 * addresses said before the dial. Here that reading knows no address at all, as one taken before
 * the host got the address it is dialled at; the origin is a real server on loopback.
 */
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { compileHostAddresses, parseIP } from '../../src/policy/index.js';
import { Dialer } from '../../src/proxy/dial.js';
import { httpSocket, type Opener, tunnelSocket } from '../../src/proxy/dial.js';
import { nativeTcp } from '../../src/proxy/native-tcp.js';

const LOOPBACK = parseIP('127.0.0.1');
if (!LOOPBACK.ok) throw new Error(LOOPBACK.error);
const native = nativeTcp('auto');

const closers: Array<() => void> = [];
afterEach(() => {
  for (const close of closers.splice(0)) close();
});

/** A server counting the connections it accepted and the bytes they sent. */
async function origin() {
  const seen = { connections: 0, bytes: 0 };
  const server = net.createServer((socket) => {
    seen.connections++;
    socket.on('data', (chunk) => (seen.bytes += chunk.length));
    socket.on('error', () => socket.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(() => server.close());
  return { port: (server.address() as net.AddressInfo).port, seen };
}

const dialer = (openPorts: number[] = []) =>
  new Dialer({
    resolver: { lookup: () => Promise.reject(new Error('no name is looked up here')) },
    connectTimeoutMs: 2000,
    host: compileHostAddresses([], { openPorts: new Set(openPorts) }),
  });

const openers: Array<[string, Opener<unknown>]> = [
  ['an HTTP socket', httpSocket],
  ['a tunnel socket', tunnelSocket],
  ...(native ? [['the native relay', native.dial] as [string, Opener<unknown>]] : []),
];

describe.each(openers)('a dial through %s', (_, open) => {
  it('that reached the host is refused as the host, and the host got no byte', async () => {
    const { port, seen } = await origin();
    const connected = await dialer().connect({ ip: LOOPBACK.value, port }, [LOOPBACK.value], open);
    expect(connected).toMatchObject({
      ok: false,
      status: 403,
      message: expect.stringMatching(
        new RegExp(
          `^egress to 127\\.0\\.0\\.1:${port} denied by host: the address is the host itself`,
        ),
      ) as unknown,
      decision: { verdict: 'deny', list: 'host', rule: null },
    });
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(seen.bytes).toBe(0);
  });

  it('on a port the operator opened is kept', async () => {
    const { port, seen } = await origin();
    const connected = await dialer([port]).connect(
      { ip: LOOPBACK.value, port },
      [LOOPBACK.value],
      open,
    );
    expect(connected.ok).toBe(true);
    if (connected.ok && connected.socket instanceof net.Socket) connected.socket.destroy();
    else if (connected.ok) native!.close(connected.socket as never);
    await expect.poll(() => seen.connections).toBe(1);
  });
});
