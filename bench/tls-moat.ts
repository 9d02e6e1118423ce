/**
 * Moat for `npm run bench:tls`, run as its own process (forked by bench/tls.ts): the egress
 * proxy with secretless egress on, from startInterceptingProxy (lib/intercepting-proxy.ts: the
 * parts `moat serve` builds it from, without DNS, API and sandboxes), and Moat's own CA
 * (MoatCa, opened on the benchmark's proxy CA as with --ca-cert/--ca-key: the leaves are minted
 * and cached by the code serve runs). One sandbox, identified by Proxy-Authorization Basic,
 * may reach every benchmark name; names below `bump.` have a header rule (`Authorization:
 * Bearer ${secret token}`, so they are intercepted), names below `tunnel.` none (opaque
 * tunnels). CONNECT arrives as serve's default --proxy-io auto has it (the native relay where
 * it is built; intercepted flows are handed to Node). Every name resolves to the origin's address (no DNS is asked).
 *
 * argv: <CA certificate file> <CA key file> <origin CA file> <origin port> <rounds>
 * <mint names per round> <lifetime seconds> <request rules: on|off>. Tells the parent `{ ready: { port, io } }`; answers
 * `leaves` (minted, cache hits, held); exits when the parent disconnects, on SIGTERM/SIGINT,
 * or after the lifetime.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MoatCa } from '../src/intercept-ca/index.js';
import { type DestinationRules, parseNetworkConfig } from '../src/policy/index.js';
import { nativeTcpUnavailable } from '../src/proxy/native-tcp.js';
import { startInterceptingProxy } from './lib/intercepting-proxy.js';
import {
  BENCH_SANDBOX_ID,
  BENCH_SECRET,
  BUMP_NAME,
  BUMP_SUFFIX,
  INJECTED_HEADER,
  INJECTED_PREFIX,
  INJECTED_SECRET,
  mintNames,
  ORIGIN_IP,
  TUNNEL_NAME,
  TUNNEL_SUFFIX,
} from './tls-common.js';
import { endWithParent } from './lib/procs.js';

const [
  caCert = '',
  caKey = '',
  originCa = '',
  portText = '',
  roundsText = '',
  perRoundText = '',
  lifetime = '900',
  requestRules = 'off',
] = process.argv.slice(2);

const HEADERS = { [INJECTED_HEADER]: `${INJECTED_PREFIX}\${e2b.secrets.token}` };

/**
 * The intercepted names' rule as a configuration writes it: headers on every request, or (with
 * --request-rules) on GETs and HEADs of any path, every other request denied.
 */
function bumpRule(): DestinationRules {
  const rules =
    requestRules === 'on'
      ? [
          {
            match: { methods: ['GET', 'HEAD'], paths: ['/*'] },
            action: 'allow',
            transform: { headers: HEADERS },
          },
          { action: 'deny' },
        ]
      : [{ transform: { headers: HEADERS } }];
  const parsed = parseNetworkConfig({ rules: { [`*${BUMP_SUFFIX}`]: rules } });
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
  return parsed.value.transforms[0]!;
}

const RULE = bumpRule();

async function main(): Promise<void> {
  const dataDir = mkdtempSync(join(tmpdir(), 'moat-bench-tls-ca-'));
  const opened = await MoatCa.open({ dataDir, certFile: caCert, keyFile: caKey, owner: 'bench' });
  if (!opened.ok) throw new Error(opened.error);
  const ca = opened.value;
  const names = new Map<string, string[]>();
  for (const name of [BUMP_NAME, TUNNEL_NAME]) names.set(name, [ORIGIN_IP]);
  // Round 0 is the warm-up's.
  for (let round = 0; round <= Number(roundsText); round++)
    for (const name of mintNames(round, Number(perRoundText))) names.set(name, [ORIGIN_IP]);
  const port = Number(portText);
  const moat = await startInterceptingProxy({
    names,
    upstreamCa: readFileSync(originCa, 'utf8'),
    transparentPorts: { tls: port, http: port },
    maxTunnelsPerSandbox: 100_000,
    // As serve's default --proxy-io: CONNECT arrives on the native relay where it is built.
    tcpIo: 'auto',
    injection: {
      transformFor: (sandboxID, name) =>
        sandboxID === BENCH_SANDBOX_ID && name.endsWith(BUMP_SUFFIX) ? RULE : undefined,
      // As src/app/start.ts wires it.
      leafContext: (name) => ca.secureContextFor(name),
      secretValue: async (name) => (name === 'token' ? INJECTED_SECRET : undefined),
    },
  });
  moat.register(BENCH_SANDBOX_ID, BENCH_SECRET, '127.0.0.1', {
    allowOut: [`*${BUMP_SUFFIX}`, `*${TUNNEL_SUFFIX}`],
    denyOut: ['0.0.0.0/0'],
  });

  endWithParent(Number(lifetime), async () => {
    await moat.close();
    rmSync(dataDir, { recursive: true, force: true });
  });
  process.on('message', (message) => {
    if (message === 'leaves') process.send?.({ leaves: ca.leafStats });
  });
  const why = nativeTcpUnavailable();
  const io = why === undefined ? 'the native relay' : `Node's sockets (${why})`;
  process.send?.({ ready: { port: moat.proxy.port, io } });
}

main().catch((error: unknown) => {
  process.stderr.write(`bench tls moat: ${(error as Error).stack ?? String(error)}\n`);
  process.exit(1);
});
