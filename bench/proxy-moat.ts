/**
 * Moat for `npm run bench:proxy`, run as its own process (forked by bench/proxy.ts). It is
 * `moat serve` minus the CLI: configuration from the same loadConfig (every default is
 * serve's, pino at 'warn'), then startMoat, the composition root serve uses (DNS interceptor,
 * egress proxy, metrics). Differences, all needed to benchmark on loopback:
 * - the hard internal deny list is narrowed to 10.0.0.0/8, so the loopback origin is reachable;
 * - the DNS upstream is a fake DNS server in this process (127.0.0.1, UDP and TCP) that maps
 *   origin.bench.test to the origin's address (TTL 1 h; AAAA gets NODATA with an SOA, so the
 *   negative answer is cached as a real resolver's would be);
 * - the transparent listener is off, and --proxy-max-tunnels is 100,000 so the cap never refuses;
 * - one sandbox is registered with a default-allow policy and a known egress secret (this
 *   version has no API to register one); clients send Proxy-Authorization Basic.
 *
 * argv: <origin ip> <lifetime seconds> [proxy io: auto|node]. Tells the parent
 * `{ ready: { port, io } }` (the proxy's port and how it carries connections) over IPC;
 * stops cleanly on SIGTERM/SIGINT or when the parent disconnects (so `node --cpu-prof` can
 * write its profile), and after the lifetime at most.
 */
import dgram from 'node:dgram';
import net from 'node:net';
import dnsPacket from 'dns-packet';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { pino } from 'pino';
import { startMoat } from '../src/app/index.js';
import { loadConfig } from '../src/config.js';
import { compilePolicy, parseNetworkConfig } from '../src/policy/index.js';
import { readBufferBytes } from '../src/proxy/splice.js';
import { BENCH_SANDBOX_ID, BENCH_SECRET, ORIGIN_NAME } from './proxy-common.js';
import { scratchMoatFlags } from './lib/scratch.js';
import { endWithParent } from './lib/procs.js';

const TTL = 3600;

/** The fake upstream's answer to one query (undefined: not a query). */
function answer(message: Buffer, originIp: string): Buffer | undefined {
  let query: dnsPacket.Packet;
  try {
    query = dnsPacket.decode(message);
  } catch {
    return undefined;
  }
  const question = query.questions?.[0];
  if (query.type !== 'query' || question === undefined) return undefined;
  const known = question.name.toLowerCase() === ORIGIN_NAME;
  const answers: dnsPacket.Answer[] =
    known && question.type === 'A'
      ? [{ type: 'A', name: question.name, ttl: TTL, data: originIp }]
      : [];
  const soa: dnsPacket.Answer = {
    type: 'SOA',
    name: 'bench.test',
    ttl: TTL,
    data: {
      mname: 'ns.bench.test',
      rname: 'admin.bench.test',
      serial: 1,
      refresh: TTL,
      retry: TTL,
      expire: TTL,
      minimum: TTL,
    },
  };
  return dnsPacket.encode({
    type: 'response',
    id: query.id,
    flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE | (known ? 0 : 3),
    questions: [question],
    answers,
    authorities: answers.length === 0 ? [soa] : [],
  });
}

/** The fake upstream resolver, UDP and TCP on one port of 127.0.0.1. */
async function startFakeDns(originIp: string): Promise<number> {
  const tcp = net.createServer((socket) => {
    let buffered = Buffer.alloc(0);
    socket.on('error', () => socket.destroy());
    socket.on('data', (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      while (buffered.length >= 2 && buffered.length >= 2 + buffered.readUInt16BE(0)) {
        const message = buffered.subarray(2, 2 + buffered.readUInt16BE(0));
        buffered = buffered.subarray(2 + message.length);
        const reply = answer(message, originIp);
        if (reply)
          socket.write(
            Buffer.concat([Buffer.from([reply.length >> 8, reply.length & 255]), reply]),
          );
      }
    });
  });
  // A free UDP port may be taken for TCP: try a few.
  for (let attempt = 0; attempt < 20; attempt++) {
    const udp = dgram.createSocket('udp4');
    udp.on('message', (message, from) => {
      const reply = answer(message, originIp);
      if (reply) udp.send(reply, from.port, from.address);
    });
    await new Promise<void>((resolve) => udp.bind(0, '127.0.0.1', resolve));
    const port = udp.address().port;
    const listening = await new Promise<boolean>((resolve) => {
      tcp.once('error', () => resolve(false));
      tcp.listen(port, '127.0.0.1', () => resolve(true));
    });
    if (listening) return port;
    udp.close();
  }
  throw new Error('no port free for both UDP and TCP on 127.0.0.1');
}

