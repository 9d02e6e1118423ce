import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { AnswerCache, DnsInterceptor, UpstreamClient } from '../dns/index.js';
import { EnforcementTable } from '../enforce/index.js';
import { MoatMetrics } from '../metrics/index.js';
import { type CliIO, CONFIG_HELP, CONFIG_OPTIONS, configFrom, EXIT, UsageError } from './io.js';

export const SERVE_HELP = `Usage: moat serve [options]

Runs Moat: the DNS interceptor (UDP and TCP) that every sandbox resolves through.
Stops cleanly on SIGTERM or SIGINT.

Options:
${CONFIG_HELP}
  -h, --help                this help`;

export async function serve(args: string[], io: CliIO): Promise<number> {
  const { values } = parseArgs({
    args,
    options: { help: { type: 'boolean', short: 'h' }, ...CONFIG_OPTIONS },
  });
  if (values.help) {
    io.stdout.write(`${SERVE_HELP}\n`);
    return EXIT.ok;
  }
  const config = configFrom(values, io);
  const own = `${config.dnsListen.host}:${config.dnsListen.port}`;
  if (config.dnsUpstream.some((s) => `${s.host}:${s.port}` === own)) {
    throw new UsageError(
      `the DNS upstream list includes Moat's own DNS listener ${own}; name other resolvers with --dns-upstream`,
    );
  }
  const logger = pino({ level: config.logLevel, base: { service: 'moat' } });
  const metrics = new MoatMetrics();
  const now = Date.now;
  const table = new EnforcementTable({ now });
  const upstream = new UpstreamClient(config.dnsUpstream, {
    timeoutMs: config.dnsTimeoutMs,
    attemptTimeoutMs: Math.max(100, Math.floor(config.dnsTimeoutMs / 3)),
    onLatency: (seconds) => metrics.dnsUpstreamDuration.observe(seconds),
  });
  const cache = new AnswerCache(upstream, {
    capacity: config.dnsCacheSize,
    maxTtl: config.dnsMaxTtl,
    maxNegativeTtl: Math.min(config.dnsMaxTtl, 3600),
    now,
    onLookup: (hit) => metrics.dnsCacheLookups.inc({ result: hit ? 'hit' : 'miss' }),
  });
  const dns = new DnsInterceptor({
    listen: config.dnsListen,
    table,
    cache,
    metrics,
    logger,
    minLearnTtl: config.dnsMinTtl,
    maxLearnTtl: config.dnsMaxTtl,
    rateLimit: config.dnsRateLimit,
    now,
  });
  const port = await dns.start();
  const upstreams = config.dnsUpstream.map((s) => `${s.host}:${s.port}`).join(', ');
  logger.info(
    {
      dns: `${config.dnsListen.host}:${port}`,
      upstreams,
      internalDeny: config.internalDeny.length,
    },
    'moat started',
  );
  io.stdout.write(
    `moat: DNS interceptor on ${config.dnsListen.host}:${port} (udp, tcp), upstream ${upstreams}\n`,
  );
  const signal = await new Promise<string>((resolve) => {
    process.once('SIGTERM', () => resolve('SIGTERM'));
    process.once('SIGINT', () => resolve('SIGINT'));
  });
  logger.info({ signal }, 'moat stopping');
  await dns.stop();
  return EXIT.ok;
}
