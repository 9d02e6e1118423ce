/**
 * Kernel enforcement end to end, in a topology this test makes: each sandbox in its own network
 * namespace (made by Moat, running in this process in the host namespace), and a "world"
 * namespace with origin servers on addresses the test assigns. The fake upstream DNS maps test
 * names to those addresses and logs every question. Every program inside a sandbox is started
 * through the sandbox API and ignores proxy variables (curl --noproxy '*', bash /dev/tcp,
 * python sockets): only the kernel can hold it.
 */
import net from 'node:net';
import { CommandExitError, Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World, WORLD_PORTS } from '../../bench/lib/world.js';
import type { ZoneEntry } from '../support/fake-dns.js';
import { hostNetworkLines, namespaceSkipReason } from '../support/netns.js';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

const skip = namespaceSkipReason('test/netns/kernel');

const PREFIX = '10.251.1';
const [ALLOWED_IP, DENIED_IP, CIDR_IP, DENY_LISTED_IP] = [2, 3, 4, 5].map((n) => `${PREFIX}.${n}`);
const POOL = '10.216.0.0/24';

interface Ran {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly ms: number;
}

/** Runs a bash script inside the sandbox; a failing exit is a result, not an exception. */
async function run(sandbox: Sandbox, script: string, timeoutMs = 15_000): Promise<Ran> {
  const started = performance.now();
  try {
    const result = await sandbox.commands.run(script, { timeoutMs });
    return {
      exitCode: 0,
      stdout: result.stdout,
      stderr: result.stderr,
      ms: performance.now() - started,
    };
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error;
    return {
      exitCode: error.exitCode,
      stdout: error.stdout,
      stderr: error.stderr,
      ms: performance.now() - started,
    };
  }
}

const curl = (args: string) => `curl --noproxy '*' -sS --max-time 5 ${args}`;
/** TCP echo through bash's /dev/tcp: prints what came back. */
const tcpEcho = (host: string, port = WORLD_PORTS.echo) =>
  `exec 3<>/dev/tcp/${host}/${port} && printf ping >&3 && timeout 3 head -c4 <&3`;
/** A Python program as one shell word (single-quoted; newlines kept). */
const python = (code: string) => `python3 -u -c '${code.replaceAll("'", `'"'"'`)}'`;
const udpEcho = (host: string) =>
  python(
    `import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3); s.connect(('${host}', ${WORLD_PORTS.udpEcho})); s.send(b'pong'); print(s.recv(16).decode())`,
  );
/** A raw DNS question for `name` (type A) to `server`:53; prints the rcode and answer count. */
const dnsQuery = (server: string, name: string) =>
  python(
    [
      'import socket, struct',
      `q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0) + b''.join(bytes([len(p)]) + p.encode() for p in '${name}'.split('.')) + b'\\x00' + struct.pack('>HH', 1, 1)`,
      's = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)',
      `s.sendto(q, ('${server}', 53))`,
      'r = s.recv(512); print(r[3] & 15, struct.unpack(">H", r[6:8])[0])',
    ].join('\n'),
  );

