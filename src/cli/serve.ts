import path from 'node:path';
import { pino } from 'pino';
import { type MoatConfig, SECRET_MASK, showConfig } from '../config.js';
import { type CliIO, configFlags, configFrom, EXIT, parseOptions, UsageError } from './io.js';
import {
  unknownEnvironment,
  unknownEnvironmentMessage,
  warnUnknownEnvironment,
} from './unknown-environment.js';
import type { RunningMoat } from '../app/index.js';
import { formatHostPort, type HostPort } from '../net/index.js';
import { VERSION } from '../process/index.js';

/** Every setting is a flag of serve. */
const SERVE_CONFIG = configFlags();

export const SERVE_HELP = `Usage: moat serve [options]

Runs Moat: the platform API (sandboxes, network rules, snapshots, /health, /ready, /metrics),
the sandbox API and ingress, the DNS interceptor (UDP and TCP) that every sandbox resolves
through, the explicit egress proxy (CONNECT and absolute-form HTTP) and the transparent
listener (SNI/Host). State lives in the data folder (--data-dir); on first start without
MOAT_API_KEYS an API key is generated into <data-dir>/api-key (mode 0600): start-up says where,
and the key itself is never printed or logged.

Standard output carries only the JSON log (one object per line; "moat started" holds every
start-up fact). Standard error carries the same facts for people: every listener, the data
folder, the enforcement mode and how processes are confined, and why Moat cannot start.

Settings come from the defaults, then the --config file, then MOAT_* environment variables,
then flags, each overriding the one before; a MOAT_* variable that is no setting is warned
about. A list flag may be repeated to add entries. Every setting is described in
docs/configuration.md.

Stops cleanly on SIGTERM or SIGINT: stops accepting, lets open tunnels drain for up to 5 s,
stops the sandboxes, closes the store, logs "moat stopped" and exits 0. A second signal
during the stop ends Moat at once.

Options:
  --print-config
      print the effective configuration (defaults < --config < MOAT_* < flags) as
      JSON, one key per setting, secrets (API keys) masked as "${SECRET_MASK}", and exit
      without starting anything
${SERVE_CONFIG.help}
  -h, --help
      this help`;

/** Moat must not forward its own queries to itself (a loop no timeout would break early). */
function checkUpstreams(config: MoatConfig): void {
  const own = formatHostPort(config.dnsListen);
  if (config.dnsUpstream.some((s) => formatHostPort(s) === own)) {
    throw new UsageError(
      `the DNS upstream list includes Moat's own DNS listener ${own}; name other resolvers with --dns-upstream`,
    );
  }
}

const optional = (at: HostPort | undefined) => (at ? formatHostPort(at) : 'off');

/**
 * What start-up tells the operator, once for the log and once for people. The API key is not
 * among them: only the file that holds it.
 */
function startupFacts(config: MoatConfig, moat: RunningMoat) {
  const { dns, proxy, transparent, api, sandbox, metrics, gateway } = moat.listening;
  return {
    api: formatHostPort(api),
    sandbox: formatHostPort(sandbox),
    dns: formatHostPort(dns),
    proxy: formatHostPort(proxy),
    /** How DNS over UDP and the explicit proxy carry bytes (the native addons, or Node's own). */
    dnsUdpIo: moat.dns.udpIo[0] ?? 'dgram',
    proxyIo: moat.proxy.io,
    transparent: optional(transparent),
    /** Where namespaced sandboxes reach Moat's DNS, proxy and transparent listener. */
    gateway: gateway && {
      dns: formatHostPort(gateway.dns),
      proxy: formatHostPort(gateway.proxy),
      transparent: formatHostPort(gateway.transparent),
    },
    metrics: optional(metrics),
    dataDir: path.resolve(config.dataDir),
    /** The store (a Redis URL with its password masked), and this node's name in a platform. */
    store: moat.store.location,
    node: moat.cluster?.self ?? null,
    enforcement: moat.runtime.enforcement,
    enforcementReason: moat.runtime.enforcementReason,
    confined: moat.runtime.confined,
    confinement: moat.runtime.confinementReason,
    apiKeys: moat.apiKeys.source,
    apiKeyGenerated: moat.apiKeys.generated,
    upstreams: config.dnsUpstream.map(formatHostPort),
    /** Workload identity's issuer (the `iss` of its tokens), or off. */
    identityIssuer: config.identityIssuer ?? 'off',
    internalDeny: config.internalDeny.length,
    version: VERSION,
  };
}

