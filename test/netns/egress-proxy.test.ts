/**
 * `network.egressProxy` end to end: sandboxes in their own namespaces (made by a Moat in this
 * process), a "world" namespace of origins, and SOCKS5 servers this test runs on an address of
 * its own on the host's side of the world link, whose connections to origins come from that
 * address. So the origin's peer tells which way a flow went: the SOCKS server's address, or the
 * host's end of the link (direct from Moat or the sandbox's masqueraded traffic).
 */
import { execFileSync } from 'node:child_process';
import { CommandExitError, Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World, WORLD_PORTS } from '../../bench/lib/world.js';
import type { ZoneEntry } from '../support/fake-dns.js';
import { get, GuestBehind, tcpEcho as guestEcho, text } from '../support/guest-behind.js';
import { namespaceSkipReason } from '../support/netns.js';
import { endedByThe204, onlyReading, watching } from '../support/sandbox-watch.js';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';
import { SocksServer } from '../support/socks5-server.js';

const skip = namespaceSkipReason('test/netns/egress-proxy');

const PREFIX = '198.18.24';
const ORIGIN_IP = `${PREFIX}.2`;
/** The SOCKS servers' address: on the host, in the world link's subnet. */
const SOCKS_IP = `${PREFIX}.100`;
const POOL = '10.224.24.0/24';
const PASSWORD = 'proxy-pass-7f3a9c';

interface Ran {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
}

async function run(sandbox: Sandbox, script: string): Promise<Ran> {
  try {
    const result = await sandbox.commands.run(script, { timeoutMs: 20_000 });
    return { exitCode: 0, stdout: result.stdout, stderr: result.stderr };
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error;
    return { exitCode: error.exitCode, stdout: error.stdout, stderr: error.stderr };
  }
}

/** curl through the sandbox's proxy variables (CONNECT for https, absolute-form for http). */
const viaProxyVars = (url: string) => `curl -sS -k --max-time 8 ${url}`;
/** curl ignoring the proxy variables: only the kernel's redirection can take it anywhere. */
const direct = (url: string) => `curl --noproxy '*' -sS -k --max-time 8 ${url}`;
const tcpEcho = (host: string) =>
  `exec 3<>/dev/tcp/${host}/${WORLD_PORTS.echo} && printf ping >&3 && timeout 3 head -c4 <&3`;