async function main(): Promise<void> {
  const [originIp, lifetime = '900', proxyIo = 'auto', originPorts = 'none'] =
    process.argv.slice(2);
  if (originIp === undefined)
    throw new Error('usage: proxy-moat.js <origin ip> [seconds] [proxy io] [origin ports]');
  const dnsPort = await startFakeDns(originIp);
  const scratch = scratchMoatFlags();
  const loaded = loadConfig({
    flags: {
      'internal-deny': '10.0.0.0/8',
      // The origin is on this host's loopback: only its ports are opened, as an operator would.
      'allow-host-ports': originPorts,
      'dns-listen': '127.0.0.1:0',
      'dns-upstream': `127.0.0.1:${dnsPort}`,
      'proxy-listen': '127.0.0.1:0',
      'transparent-listen': 'off',
      'proxy-max-tunnels': '100000',
      'log-level': 'warn',
      'proxy-io': proxyIo,
      ...scratch.flags,
    },
    env: {},
  });
  if (!loaded.ok) throw new Error(loaded.error);
  const config = loaded.value;
  // As in src/cli/serve.ts.
  const logger = pino({ level: config.logLevel, base: { service: 'moat' } });
  const moat = await startMoat(config, logger);

  const rules = parseNetworkConfig({});
  if (!rules.ok) throw new Error(JSON.stringify(rules.errors));
  moat.table.register(
    BENCH_SANDBOX_ID,
    { egressSecret: BENCH_SECRET },
    compilePolicy(rules.value, moat.internal),
  );

  endWithParent(Number(lifetime), async () => {
    await moat.stop(0);
    scratch.remove();
  });
  // Event-loop delay (how late a timer fires): blocking work and GC pauses show up here. Every
  // 20 ms, not 1: a 1 ms timer would wake Moat 1,000 times a second, a load squid never carries.
  // The histogram holds whole intervals between firings; lateness is what exceeds 20 ms.
  const RESOLUTION_MS = 20;
  const loop = monitorEventLoopDelay({ resolution: RESOLUTION_MS });
  loop.enable();
  process.on('message', (message) => {
    if (message === 'loop-reset') {
      loop.reset();
      process.send?.({ loopReset: true });
      return;
    }
    if (message === 'loop') {
      const ms = (ns: number) => Math.max(0, ns / 1e6 - RESOLUTION_MS);
      process.send?.({
        loop: { p50: ms(loop.percentile(50)), p99: ms(loop.percentile(99)), max: ms(loop.max) },
      });
      return;
    }
    if (message !== 'metrics') return;
    void moat.metrics.registry.getMetricsAsJSON().then((json) => {
      const counts: Record<string, number> = {};
      for (const metric of json) {
        if (!/^moat_proxy_(connections|denials)_total$/.test(metric.name)) continue;
        for (const value of metric.values) {
          const labels = Object.values(value.labels).join('/');
          counts[`${metric.name.replace(/^moat_proxy_|_total$/g, '')}:${labels}`] = value.value;
        }
      }
      const memory = process.memoryUsage();
      process.send?.({ metrics: counts, memory, readBuffers: readBufferBytes() });
    });
  });
  process.send?.({ ready: { port: moat.listening.proxy.port, io: moat.proxy.io.io } });
}

main().catch((error: unknown) => {
  process.stderr.write(`bench moat: ${(error as Error).stack ?? String(error)}\n`);
  process.exit(1);
});
