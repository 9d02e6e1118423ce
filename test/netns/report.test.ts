/**
 * Report mode as a sandbox meets it (`network.mode: "report"`, here the operator's default, as
 * an E2B SDK user gets it): what its policy denies goes through the proxy, the transparent
 * listener and directly, each recorded with `wouldDeny` naming the rule; the host, internal
 * addresses and other sandboxes stay closed; a PUT back to `enforce` denies the next connection
 * and ends the open ones. Each sandbox in its own namespace (made by Moat), a "world" namespace
 * serving HTTP on 80 and TCP echo on 7000 on every address.
 */
import { CommandExitError, Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World, WORLD_PORTS } from '../../bench/lib/world.js';
import { until } from '../support/native-relay.js';
import type { ZoneEntry } from '../support/fake-dns.js';
import { namespaceSkipReason } from '../support/netns.js';
import { python } from '../support/sandbox-watch.js';
import { shellOutput, tcpEchoScript } from '../support/sdk-shell.js';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

const skip = namespaceSkipReason('test/netns/report');

const PREFIX = '198.18.43';
const ORIGIN = `${PREFIX}.2`;
const POLICY = { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] };

const run = shellOutput;

const tcpEcho = (host: string) => tcpEchoScript(host);
/** The HTTP status curl got (000: none), through the sandbox's proxy or around it. */
const curl = (url: string, direct = false) =>
  `curl ${direct ? "--noproxy '*' " : ''}-sS -m 5 -o /dev/null -w '%{http_code}' ${url} || true`;

interface Flow {
  kind: string;
  verdict: string;
  list: string;
  destination: { name: string | null; address: string | null; port: number | null };
  wouldDeny?: { list: string; rule: string | null; reason: string };
}