describe.skipIf(skip !== undefined)('kernel enforcement: each sandbox in its own namespace', () => {
  let world: World;
  let harness: SdkMoat;
  const zone = new Map<string, ZoneEntry>([
    ['allowed.test', { A: [ALLOWED_IP!], ttl: 300 }],
    ['denied.test', { A: [DENIED_IP!], ttl: 300 }],
    ['fronted.test', { A: [ALLOWED_IP!], ttl: 300 }],
  ]);

  beforeAll(async () => {
    world = await World.create('e2e', PREFIX);
    harness = await startSdkMoat({
      zone,
      flags: {
        enforcement: 'namespace',
        'namespace-pool': POOL,
        // The world's addresses are private; only link-local stays internal here.
        'internal-deny': '169.254.0.0/16',
      },
    });
  }, 60_000);

  afterAll(async () => {
    await harness?.stop();
    await world?.close();
  });

  async function sandboxWith(body: Record<string, unknown>): Promise<Sandbox> {
    const created = await harness.api.call('POST', '/sandboxes', {
      body: { templateID: 'base', timeout: 600, ...body },
    });
    expect(created.status, created.text).toBe(201);
    const id = (created.body as { sandboxID: string }).sandboxID;
    return Sandbox.connect(id);
  }

  describe('a deny-by-default sandbox with a domain and a CIDR allowed', () => {
    let sandbox: Sandbox;
    beforeAll(async () => {
      sandbox = await sandboxWith({
        network: { allowOut: ['allowed.test', `${CIDR_IP}/32`], denyOut: ['0.0.0.0/0'] },
      });
    }, 30_000);
    afterAll(() => sandbox?.kill());

    it('is reported as namespace-enforced', async () => {
      const detail = await harness.api.call('GET', `/sandboxes/${sandbox.sandboxId}`);
      expect((detail.body as { egress: { enforcement: string } }).egress.enforcement).toBe(
        'namespace',
      );
    });

    it('reaches an allowed name over HTTPS (by SNI) and HTTP (by Host)', async () => {
      const tls = await run(sandbox, curl('-k https://allowed.test/'));
      expect(tls.stdout, tls.stderr).toBe('world https host=allowed.test sni=allowed.test\n');
      const plain = await run(sandbox, curl('http://allowed.test/'));
      expect(plain.stdout, plain.stderr).toBe('world http host=allowed.test\n');
    });

    it('reaches the allowed name on a non-HTTP port through the learned address', async () => {
      const echoed = await run(sandbox, tcpEcho('allowed.test'));
      expect(echoed.stdout, echoed.stderr).toBe('ping');
    });

    it('fails fast for a denied name, whose query never reaches the upstream', async () => {
      const denied = await run(sandbox, curl('http://denied.test/'));
      expect(denied.exitCode).toBe(6); // could not resolve host
      expect(denied.ms).toBeLessThan(2000);
      expect(harness.upstream.log.map((q) => q.name)).not.toContain('denied.test');
    });

    it('reaches an allowOut CIDR over TCP and UDP', async () => {
      expect((await run(sandbox, tcpEcho(CIDR_IP!))).stdout).toBe('ping');
      expect((await run(sandbox, udpEcho(CIDR_IP!))).stdout).toBe('pong\n');
    });

    it('rejects direct addresses under ALL_TRAFFIC at once (TCP reset, ICMP for UDP)', async () => {
      const tcp = await run(sandbox, tcpEcho(DENIED_IP!));
      expect(tcp.exitCode).not.toBe(0);
      expect(tcp.stderr).toMatch(/Connection refused/);
      expect(tcp.ms).toBeLessThan(1500);
      const udp = await run(sandbox, udpEcho(DENIED_IP!));
      expect(udp.exitCode).not.toBe(0);
      expect(udp.stderr).not.toMatch(/timed out/);
    });

    it('answers DNS sent to any other resolver itself; that resolver never sees it', async () => {
      const allowed = await run(sandbox, dnsQuery(ALLOWED_IP!, 'allowed.test'));
      expect(allowed.stdout, allowed.stderr).toBe('0 1\n');
      const denied = await run(sandbox, dnsQuery(DENIED_IP!, 'denied.test'));
      expect(denied.stdout, denied.stderr).toBe('3 0\n'); // NXDOMAIN, from Moat
      expect(world.seen('dns-udp')).toEqual([]);
      expect(harness.upstream.log.map((q) => q.name)).not.toContain('denied.test');
    });

    it('drops DNS over TLS (TCP 853), even to an allowed CIDR', async () => {
      const dot = await run(sandbox, `timeout 2 bash -c 'exec 3<>/dev/tcp/${CIDR_IP}/853'`);
      expect(dot.exitCode).not.toBe(0);
      expect(world.seen('dot')).toEqual([]);
    });

    it('refuses TLS to a learned address whose SNI names a host no rule allows', async () => {
      await run(sandbox, curl('http://allowed.test/')); // learns ALLOWED_IP
      const fronted = await run(
        sandbox,
        curl(`-k --resolve fronted.test:443:${ALLOWED_IP} https://fronted.test/`),
      );
      expect(fronted.exitCode).not.toBe(0);
      expect(world.seen('https').filter((e) => e.sni === 'fronted.test')).toEqual([]);
    });

    it('has no IPv6 on its link', async () => {
      const v6 = await run(
        sandbox,
        `awk '{print $6}' /proc/net/if_inet6; ${python("import socket\ntry:\n socket.create_connection(('fd00::1', 7000), 2)\nexcept OSError as e: print(e.errno)")}`,
      );
      expect(v6.stdout).toBe('lo\n101\n'); // ENETUNREACH
    });
  });

  describe('a default-allow sandbox with one address denied', () => {
    let sandbox: Sandbox;
    let hostServer: net.Server;
    let hostPort: number;
    beforeAll(async () => {
      sandbox = await sandboxWith({ network: { denyOut: [`${DENY_LISTED_IP}/32`] } });
      hostServer = net.createServer((socket) => socket.end('host\n'));
      await new Promise<void>((resolve) => hostServer.listen(0, '0.0.0.0', resolve));
      hostPort = (hostServer.address() as net.AddressInfo).port;
    }, 30_000);
    afterAll(async () => {
      await sandbox?.kill();
      hostServer?.close();
    });

    it('reaches other addresses directly and is refused the denied one at once', async () => {
      expect((await run(sandbox, tcpEcho(ALLOWED_IP!))).stdout).toBe('ping');
      const denied = await run(sandbox, tcpEcho(DENY_LISTED_IP!));
      expect(denied.stderr).toMatch(/Connection refused/);
      expect(denied.ms).toBeLessThan(1500);
    });

    it('cannot reach the host, its gateway ports or the other sandboxes', async () => {
      const gateway = harness.moat.network!.gateway;
      for (const address of [world.hostAddress, gateway]) {
        const reached = await run(
          sandbox,
          `timeout 2 bash -c 'exec 3<>/dev/tcp/${address}/${hostPort} && cat <&3'`,
        );
        expect(reached.stdout, `${address}:${hostPort}`).toBe('');
        expect(reached.exitCode).not.toBe(0);
      }
    });
  });

  it('blocks everything direct when allow_internet_access is false', async () => {
    const sandbox = await sandboxWith({ allow_internet_access: false });
    try {
      const direct = await run(sandbox, tcpEcho(ALLOWED_IP!));
      expect(direct.stderr).toMatch(/Connection refused/);
      const named = await run(sandbox, curl('http://allowed.test/'));
      expect(named.exitCode).toBe(6);
    } finally {
      await sandbox.kill();
    }
  });

  it('applies PUT network to the next connection and closes now-denied open ones within 100 ms', async () => {
    const sandbox = await sandboxWith({
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    try {
      // Two open connections: a raw TCP one the kernel holds through the learned address, and a
      // TLS one through the transparent listener. Each prints the moment it is cut.
      const watch = (label: string, open: string, loop: string) =>
        python(
          [
            'import socket, ssl, time',
            open,
            `print('${label} open', flush=True)`,
            'try:',
            `  ${loop}`,
            'except OSError: pass',
            `print('${label} closed', int(time.time() * 1000), flush=True)`,
          ].join('\n'),
        );
      let printed = '';
      const onStdout = (data: string) => {
        printed += data;
      };
      const output = { lines: () => printed.split('\n') };
      const tcp = await sandbox.commands.run(
        watch(
          'tcp',
          "s = socket.create_connection(('allowed.test', 7000))",
          "while True:\n    s.sendall(b'x'); s.recv(1) or exit(); time.sleep(0.005)",
        ),
        { background: true, onStdout },
      );
      const tls = await sandbox.commands.run(
        watch(
          'tls',
          "c = ssl.create_default_context(); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE\ns = c.wrap_socket(socket.create_connection(('allowed.test', 443)), server_hostname='allowed.test')",
          's.recv(1)',
        ),
        { background: true, onStdout },
      );
      const deadline = Date.now() + 10_000;
      while (output.lines().filter((l) => l.endsWith('open')).length < 2 && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 20));
      expect(output.lines()).toEqual(expect.arrayContaining(['tcp open', 'tls open']));

      const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
        body: { allowOut: [`${CIDR_IP}/32`], denyOut: ['0.0.0.0/0'] },
      });
      const appliedAt = Date.now();
      expect(put.status, put.text).toBe(204);
      await Promise.all([tcp.wait().catch(() => undefined), tls.wait().catch(() => undefined)]);
      for (const label of ['tcp', 'tls']) {
        const line = output.lines().find((l) => l.startsWith(`${label} closed `));
        expect(line, printed).toBeDefined();
        expect(Number(line!.split(' ')[2]) - appliedAt, label).toBeLessThan(100);
      }
      // The next connection is decided by the new policy.
      expect((await run(sandbox, curl('http://allowed.test/'))).exitCode).toBe(6);
      expect((await run(sandbox, tcpEcho(CIDR_IP!))).stdout).toBe('ping');
    } finally {
      await sandbox.kill();
    }
  });

  it('leaves no namespace or link behind a killed sandbox', async () => {
    const network = harness.moat.network!;
    const sandbox = await sandboxWith({});
    const left = () => hostNetworkLines(network.linkPrefix.slice(2, -1));
    expect(left().namespaces).toHaveLength(1);
    expect(left().links).toHaveLength(1);
    await sandbox.kill();
    expect(left()).toMatchObject({ namespaces: [], links: [] });
  });
});
