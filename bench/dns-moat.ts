/**
 * Moat for `npm run bench:dns`, run as its own process (forked by bench/dns.ts): exactly what
 * `moat serve` runs (startMoat, with the configuration from the same loadConfig, pino at 'warn'
 * and the default process metrics), plus one thing serve cannot do yet: this version has no API
 * to register a sandbox, and the interceptor REFUSES unknown sources, so the harness registers
 * one sandbox at the benchmark client's source address with a default-allow policy.
 *
 * argv: <DNS listen port> <upstream port> <sandbox source address> [lifetime seconds]
 * [--dns-udp-io value, default auto].
 * The egress proxy listens on a free loopback port and the transparent listener is off, so
 * nothing else is disturbed. Tells the parent the DNS port over IPC; stops cleanly on SIGTERM,
 * SIGINT or when the parent disconnects (so that `node --cpu-prof` can write its profile), and
 * after the lifetime at most.
 */
import { pino } from 'pino';
import { startMoat } from '../src/app/index.js';
import { loadConfig } from '../src/config.js';
import { scratchMoatFlags } from './lib/scratch.js';
import { compilePolicy, parseIP, parseNetworkConfig } from '../src/policy/index.js';
import { endWithParent } from './lib/procs.js';

/** So high that the per-sandbox limiter never refuses a benchmark query. */
const BENCH_RATE_LIMIT = 10_000_000;
const BENCH_SANDBOX_ID = 'isandboxbench00000001';

async function main(): Promise<void> {
  const [listenPort = '0', upstreamPort, source, lifetime = '900', udpIo = 'auto'] =
    process.argv.slice(2);
  if (upstreamPort === undefined || source === undefined) {
    throw new Error(
      'usage: dns-moat.js <listen port> <upstream port> <source address> [seconds] [udp io]',
    );
  }
  const scratch = scratchMoatFlags();
  const loaded = loadConfig({
    flags: {
      'dns-listen': `127.0.0.1:${listenPort}`,
      'dns-upstream': `127.0.0.1:${upstreamPort}`,
      'dns-rate-limit': String(BENCH_RATE_LIMIT),
      'dns-udp-io': udpIo,
      'log-level': 'warn',
      'proxy-listen': '127.0.0.1:0',
      'transparent-listen': 'off',
      ...scratch.flags,
    },
    env: {},
  });
  if (!loaded.ok) throw new Error(loaded.error);
  const config = loaded.value;
  const logger = pino({ level: config.logLevel, base: { service: 'moat' } });
  const moat = await startMoat(config, logger);

  // The addition: one sandbox at the benchmark client's address, allowed everywhere.
  const address = parseIP(source);
  if (!address.ok) throw new Error(address.error);
  const rules = parseNetworkConfig({});
  if (!rules.ok) throw new Error(JSON.stringify(rules.errors));
  moat.table.register(
    BENCH_SANDBOX_ID,
    { sourceAddress: address.value, egressSecret: 'bench' },
    compilePolicy(rules.value, moat.internal),
  );

  endWithParent(Number(lifetime), async () => {
    await moat.stop();
    scratch.remove();
  });
  process.on('message', (message) => {
    if (message !== 'metrics') return;
    void moat.metrics.registry.getMetricsAsJSON().then((json) => {
      const counts: Record<string, number> = {};
      for (const metric of json) {
        if (!['moat_dns_queries_total', 'moat_dns_cache_lookups_total'].includes(metric.name))
          continue;
        for (const value of metric.values) {
          const labels = Object.values(value.labels).join('/');
          counts[`${metric.name.replace(/^moat_dns_|_total$/g, '')}:${labels}`] = value.value;
        }
      }
      process.send?.({
        metrics: counts,
        learned: moat.table.get(BENCH_SANDBOX_ID)?.learned.size,
        udpIo: moat.dns.udpIo.join(', '),
      });
    });
  });
  process.send?.({ ready: moat.listening.dns.port });
}

main().catch((error: unknown) => {
  process.stderr.write(`bench moat: ${(error as Error).stack ?? String(error)}\n`);
  process.exit(1);
});