describe.skipIf(skip !== undefined)('report mode in a sandbox', () => {
  let world: World;
  let harness: SdkMoat;
  const zone = new Map<string, ZoneEntry>([
    ['evil.test', { A: [ORIGIN], ttl: 300 }],
    ['allowed.test', { A: [ORIGIN], ttl: 300 }],
  ]);

  beforeAll(async () => {
    world = await World.create('report', PREFIX);
    harness = await startSdkMoat({
      zone,
      flags: {
        enforcement: 'namespace',
        'namespace-pool': '10.216.5.0/24',
        // The world's addresses are benchmarking ones, internal by default.
        'internal-deny': '169.254.0.0/16',
        'default-network-mode': 'report',
      },
    });
  }, 60_000);

  afterAll(async () => {
    await harness?.stop();
    await world?.close();
  });

  const flowsOf = async (sandbox: Sandbox): Promise<Flow[]> =>
    (await harness.api.call('GET', `/flows?sandboxID=${sandbox.sandboxId}&limit=1000`))
      .body as Flow[];

  it('lets through what the policy denies at every door, each recorded with the rule that would have denied it', async () => {
    const sandbox = await harness.sandbox({ network: POLICY });
    const shown = await harness.api.call('GET', `/sandboxes/${sandbox.sandboxId}`);
    expect((shown.body as { network: { mode: string } }).network.mode).toBe('report');
    const seen = world.seen('http').length;
    expect(await run(sandbox, curl('http://evil.test/'))).toBe('200');
    expect(await run(sandbox, curl('http://evil.test/', true))).toBe('200');
    expect(await run(sandbox, tcpEcho(ORIGIN))).toBe('ping');
    expect(world.seen('http').length).toBe(seen + 2);
    // An allowed name is just allowed.
    expect(await run(sandbox, curl('http://allowed.test/'))).toBe('200');
    // The direct flow is recorded from the firewall's log, a moment after it left.
    let flows: Flow[] = [];
    for (const deadline = Date.now() + 10_000; Date.now() < deadline;) {
      flows = await flowsOf(sandbox);
      if (flows.some((flow) => flow.kind === 'direct')) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const reported = (kind: string) =>
      flows.find((flow) => flow.kind === kind && flow.wouldDeny !== undefined);
    for (const kind of ['http', 'transparent', 'direct']) {
      expect(reported(kind), kind).toMatchObject({
        verdict: 'allow',
        list: 'report',
        wouldDeny: { list: 'denyOut', rule: '0.0.0.0/0' },
      });
    }
    const only = (
      await harness.api.call('GET', `/flows?sandboxID=${sandbox.sandboxId}&wouldDeny=true`)
    ).body as Flow[];
    expect(only.length).toBeGreaterThanOrEqual(3);
    expect(only.every((flow) => flow.wouldDeny !== undefined)).toBe(true);
    const allowed = flows.find((flow) => flow.destination.name === 'allowed.test');
    expect(allowed).toMatchObject({ verdict: 'allow', list: 'allowOut' });
    expect(allowed!.wouldDeny).toBeUndefined();
    const metrics = await harness.moat.metrics.registry.getSingleMetricAsString(
      'moat_flows_would_deny_total',
    );
    expect(metrics).toMatch(/moat_flows_would_deny_total\{kind="direct",list="denyOut"\} [1-9]/);
  }, 60_000);

  it('keeps internal addresses, the host and other sandboxes closed', async () => {
    const sandbox = await harness.sandbox({ network: POLICY });
    const neighbour = await harness.sandbox({ network: POLICY });
    const address = async (s: Sandbox) =>
      (
        (await harness.api.call('GET', `/sandboxes/${s.sandboxId}`)).body as {
          egress: { address: string };
        }
      ).egress.address;
    const gateway = (await run(sandbox, "ip route | awk '/default/ {print $3}'")).trim();
    expect(await run(sandbox, curl('http://169.254.169.254/'))).toBe('403');
    expect(await run(sandbox, curl('http://169.254.169.254/', true))).toBe('000');
    expect(await run(sandbox, curl(`http://${gateway}:${harness.moat.listening.api.port}/`))).toBe(
      '403',
    );
    const other = await address(neighbour);
    expect(await run(sandbox, curl(`http://${other}:49983/`))).toBe('403');
    expect(await run(sandbox, tcpEcho(other))).toMatch(/^exit/);
    const denied = (await flowsOf(sandbox)).filter((flow) => flow.verdict === 'deny');
    expect(new Set(denied.map((flow) => flow.list))).toEqual(new Set(['internal', 'host']));
  }, 60_000);

  it('denies the next connection and ends the open ones after a PUT back to enforce', async () => {
    const sandbox = await harness.sandbox({ network: POLICY });
    let printed = '';
    // A tunnel through the proxy to a denied name, open until Moat ends it (the client speaks
    // first, in more than the few bytes a tunnel waits for to tell TLS and HTTP apart).
    const open = await sandbox.commands.run(
      python(
        [
          'import base64, os, socket, urllib.parse',
          "proxy = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])",
          "login = base64.b64encode(f'{proxy.username}:{proxy.password}'.encode())",
          's = socket.create_connection((proxy.hostname, proxy.port), timeout=30)',
          `s.sendall(b'CONNECT evil.test:${WORLD_PORTS.echo} HTTP/1.1\\r\\nProxy-Authorization: Basic ' + login + b'\\r\\n\\r\\n')`,
          "print(s.recv(64).split(b'\\r\\n')[0].decode(), flush=True)",
          "s.sendall(b'ping, said the sandbox\\n'); print(s.recv(64).decode().split(',')[0], flush=True)",
          "print('closed' if s.recv(4) == b'' else 'more', flush=True)",
        ].join('\n'),
      ),
      { background: true, onStdout: (data: string) => void (printed += data) },
    );
    await until(() => printed.includes('ping'), 10_000);
    expect(printed).toMatch(/^HTTP\/1.1 200/);
    const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
      body: { ...POLICY, mode: 'enforce' },
    });
    expect(put.status, put.text).toBe(204);
    const ended = await open.wait().catch((error: CommandExitError) => error);
    expect(ended.stdout).toMatch(/ping\nclosed\n$/);
    expect(await run(sandbox, curl('http://evil.test/'))).toBe('403');
    expect(await run(sandbox, tcpEcho(ORIGIN))).toMatch(/Connection refused/);
    const shown = await harness.api.call('GET', `/sandboxes/${sandbox.sandboxId}`);
    expect((shown.body as { network: { mode: string } }).network.mode).toBe('enforce');
  }, 60_000);
});
