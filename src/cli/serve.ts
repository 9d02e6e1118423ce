import path from 'node:path';
import { parseArgs } from 'node:util';
import { pino } from 'pino';
import { formatHostPort } from '../config.js';
import { type CliIO, CONFIG_HELP, CONFIG_OPTIONS, configFrom, EXIT, UsageError } from './io.js';
import { type RunningMoat, startMoat } from './moat.js';

export const SERVE_HELP = `Usage: moat serve [options]

Runs Moat: the platform API (sandboxes, network rules, snapshots, /metrics), the DNS
interceptor (UDP and TCP) that every sandbox resolves through, the explicit egress proxy
(CONNECT and absolute-form HTTP) and the transparent listener (SNI/Host). State lives in the
data folder (--data-dir); on first start without MOAT_API_KEYS an API key is generated there
and printed once. Stops cleanly on SIGTERM or SIGINT: stops accepting, lets open tunnels drain
for up to 5 s, closes the store.

Options:
${CONFIG_HELP}
  -h, --help
      this help`;

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
  const own = formatHostPort(config.dnsListen);
  if (config.dnsUpstream.some((s) => formatHostPort(s) === own)) {
    throw new UsageError(
      `the DNS upstream list includes Moat's own DNS listener ${own}; name other resolvers with --dns-upstream`,
    );
  }
  const logger = pino({ level: config.logLevel, base: { service: 'moat' } });
  let moat: RunningMoat;
  try {
    moat = await startMoat(config, logger);
  } catch (error) {
    // A port in use, a damaged store, a data folder held by another Moat: say which, briefly.
    io.stderr.write(`moat serve: cannot start: ${(error as Error).message}\n`);
    return EXIT.failed;
  }
  const { dns, proxy, transparent, api, sandbox } = moat.listening;
  const upstreams = config.dnsUpstream.map(formatHostPort).join(', ');
  logger.info(
    {
      dns: formatHostPort(dns),
      proxy: formatHostPort(proxy),
      transparent: transparent ? formatHostPort(transparent) : 'off',
      api: formatHostPort(api),
      sandbox: formatHostPort(sandbox),
      dataDir: config.dataDir,
      enforcement: moat.runtime.enforcement,
      confinement: moat.runtime.confinementReason,
      apiKeys: moat.apiKeys.source,
      upstreams,
      internalDeny: config.internalDeny.length,
    },
    'moat started',
  );
  if (!moat.runtime.confined) {
    logger.warn(
      { reason: moat.runtime.confinementReason },
      'sandbox processes are not confined: they see and can write the host file system',
    );
  }
  if (moat.runtime.enforcement === 'proxy') {
    logger.warn(
      { reason: moat.runtime.enforcementReason },
      'proxy-only enforcement: sandboxes are not in network namespaces',
    );
  }
  const keyLine =
    moat.apiKeys.generated === undefined
      ? `moat: API key          from ${moat.apiKeys.source}`
      : `moat: API key          ${moat.apiKeys.generated} (generated; stored in ${moat.apiKeys.source}, shown only this once)`;
  io.stdout.write(
    [
      `moat: platform API     http://${formatHostPort(api)} (X-API-Key; /health, /metrics, /openapi.json)`,
      keyLine,
      `moat: sandbox API      http://${formatHostPort(sandbox)} (E2B_SANDBOX_URL; {port}-{sandboxID}.<domain> or E2b-Sandbox-Id/-Port)`,
      `moat: data folder      ${path.resolve(config.dataDir)}`,
      `moat: enforcement      ${moat.runtime.enforcement} (${moat.runtime.enforcementReason})`,
      `moat: processes        ${moat.runtime.confinementReason}`,
      `moat: DNS interceptor  ${formatHostPort(dns)} (udp, tcp), upstream ${upstreams}`,
      `moat: egress proxy     ${formatHostPort(proxy)} (CONNECT, absolute-form HTTP)`,
      `moat: transparent      ${transparent ? formatHostPort(transparent) : 'off'} (TLS SNI / HTTP Host)`,
      '',
    ].join('\n'),
  );
  const signal = await new Promise<string>((resolve) => {
    process.once('SIGTERM', () => resolve('SIGTERM'));
    process.once('SIGINT', () => resolve('SIGINT'));
  });
  logger.info({ signal }, 'moat stopping');
  await moat.stop(5000);
  return EXIT.ok;
}