function startupLines(facts: ReturnType<typeof startupFacts>) {
  const keyLine = facts.apiKeyGenerated
    ? `moat: API key          generated into ${facts.apiKeys} (read it there: cat ${facts.apiKeys})`
    : `moat: API key          from ${facts.apiKeys}`;
  const metrics =
    facts.metrics === 'off' ? 'off' : `http://${facts.metrics}/metrics (GET only, no API key)`;
  const forSandboxes = (listener: 'dns' | 'proxy' | 'transparent') =>
    facts.gateway ? `, for sandboxes ${facts.gateway[listener]}` : '';
  return [
    `moat: platform API     http://${facts.api} (X-API-Key; /health, /ready, /metrics, /openapi.json)`,
    keyLine,
    `moat: sandbox API      http://${facts.sandbox} (E2B_SANDBOX_URL; {port}-{sandboxID}.<domain> or E2b-Sandbox-Id/-Port)`,
    `moat: data folder      ${facts.dataDir}`,
    `moat: store            ${facts.store}${facts.node ? ` (node ${facts.node})` : ''}`,
    `moat: enforcement      ${facts.enforcement} (${facts.enforcementReason})`,
    `moat: processes        ${facts.confinement}`,
    `moat: DNS interceptor  ${facts.dns}${forSandboxes('dns')} (udp ${facts.dnsUdpIo === 'batched' ? 'batched' : 'via node:dgram'}, tcp), upstream ${facts.upstreams.join(', ')}`,
    `moat: egress proxy     ${facts.proxy}${forSandboxes('proxy')} (CONNECT, absolute-form HTTP; ${facts.proxyIo.io === 'native' ? 'native relay' : `Node sockets: ${facts.proxyIo.why}`})`,
    `moat: transparent      ${facts.transparent}${forSandboxes('transparent')} (TLS SNI / HTTP Host)`,
    `moat: identity         ${facts.identityIssuer === 'off' ? 'off (iam.tokens refused; --identity-issuer enables it)' : `issuer ${facts.identityIssuer} (/.well-known/openid-configuration and /.well-known/jwks.json on the platform API, no key)`}`,
    `moat: metrics          ${metrics}`,
    '',
  ].join('\n');
}

/** Resolves with the first SIGTERM or SIGINT; a second one gets the default (immediate) end. */
function firstSignal(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    const signals: NodeJS.Signals[] = ['SIGTERM', 'SIGINT'];
    const handlers = signals.map((signal) => {
      const handler = () => {
        signals.forEach((s, i) => process.off(s, handlers[i]!));
        resolve(signal);
      };
      process.on(signal, handler);
      return handler;
    });
  });
}

export async function serve(args: string[], io: CliIO): Promise<number> {
  const { values } = parseOptions({
    args,
    options: {
      help: { type: 'boolean', short: 'h' },
      'print-config': { type: 'boolean' },
      ...SERVE_CONFIG.options,
    },
  });
  if (values.help) {
    io.stdout.write(`${SERVE_HELP}\n`);
    return EXIT.ok;
  }
  warnUnknownEnvironment(io);
  const config = configFrom(values, io);
  checkUpstreams(config);
  if (values['print-config']) {
    io.stdout.write(`${JSON.stringify(showConfig(config), null, 2)}\n`);
    return EXIT.ok;
  }
  const logger = pino({ level: config.logLevel, base: { service: 'moat' } });
  for (const unknown of unknownEnvironment(io.env))
    logger.warn(unknown, unknownEnvironmentMessage(unknown));
  // Listening from the start: a signal during start-up stops Moat once it is up.
  const stopping = firstSignal();
  let moat: RunningMoat;
  try {
    const { startMoat } = await import('../app/index.js');
    moat = await startMoat(config, logger);
  } catch (error) {
    // A port in use, a damaged store, a data folder held by another Moat: say which, briefly.
    io.stderr.write(`moat serve: cannot start: ${(error as Error).message}\n`);
    return EXIT.failed;
  }
  const facts = startupFacts(config, moat);
  logger.info(facts, 'moat started');
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
  io.stderr.write(startupLines(facts));
  const signal = await stopping;
  const began = Date.now();
  logger.info({ signal }, 'moat stopping');
  try {
    await moat.stop(5000);
  } catch (error) {
    logger.error({ signal, err: error }, 'moat stop failed');
    return EXIT.failed;
  }
  logger.info({ signal, ms: Date.now() - began }, 'moat stopped');
  return EXIT.ok;
}