describe.skipIf(skip !== undefined)('egressProxy: allowed TCP through a SOCKS5 proxy', () => {
  let world: World;
  let harness: SdkMoat;
  let open: SocksServer;
  let locked: SocksServer;
  const zone = new Map<string, ZoneEntry>([['origin.test', { A: [ORIGIN_IP], ttl: 300 }]]);
  const names = new Map([['origin.test', ORIGIN_IP]]);
  const link = () => `mw-${'socks'}`;

  beforeAll(async () => {
    world = await World.create('socks', PREFIX);
    execFileSync('/usr/sbin/ip', ['addr', 'add', `${SOCKS_IP}/32`, 'dev', link()]);
    const at = { host: SOCKS_IP, localAddress: SOCKS_IP, names };
    open = await SocksServer.start(at);
    locked = await SocksServer.start({
      ...at,
      credentials: { username: 'moat-user', password: PASSWORD },
    });
    harness = await startSdkMoat({
      zone,
      flags: {
        enforcement: 'namespace',
        'namespace-pool': POOL,
        // The world's addresses are special-use ones; only link-local stays internal here.
        'internal-deny': '169.254.0.0/16',
      },
    });
  }, 60_000);

  afterAll(async () => {
    await harness?.stop();
    await open?.close();
    await locked?.close();
    await world?.close();
  });

  /** Origin events since `mark`, as `kind from`. */
  const seenSince = (mark: number) =>
    world.events.slice(mark).map((e) => `${e.event} ${e.from?.replace('::ffff:', '')}`);

  describe('a sandbox whose proxy takes no login', () => {
    let sandbox: Sandbox;
    beforeAll(async () => {
      sandbox = await harness.sandbox({ network: { egressProxy: { address: open.address } } });
    }, 30_000);

    it('tunnels CONNECT and absolute-form HTTP by name; the origin sees the proxy', async () => {
      const mark = world.events.length;
      const requests = open.requests.length;
      const tls = await run(sandbox, viaProxyVars('https://origin.test/'));
      expect(tls.stdout, tls.stderr).toBe('world https host=origin.test sni=origin.test\n');
      const plain = await run(sandbox, viaProxyVars('http://origin.test/'));
      expect(plain.stdout, plain.stderr).toBe('world http host=origin.test\n');
      expect(seenSince(mark)).toEqual([`https ${SOCKS_IP}`, `http ${SOCKS_IP}`]);
      // The name Moat decided on, for the proxy to resolve (ATYP domain).
      expect(open.requests.slice(requests)).toEqual([
        { kind: 'domain', host: 'origin.test', port: 443 },
        { kind: 'domain', host: 'origin.test', port: 80 },
      ]);
    });

    it('tunnels a CONNECT to an address as ATYP IPv4', async () => {
      const requests = open.requests.length;
      const tls = await run(sandbox, viaProxyVars(`https://${ORIGIN_IP}/`));
      expect(tls.stdout, tls.stderr).toMatch(/^world https/);
      expect(open.requests.slice(requests)).toEqual([{ kind: 'ipv4', host: ORIGIN_IP, port: 443 }]);
    });

    it('tunnels web traffic that ignores the proxy variables (kernel redirection)', async () => {
      const mark = world.events.length;
      const tls = await run(sandbox, direct('https://origin.test/'));
      expect(tls.stdout, tls.stderr).toBe('world https host=origin.test sni=origin.test\n');
      const plain = await run(sandbox, direct('http://origin.test/'));
      expect(plain.stdout, plain.stderr).toBe('world http host=origin.test\n');
      expect(seenSince(mark)).toEqual([`https ${SOCKS_IP}`, `http ${SOCKS_IP}`]);
    });

    it('tunnels other direct TCP by the address it was sent to (ATYP IPv4), never around the proxy', async () => {
      const requests = open.requests.length;
      const echoed = await run(sandbox, tcpEcho(ORIGIN_IP));
      expect(echoed.stdout, echoed.stderr).toBe('ping');
      expect(open.requests.slice(requests)).toEqual([
        { kind: 'ipv4', host: ORIGIN_IP, port: WORLD_PORTS.echo },
      ]);
    });

    it('tunnels the web traffic of a guest behind the namespace, and refuses its other TCP', async () => {
      const guest = GuestBehind.create('px', harness.moat.network!.namespaceOf(sandbox.sandboxId)!);
      try {
        const mark = world.events.length;
        const requests = open.requests.length;
        const web = await guest.run(get(text(ORIGIN_IP), 'origin.test'));
        expect(web.out, web.err).toBe('world http host=origin.test\n');
        expect(seenSince(mark)).toEqual([`http ${SOCKS_IP}`]);
        // Moat's listener for other TCP is on the namespace's loopback, out of a forwarded
        // packet's reach: refused at once, never sent around the proxy.
        const echo = await guest.run(guestEcho(text(ORIGIN_IP), WORLD_PORTS.echo));
        expect(echo.out, echo.err).toBe('ConnectionRefusedError\n');
        expect(open.requests.slice(requests)).toEqual([
          { kind: 'domain', host: 'origin.test', port: 80 },
        ]);
        expect(seenSince(mark)).toEqual([`http ${SOCKS_IP}`]);
      } finally {
        guest.close();
      }
    });

    it('closes a connection a sandbox process makes to Moat’s listener inside itself', async () => {
      const requests = open.requests.length;
      // The only listener on the sandbox's loopback is Moat's (the sandbox started none).
      const probe = await run(
        sandbox,
        `port=$(ss -ltnH | awk '$4 ~ /^127\\.0\\.0\\.1:/ {split($4, a, ":"); print a[2]; exit}'); echo "port=$port"; exec 3<>/dev/tcp/127.0.0.1/$port && printf ping >&3 && timeout 3 head -c4 <&3; echo "read=$?"`,
      );
      expect(probe.stdout, probe.stderr).toMatch(/^port=\d+\nread=\d+\n$/);
      expect(probe.stdout).not.toContain('ping');
      expect(open.requests.slice(requests)).toEqual([]);
    });

    it('goes direct again once a PUT leaves the proxy out, and back through it when named', async () => {
      await Sandbox.updateNetwork(sandbox.sandboxId, {});
      const mark = world.events.length;
      expect((await run(sandbox, direct('http://origin.test/'))).stdout).toBe(
        'world http host=origin.test\n',
      );
      expect((await run(sandbox, tcpEcho(ORIGIN_IP))).stdout).toBe('ping');
      expect(seenSince(mark)).toEqual([`http ${PREFIX}.1`]);
      await Sandbox.updateNetwork(sandbox.sandboxId, { egressProxy: { address: open.address } });
      const again = world.events.length;
      expect((await run(sandbox, direct('http://origin.test/'))).stdout).toBe(
        'world http host=origin.test\n',
      );
      expect(seenSince(again)).toEqual([`http ${SOCKS_IP}`]);
    });
  });

  it('ends, at the PUT that names a proxy, the direct connections opened before; not those through it', async () => {
    const sandbox = await harness.sandbox({});
    const put = async (body: object) => {
      const requestedAt = Date.now();
      const answer = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
        body,
      });
      expect(answer.status, answer.text).toBe(204);
      return { requestedAt, appliedAt: Date.now() };
    };
    // Direct, and only reading (the echo server never speaks first): until Moat ends it, its
    // peer could send around the proxy.
    const before = await watching(
      sandbox,
      onlyReading(`s = socket.create_connection(('${ORIGIN_IP}', ${WORLD_PORTS.echo}))`),
    );
    const named = await put({ egressProxy: { address: open.address } });
    await endedByThe204(
      harness.moat.network!.namespaceOf(sandbox.sandboxId)!,
      { before },
      named.requestedAt,
      named.appliedAt,
    );

    // Through the proxy now (Moat's listener inside): a publish that still allows it keeps it.
    const requests = open.requests.length;
    const through = await watching(
      sandbox,
      [
        'import os, socket, time',
        `s = socket.create_connection(('${ORIGIN_IP}', ${WORLD_PORTS.echo})); s.settimeout(5)`,
        "s.sendall(b'ping'); s.recv(4); print('open', flush=True)",
        "for _ in range(500):\n  if os.path.exists('/tmp/go'): break\n  time.sleep(0.01)",
        "s.sendall(b'pong'); print(s.recv(4).decode(), flush=True)",
      ].join('\n'),
    );
    expect(open.requests.slice(requests)).toEqual([
      { kind: 'ipv4', host: ORIGIN_IP, port: WORLD_PORTS.echo },
    ]);
    await put({ allowOut: [`${ORIGIN_IP}/32`], egressProxy: { address: open.address } });
    await run(sandbox, 'touch /tmp/go');
    await through.handle.wait().catch(() => undefined);
    expect(through.lines()).toEqual(['open', 'pong']);
    await sandbox.kill();
  });

  describe('a sandbox whose proxy wants a login', () => {
    it('logs in, and GET shows the address and username, never the password', async () => {
      const sandbox = await harness.sandbox({
        network: {
          egressProxy: { address: locked.address, username: 'moat-user', password: PASSWORD },
        },
      });
      const mark = world.events.length;
      const tls = await run(sandbox, viaProxyVars('https://origin.test/'));
      expect(tls.stdout, tls.stderr).toBe('world https host=origin.test sni=origin.test\n');
      expect(seenSince(mark)).toEqual([`https ${SOCKS_IP}`]);
      expect(locked.requests.at(-1)).toEqual({
        kind: 'domain',
        host: 'origin.test',
        port: 443,
        username: 'moat-user',
      });
      const info = await sandbox.getInfo();
      expect(info.network?.egressProxy).toEqual({ address: locked.address, username: 'moat-user' });
      const raw = await harness.api.call('GET', `/sandboxes/${sandbox.sandboxId}`);
      expect(raw.text).not.toContain(PASSWORD);
      const listed = await harness.api.call('GET', '/v2/sandboxes');
      expect(listed.text).not.toContain(PASSWORD);
    });

    it('fails closed on wrong credentials: 502 naming the proxy, nothing reaches the origin', async () => {
      const sandbox = await harness.sandbox({
        network: {
          egressProxy: { address: locked.address, username: 'moat-user', password: 'wrong-pw' },
        },
      });
      const mark = world.events.length;
      const refused = await run(
        sandbox,
        `curl -sS -k --max-time 8 -o /dev/null -w '%{http_code}' https://origin.test/; echo; curl -sS --max-time 8 http://origin.test/`,
      );
      // CONNECT's refusal (curl reports the proxy's 502), then the absolute-form one's body.
      expect(refused.stderr).toMatch(/502/);
      expect(refused.stdout).toContain(`egress proxy ${locked.address}`);
      expect(refused.stdout).toContain('it rejected the username and password');
      expect(refused.stdout).not.toContain('wrong-pw');
      const transparent = await run(sandbox, direct('http://origin.test/'));
      expect(transparent.exitCode).not.toBe(0);
      expect(seenSince(mark)).toEqual([]);
    });
  });

  it('fails closed when the proxy is down: nothing goes direct', async () => {
    const sandbox = await harness.sandbox({
      network: { egressProxy: { address: `${SOCKS_IP}:9` } },
    });
    const mark = world.events.length;
    const refused = await run(sandbox, viaProxyVars('http://origin.test/'));
    expect(refused.stdout).toContain(`egress proxy ${SOCKS_IP}:9`);
    expect(refused.stdout).toContain('cannot connect to the proxy');
    const tls = await run(sandbox, viaProxyVars('https://origin.test/'));
    expect(tls.exitCode).not.toBe(0);
    const transparent = await run(sandbox, direct('https://origin.test/'));
    expect(transparent.exitCode).not.toBe(0);
    expect(seenSince(mark)).toEqual([]);
  });

  it('decides first: a destination the policy denies never reaches the proxy', async () => {
    const sandbox = await harness.sandbox({
      network: {
        denyOut: [`${ORIGIN_IP}/32`],
        egressProxy: { address: open.address },
      },
    });
    const accepted = open.accepted;
    const denied = await run(sandbox, viaProxyVars(`http://${ORIGIN_IP}/`));
    expect(denied.stdout).toMatch(/denied by denyOut/);
    // Direct TCP to another port: redirected to Moat, decided by its address, closed.
    const echoed = await run(sandbox, tcpEcho(ORIGIN_IP));
    expect(echoed.stdout).toBe('');
    expect(echoed.exitCode).not.toBe(0);
    expect(open.accepted).toBe(accepted);
    const flows = (await harness.api.get(`/flows?sandboxID=${sandbox.sandboxId}&verdict=deny`))
      .body as Array<{ destination: { address: string | null; port: number | null } }>;
    expect(flows.map((f) => f.destination)).toContainEqual(
      expect.objectContaining({ address: ORIGIN_IP, port: WORLD_PORTS.echo }),
    );
  });
});
