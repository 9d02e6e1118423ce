/**
 * The origin servers of a test "world" network namespace (see world.ts), run inside it:
 * HTTP on 80, HTTPS on 443 (certificate from MOAT_WORLD_KEY / MOAT_WORLD_CERT; on either, the
 * path /headers answers with the request's headers as JSON, for tests of what reached the
 * origin), a TCP echo on
 * 7000, a UDP echo on 7001, a UDP talker on 7002 (a datagram to it is answered by a stream of
 * them), and listeners that only record who reached them on TCP 853 (DNS over
 * TLS) and UDP/TCP 53 (a resolver other than Moat). Every event is one JSON line on stdout;
 * "ready" comes once everything listens.
 */
import dgram from 'node:dgram';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';

export const WORLD_PORTS = {
  http: 80,
  https: 443,
  echo: 7000,
  udpEcho: 7001,
  udpTalk: 7002,
  dot: 853,
  dns: 53,
};
/** The talker's stream: a datagram every 10 ms, 400 in all (4 s). */
const TALK = { everyMs: 10, datagrams: 400 };

const event = (fields: Record<string, unknown>) =>
  process.stdout.write(`${JSON.stringify(fields)}\n`);

function answer(kind: string) {
  return (req: http.IncomingMessage, res: http.ServerResponse) => {
    const host = req.headers.host ?? '';
    const sni = (req.socket as { servername?: string }).servername;
    event({ event: kind, host, sni, from: req.socket.remoteAddress });
    if (req.url === '/headers') {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify(req.headers));
      return;
    }
    res.setHeader('content-type', 'text/plain');
    res.end(`world ${kind} host=${host}${sni ? ` sni=${sni}` : ''}\n`);
  };
}

async function listen(server: net.Server, port: number): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '0.0.0.0', () => resolve());
  });
}

async function main(): Promise<void> {
  const key = Buffer.from(process.env.MOAT_WORLD_KEY ?? '', 'base64');
  const cert = Buffer.from(process.env.MOAT_WORLD_CERT ?? '', 'base64');
  await listen(http.createServer(answer('http')), WORLD_PORTS.http);
  await listen(https.createServer({ key, cert }, answer('https')), WORLD_PORTS.https);
  const echo = net.createServer((socket) => {
    socket.on('error', () => socket.destroy());
    socket.pipe(socket);
  });
  await listen(echo, WORLD_PORTS.echo);
  const recorder = (kind: string) =>
    net.createServer((socket) => {
      event({ event: kind, from: socket.remoteAddress });
      socket.destroy();
    });
  await listen(recorder('dot'), WORLD_PORTS.dot);
  await listen(recorder('dns-tcp'), WORLD_PORTS.dns);
  // One UDP echo per address: a socket on 0.0.0.0 would answer from the link's first address,
  // which the client's connection tracking does not match to its question.
  for (const address of (process.env.MOAT_WORLD_ADDRESSES ?? '').split(',')) {
    const udpEcho = dgram.createSocket('udp4');
    udpEcho.on('message', (message, from) => udpEcho.send(message, from.port, from.address));
    await new Promise<void>((resolve) => udpEcho.bind(WORLD_PORTS.udpEcho, address, resolve));
    // A peer that keeps sending whatever the other side does (a stream, a game, QUIC).
    const talker = dgram.createSocket('udp4');
    talker.on('message', (_message, from) => {
      let sent = 0;
      const timer = setInterval(() => {
        if (++sent > TALK.datagrams) return clearInterval(timer);
        talker.send(`${sent} ${Date.now()}`, from.port, from.address);
      }, TALK.everyMs);
    });
    await new Promise<void>((resolve) => talker.bind(WORLD_PORTS.udpTalk, address, resolve));
  }
  const dns = dgram.createSocket('udp4');
  dns.on('message', (_message, from) => event({ event: 'dns-udp', from: from.address }));
  await new Promise<void>((resolve) => dns.bind(WORLD_PORTS.dns, '0.0.0.0', resolve));
  event({ event: 'ready' });
}

if (process.argv[1]?.endsWith('world-servers.js')) {
  main().catch((error: Error) => {
    event({ event: 'error', message: error.message });
    process.exit(1);
  });
}
