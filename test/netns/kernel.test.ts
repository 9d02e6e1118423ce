/**
 * Kernel enforcement end to end, in a topology this test makes: each sandbox in its own network
 * namespace (made by Moat, running in this process in the host namespace), and a "world"
 * namespace with origin servers on addresses the test assigns. The fake upstream DNS maps test
 * names to those addresses and logs every question. Every program inside a sandbox is started
 * through the sandbox API and ignores proxy variables (curl --noproxy '*', bash /dev/tcp,
 * python sockets): only the kernel can hold it.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import net from 'node:net';
import { CommandExitError, Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World, WORLD_PORTS } from '../../bench/lib/world.js';
import type { ZoneEntry } from '../support/fake-dns.js';
import { hostNetworkLines, hostServer, namespaceSkipReason } from '../support/netns.js';
import {
  arrivalsOf,
  endedByThe204,
  onlyReading,
  PRINT_PORT,
  python,
  udpArrivals,
  watching,
} from '../support/sandbox-watch.js';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

const skip = namespaceSkipReason('test/netns/kernel');

const PREFIX = '10.251.1';
const [ALLOWED_IP, DENIED_IP, CIDR_IP, DENY_LISTED_IP] = [2, 3, 4, 5].map((n) => `${PREFIX}.${n}`);
const POOL = '10.216.0.0/24';
/** A further address of the world that Moat's internal deny list holds. */
const INTERNAL_IP = `${PREFIX}.9`;

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
const udpEcho = (host: string) =>
  python(
    `import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3); s.connect(('${host}', ${WORLD_PORTS.udpEcho})); s.send(b'pong'); print(s.recv(16).decode())`,
  );
/** A UDP question to the world's echo, a failed send ignored: prints the answer or the errno. */
const udpAnswer = (host: string) =>
  python(
    `import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3); s.connect(("${host}", ${WORLD_PORTS.udpEcho}))\ntry:\n s.send(b"pong")\nexcept OSError: pass\ntry:\n print(s.recv(16).decode())\nexcept OSError as e: print(e.errno)`,
  );
/** Sends one UDP datagram; prints `sent` or the errno of the send (1, EPERM: the firewall dropped it). */
const udpSend = (host: string, port: number) =>
  python(
    `import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n s.sendto(b"q", ("${host}", ${port})); print("sent")\nexcept OSError as e: print(e.errno)`,
  );
/** Runs a program as root in a namespace this test (or its Moat) made, from outside any sandbox. */
const inNamespace = (netns: string, script: string) =>
  spawnSync('/usr/bin/nsenter', [`--net=${netns}`, '--', '/bin/bash', '-c', script], {
    encoding: 'utf8',
    timeout: 15_000,
  });
/** A port of the world where a test's own server keeps the connections it accepts open. */
const HOLD_PORT = 7100;
/** A TCP listener inside a sandbox that prints `accepted` for each connection it gets. */
const LISTENER_PORT = 8000;
const listener = python(
  `import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(("0.0.0.0", ${LISTENER_PORT})); s.listen(8); print("listening", flush=True)\nwhile True:\n c, a = s.accept(); print("accepted", a[0], flush=True); c.close()`,
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

async function until(done: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`not within ${timeoutMs} ms: ${done.toString()}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** Opens and closes a TCP connection from this process (the host namespace). */
function connectFromHost(host: string, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host, port, timeout: 3000 }, () => {
      socket.end();
      resolve();
    });
    socket.on('timeout', () => socket.destroy(new Error(`${host}:${port}: no connection`)));
    socket.on('error', reject);
  });
}

describe.skipIf(skip !== undefined)('kernel enforcement: each sandbox in its own namespace', () => {
  let world: World;
  /** One more origin address in the world (its servers listen on every address). */
  const addWorldAddress = (address: string) =>
    execFileSync('/usr/sbin/ip', [
      '-n',
      world.namespace,
      'addr',
      'add',
      `${address}/24`,
      'dev',
      'eth0',
    ]);
  let harness: SdkMoat;
  const zone = new Map<string, ZoneEntry>([
    ['allowed.test', { A: [ALLOWED_IP!], ttl: 300 }],
    ['denied.test', { A: [DENIED_IP!], ttl: 300 }],
    ['fronted.test', { A: [ALLOWED_IP!], ttl: 300 }],
  ]);

  beforeAll(async () => {
    world = await World.create('e2e', PREFIX);
    addWorldAddress(INTERNAL_IP);
    harness = await startSdkMoat({
      zone,
      flags: {
        enforcement: 'namespace',
        'namespace-pool': POOL,
        // The world's addresses are private; only link-local and one world address stay
        // internal here.
        'internal-deny': `169.254.0.0/16,${INTERNAL_IP}/32`,
        // A name with a 1 s TTL is learned for 1 s (names of 300 s keep theirs).
        'dns-min-ttl': '1',
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

  /** The sandbox's own address (its end of the link). */
  const addressOf = (sandbox: Sandbox) =>
    harness.moat.table.get(sandbox.sandboxId)!.sourceAddress!.text;
  /** The path of the sandbox's network namespace. */
  const namespaceOf = (sandbox: { sandboxId: string }) =>
    harness.moat.network!.namespaceOf(sandbox.sandboxId)!;

  /** Starts `listener` in the sandbox; counts the connections it accepts. */
  async function listen(sandbox: Sandbox): Promise<{ accepted: () => number }> {
    let printed = '';
    await sandbox.commands.run(listener, {
      background: true,
      onStdout: (data: string) => {
        printed += data;
      },
    });
    await until(() => printed.includes('listening'));
    return { accepted: () => printed.split('\n').filter((l) => l.startsWith('accepted')).length };
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
      // The send fails at once (EPERM) either way; a reject's ICMP answer then fails the next
      // receive at once too (EHOSTUNREACH), where a silent drop would leave it waiting.
      const udp = await run(sandbox, udpAnswer(DENIED_IP!));
      expect(udp.stdout, udp.stderr).toBe('113\n');
      expect(udp.ms).toBeLessThan(1500);
    });

    it('records direct flows the kernel lets out or refuses, from its log, with the deciding rule', async () => {
      // A port no other test uses picks this test's flows out (TCP to it is refused by the
      // world host, which is no matter: its first packet left the sandbox).
      const port = WORLD_PORTS.udpTalk;
      const since = Date.now();
      expect((await run(sandbox, tcpEcho(CIDR_IP!, port))).exitCode).not.toBe(0);
      expect((await run(sandbox, udpSend(CIDR_IP!, port))).stdout).toBe('sent\n');
      expect((await run(sandbox, tcpEcho(DENIED_IP!, port))).exitCode).not.toBe(0);
      // Through Moat (a name by the transparent listener): recorded by Moat, not as direct.
      expect((await run(sandbox, curl('http://allowed.test/'))).exitCode).toBe(0);
      type Direct = {
        kind: string;
        verdict: string;
        list: string;
        rule: string | null;
        destination: { name: string | null; address: string; port: number; protocol: string };
      };
      const direct = async () =>
        (
          (
            await harness.api.call(
              'GET',
              `/flows?sandboxID=${sandbox.sandboxId}&kind=direct&since=${new Date(since).toISOString()}&limit=100`,
            )
          ).body as Direct[]
        )
          .filter((r) => r.destination.port === port)
          .map((r) => [
            r.verdict,
            r.list,
            r.rule,
            r.destination.protocol,
            r.destination.address,
            r.destination.port,
          ]);
      const deadline = Date.now() + 3000;
      while ((await direct()).length < 3 && Date.now() < deadline)
        await new Promise((resolve) => setTimeout(resolve, 50));
      expect((await direct()).sort()).toEqual(
        [
          ['allow', 'allowOut', `${CIDR_IP}/32`, 'tcp', CIDR_IP, port],
          ['allow', 'allowOut', `${CIDR_IP}/32`, 'udp', CIDR_IP, port],
          ['deny', 'denyOut', '0.0.0.0/0', 'tcp', DENIED_IP, port],
        ].sort(),
      );
    });

    it('resets a direct web connection to a denied address and records the address and the rule', async () => {
      const since = new Date().toISOString();
      // Redirected to the transparent listener (port 80 to an address the rules deny), whose
      // Host header names only the address.
      const plain = await run(sandbox, curl(`http://${DENIED_IP}/`));
      expect(plain.exitCode, plain.stderr).toBe(56); // a reset, not 52 (an empty reply)
      expect(plain.stderr).toMatch(/reset/i);
      type Record = {
        verdict: string;
        list: string;
        rule: string | null;
        destination: { address: string | null; port: number | null };
      };
      const records = async () =>
        (
          (
            await harness.api.call(
              'GET',
              `/flows?sandboxID=${sandbox.sandboxId}&kind=transparent&since=${since}&limit=100`,
            )
          ).body as Record[]
        ).map((r) => [r.verdict, r.list, r.rule, r.destination.address, r.destination.port]);
      const deadline = Date.now() + 3000;
      while ((await records()).length < 1 && Date.now() < deadline)
        await new Promise((resolve) => setTimeout(resolve, 50));
      expect(await records()).toEqual([['deny', 'denyOut', '0.0.0.0/0', DENIED_IP, 80]]);
    });

    it('records at most the firewall log rate of a flood of new direct flows, and Moat serves on', async () => {
      const since = new Date().toISOString();
      const started = Date.now();
      // 5,000 refused flows in a burst: UDP to as many ports of a denied address.
      const flood = await run(
        sandbox,
        python(
          `import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nn = 0\nfor port in range(20000, 25000):\n  try:\n    s.sendto(b"x", ("${DENIED_IP}", port)); n += 1\n  except OSError: pass\nprint(n)`,
        ),
      );
      expect(flood.exitCode, flood.stderr).toBe(0);
      const seconds = (Date.now() - started) / 1000 + 1;
      await new Promise((resolve) => setTimeout(resolve, 300));
      const records = (
        await harness.api.call(
          'GET',
          `/flows?sandboxID=${sandbox.sandboxId}&kind=direct&verdict=deny&since=${since}&limit=10000`,
        )
      ).body as Array<{ destination: { port: number } }>;
      const flooded = records.filter(
        (r) => r.destination.port >= 20000 && r.destination.port < 25000,
      );
      // The burst (1,000) and the rate (500/s) bound them; some were recorded.
      expect(flooded.length).toBeGreaterThan(100);
      expect(flooded.length).toBeLessThanOrEqual(1000 + 500 * seconds);
      expect((await harness.api.call('GET', `/sandboxes/${sandbox.sandboxId}`)).status).toBe(200);
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

    it('drops DNS over QUIC (UDP 853) before it leaves the sandbox, even to an allowed CIDR', async () => {
      // A send the firewall drops fails at once with EPERM; the next port's datagram leaves.
      expect((await run(sandbox, udpSend(CIDR_IP!, 853))).stdout).toBe('1\n');
      expect((await run(sandbox, udpSend(CIDR_IP!, 854))).stdout).toBe('sent\n');
    });

    it('decides web traffic to an address its DNS never gave by the name (SNI or Host)', async () => {
      // An address from elsewhere (a hosts file, a stale cache): Moat connects to the name.
      const tls = await run(
        sandbox,
        curl(`-k --resolve allowed.test:443:${DENIED_IP} https://allowed.test/`),
      );
      expect(tls.stdout, tls.stderr).toBe('world https host=allowed.test sni=allowed.test\n');
      const plain = await run(
        sandbox,
        curl(`--resolve allowed.test:80:${DENIED_IP} http://allowed.test/`),
      );
      expect(plain.stdout, plain.stderr).toBe('world http host=allowed.test\n');
      // No allowed name: refused.
      const bare = await run(sandbox, curl(`http://${DENIED_IP}/`));
      expect(bare.exitCode).not.toBe(0);
      expect(world.seen('http').filter((e) => e.host === DENIED_IP)).toEqual([]);
    });

    it('drops web traffic to an internal address in the kernel, even with an allowed name', async () => {
      const web = await run(
        sandbox,
        curl(`--max-time 2 -H 'Host: allowed.test' http://${INTERNAL_IP}/`),
      );
      expect(web.stdout).toBe('');
      expect(web.exitCode, web.stderr).toBe(28); // no answer at all, not even Moat's listener
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
    let hostListener: { port: number; close: () => void } | undefined;
    beforeAll(async () => {
      sandbox = await sandboxWith({ network: { denyOut: [`${DENY_LISTED_IP}/32`] } });
      hostListener = await hostServer();
    }, 30_000);
    afterAll(async () => {
      await sandbox?.kill();
      hostListener?.close();
    });

    it('reaches other addresses directly and is refused the denied one at once', async () => {
      expect((await run(sandbox, tcpEcho(ALLOWED_IP!))).stdout).toBe('ping');
      const denied = await run(sandbox, tcpEcho(DENY_LISTED_IP!));
      expect(denied.stderr).toMatch(/Connection refused/);
      expect(denied.ms).toBeLessThan(1500);
    });

    it('keeps reaching an address by HTTPS without a name once DNS gave it for a name', async () => {
      // No rule denies the address: it is allowed by itself, SNI or not, learned or not.
      const bare = curl(`-k https://${ALLOWED_IP}/`);
      expect((await run(sandbox, bare)).stdout).toBe(`world https host=${ALLOWED_IP}\n`);
      expect((await run(sandbox, 'getent hosts allowed.test')).exitCode).toBe(0);
      const again = await run(sandbox, bare);
      expect(again.stdout, again.stderr).toBe(`world https host=${ALLOWED_IP}\n`);
    });

    it('cannot reach the host, its gateway ports or the other sandboxes', async () => {
      const gateway = harness.moat.network!.gateway;
      for (const address of [world.hostAddress, gateway]) {
        const reached = await run(
          sandbox,
          `timeout 2 bash -c 'exec 3<>/dev/tcp/${address}/${hostListener!.port} && cat <&3'`,
        );
        expect(reached.stdout, `${address}:${hostListener!.port}`).toBe('');
        expect(reached.exitCode).not.toBe(0);
      }
    });

    it('sends nothing to another sandbox (its own firewall drops it) and takes nothing from the world', async () => {
      const other = await sandboxWith({});
      try {
        const otherAddress = addressOf(other);
        const heard = await listen(other);
        // Moat's side of the link (the ingress path) reaches the listener...
        await connectFromHost(otherAddress, LISTENER_PORT);
        await until(() => heard.accepted() === 1);
        // ...the sandbox next door does not, and its datagrams never leave its namespace...
        const tcp = await run(
          sandbox,
          `timeout 2 bash -c 'exec 3<>/dev/tcp/${otherAddress}/${LISTENER_PORT}'`,
        );
        expect(tcp.exitCode).not.toBe(0);
        expect((await run(sandbox, udpSend(otherAddress, LISTENER_PORT))).stdout).toBe('1\n');
        // ...nor does anything routed to it from elsewhere (the world).
        const fromWorld = inNamespace(
          `/run/netns/${world.namespace}`,
          `timeout 2 bash -c 'exec 3<>/dev/tcp/${otherAddress}/${LISTENER_PORT}'`,
        );
        expect(fromWorld.status).not.toBe(0);
        expect(heard.accepted()).toBe(1);
      } finally {
        await other.kill();
      }
    });

    it('reaches the world under the host address (masqueraded)', async () => {
      const reached = await run(sandbox, curl(`-H 'Host: masquerade.test' http://${ALLOWED_IP}/`));
      expect(reached.stdout, reached.stderr).toBe('world http host=masquerade.test\n');
      const seen = world.seen('http').filter((e) => e.host === 'masquerade.test');
      expect(seen.map((e) => e.from?.replace(/^::ffff:/, ''))).toEqual([world.hostAddress]);
    });

    it('is held apart by the host even when sandboxes remove their own firewalls', async () => {
      const [a, b] = await Promise.all([sandboxWith({}), sandboxWith({})]);
      try {
        for (const s of [a, b]) {
          const netns = namespaceOf(s);
          const removed = inNamespace(netns, '/usr/sbin/nft delete table inet moat');
          expect(removed.status, removed.stderr).toBe(0);
        }
        const bAddress = addressOf(b);
        const heard = await listen(b);
        // Without its own firewall B takes a connection from the world, and A reaches it too...
        const fromWorld = inNamespace(
          `/run/netns/${world.namespace}`,
          `timeout 2 bash -c 'exec 3<>/dev/tcp/${bAddress}/${LISTENER_PORT}'`,
        );
        expect(fromWorld.status, fromWorld.stderr).toBe(0);
        await until(() => heard.accepted() === 1);
        expect((await run(a, tcpEcho(ALLOWED_IP!))).stdout).toBe('ping');
        // ...but the host still keeps A from B, from the host and from the gateway's other ports.
        const toB = await run(
          a,
          `timeout 2 bash -c 'exec 3<>/dev/tcp/${bAddress}/${LISTENER_PORT}'`,
        );
        expect(toB.exitCode).not.toBe(0);
        for (const address of [world.hostAddress, harness.moat.network!.gateway]) {
          const reached = await run(
            a,
            `timeout 2 bash -c 'exec 3<>/dev/tcp/${address}/${hostListener!.port} && cat <&3'`,
          );
          expect(reached.stdout, `${address}:${hostListener!.port}`).toBe('');
          expect(reached.exitCode).not.toBe(0);
        }
        expect(heard.accepted()).toBe(1);
      } finally {
        await Promise.all([a.kill(), b.kill()]);
      }
    });
  });

  it('drops an internal address even when allowOut names it', async () => {
    const sandbox = await sandboxWith({
      network: { allowOut: [`${INTERNAL_IP}/32`], denyOut: ['0.0.0.0/0'] },
    });
    try {
      const echo = await run(sandbox, `timeout 2 bash -c '${tcpEcho(INTERNAL_IP)}'`);
      expect(echo.stdout).toBe('');
      expect(echo.exitCode, echo.stderr).toBe(124); // dropped: no answer at all
      expect((await run(sandbox, udpSend(INTERNAL_IP, WORLD_PORTS.udpEcho))).stdout).toBe('1\n');
    } finally {
      await sandbox.kill();
    }
  });

  it('keeps learned addresses of names a new policy still allows, and closes the others', async () => {
    const sandbox = await sandboxWith({
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    const put = (allowOut: string[]) =>
      harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
        body: { allowOut, denyOut: ['0.0.0.0/0'] },
      });
    try {
      expect((await run(sandbox, tcpEcho('allowed.test'))).stdout).toBe('ping'); // learns it
      expect((await put(['allowed.test', `${CIDR_IP}/32`])).status).toBe(204);
      // By address, without asking DNS again: still open.
      const kept = await run(sandbox, tcpEcho(ALLOWED_IP!));
      expect(kept.stdout, kept.stderr).toBe('ping');
      expect((await put([`${CIDR_IP}/32`])).status).toBe(204);
      const closed = await run(sandbox, tcpEcho(ALLOWED_IP!));
      expect(closed.stderr).toMatch(/Connection refused/);
    } finally {
      await sandbox.kill();
    }
  });

  it('closes a learned address to new connections when its TTL runs out, not open ones', async () => {
    const address = `${PREFIX}.10`;
    addWorldAddress(address);
    zone.set('brief.test', { A: [address], ttl: 1 });
    const sandbox = await sandboxWith({
      network: { allowOut: ['brief.test'], denyOut: ['0.0.0.0/0'] },
    });
    try {
      // A connection opened while the address was learned (a database session, say) carries on
      // past the TTL: expiry closes the address to new connections only.
      let printed = '';
      const open = await sandbox.commands.run(
        python(
          [
            'import socket, sys',
            `s = socket.create_connection(('brief.test', ${WORLD_PORTS.echo}), timeout=3)`,
            "s.sendall(b'ping'); print(s.recv(4).decode(), flush=True)",
            // Waits for the test's word (a line on stdin) that the address has expired.
            'sys.stdin.readline()',
            "s.sendall(b'late'); print(s.recv(4).decode(), flush=True)",
          ].join('\n'),
        ),
        { background: true, stdin: true, onStdout: (data: string) => void (printed += data) },
      );
      // The name was learned just before the echo came back: the TTL counts from about here.
      await until(() => printed.includes('ping'), 10_000);
      const deadline = Date.now() + 3500;
      // By address, without asking DNS again: open until the firewall lets it expire (the 1 s
      // TTL and its margin, 2 s in nft's whole seconds), refused after.
      for (let refused = false; !refused;) {
        expect(Date.now(), 'learned address still open 3.5 s after it was learned').toBeLessThan(
          deadline,
        );
        const probe = await run(sandbox, tcpEcho(address));
        refused = /Connection refused/.test(probe.stderr);
        expect(probe.stdout, probe.stderr).toBe(refused ? '' : 'ping');
        if (!refused) await new Promise((resolve) => setTimeout(resolve, 100));
      }
      await sandbox.commands.sendStdin(open.pid, 'expired\n');
      // A cut connection ends the program with an error: its output is the evidence either way.
      const kept = await open.wait().catch((error: CommandExitError) => error);
      expect(kept.stdout, kept.stderr).toBe('ping\nlate\n');
    } finally {
      await sandbox.kill();
    }
  });

  it('rejects IPv6 even when it comes back on the link', async () => {
    const sandbox = await sandboxWith({});
    try {
      const netns = namespaceOf(sandbox);
      const back = inNamespace(
        netns,
        'echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6 && /usr/sbin/ip -6 addr add fd00:77::2/64 dev eth0 nodad',
      );
      expect(back.status, back.stderr).toBe(0);
      const v6 = await run(
        sandbox,
        python(
          "import socket, time\nt = time.time()\ntry:\n socket.create_connection(('fd00:77::1', 7000), 3)\nexcept OSError as e: print(e.errno, round(time.time() - t))",
        ),
      );
      // EACCES (admin-prohibited) by the first SYN's retry; unanswered, it would time out at 3 s.
      expect(v6.stdout, v6.stderr).toMatch(/^13 [01]\n$/);
    } finally {
      await sandbox.kill();
    }
  });

  it('opens a learned address before its answer is released, even while a large publish is applied', async () => {
    // Fresh addresses, each learned once and connected to the moment its answer is read, while
    // publishes of a large policy keep the sandbox's firewall busy (a learned address waits
    // behind them; its answer must wait with it).
    const count = 20;
    const names = Array.from({ length: count }, (_, i) => `n${i}.race.test`);
    names.forEach((name, i) => {
      const address = `${PREFIX}.${100 + i}`;
      addWorldAddress(address);
      zone.set(name, { A: [address], ttl: 300 });
    });
    const network = { allowOut: ['*.race.test'], denyOut: ['0.0.0.0/0'] };
    const sandbox = await sandboxWith({ network });
    const large = {
      ...network,
      allowOut: [
        ...network.allowOut,
        ...Array.from({ length: 5000 }, (_, i) => `11.${i >> 8}.${i & 255}.${(i * 7) & 255}`),
      ],
    };
    let publishing = true;
    let published = 0;
    const publisher = (async () => {
      while (publishing) {
        const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
          body: large,
        });
        expect(put.status, put.text).toBe(204);
        published++;
      }
    })();
    try {
      const raced = await run(
        sandbox,
        python(
          [
            'import socket',
            'failed = []',
            `for i in range(${count}):`,
            '  name = f"n{i}.race.test"',
            `  address = socket.getaddrinfo(name, ${WORLD_PORTS.echo}, socket.AF_INET, socket.SOCK_STREAM)[0][4]`,
            '  try:',
            '    socket.create_connection(address, 2).close()',
            '  except OSError as e:',
            '    failed.append(f"{name}: {e}")',
            'print(len(failed), failed[:3])',
          ].join('\n'),
        ),
        60_000,
      );
      expect(raced.stdout, raced.stderr).toBe('0 []\n');
    } finally {
      publishing = false;
      await publisher;
      await sandbox.kill();
    }
    expect(published).toBeGreaterThan(1);
  });

  it('answers 503 to a network change its firewall refused, saying what holds', async () => {
    const sandbox = await sandboxWith({});
    try {
      // The firewall's table gone (as only root outside the sandbox can do): nft refuses the change.
      const netns = namespaceOf(sandbox);
      const removed = inNamespace(netns, '/usr/sbin/nft delete table inet moat');
      expect(removed.status, removed.stderr).toBe(0);
      const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
        body: { denyOut: [`${DENY_LISTED_IP}/32`] },
      });
      expect(put.status).toBe(503);
      expect(put.text).toMatch(/could not be updated .*denying everything failed too/);
    } finally {
      await sandbox.kill();
    }
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

  it('applies PUT network to the next connection and ends now-denied open ones by its 204', async () => {
    const sandbox = await sandboxWith({
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    try {
      // Open connections: raw TCP ones the kernel holds through the learned address (one
      // talking, one only waiting for bytes: nothing it sends could be refused), and a TLS one
      // through the transparent listener.
      const tcp = await watching(
        sandbox,
        [
          'import socket, time',
          "s = socket.create_connection(('allowed.test', 7000))",
          PRINT_PORT,
          "print('open', flush=True)",
          'try:',
          "  while True:\n    s.sendall(b'x'); s.recv(1) or exit(); time.sleep(0.005)",
          'except OSError: pass',
          "print('closed', int(time.time() * 1000), flush=True)",
        ].join('\n'),
      );
      const idle = await watching(
        sandbox,
        onlyReading("s = socket.create_connection(('allowed.test', 7000))"),
      );
      const tls = await watching(
        sandbox,
        onlyReading(
          "import ssl\nc = ssl.create_default_context(); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE\ns = c.wrap_socket(socket.create_connection(('allowed.test', 443)), server_hostname='allowed.test')",
        ),
      );
      // All still open just before the publish, so the ends below are its doing.
      for (const watched of [tcp, idle, tls])
        expect(watched.lines().filter((line) => line.startsWith('closed'))).toEqual([]);
      const requestedAt = Date.now();
      const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
        body: { allowOut: [`${CIDR_IP}/32`], denyOut: ['0.0.0.0/0'] },
      });
      const appliedAt = Date.now();
      expect(put.status, put.text).toBe(204);
      await endedByThe204(namespaceOf(sandbox), { tcp, idle, tls }, requestedAt, appliedAt);
      // The next connection is decided by the new policy.
      expect((await run(sandbox, curl('http://allowed.test/'))).exitCode).toBe(6);
      expect((await run(sandbox, tcpEcho(CIDR_IP!))).stdout).toBe('ping');
    } finally {
      await sandbox.kill();
    }
  });

  it('keeps, across a publish, open connections the new policy allows and those to Moat itself', async () => {
    const sandbox = await sandboxWith({
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    try {
      // A tunnel through Moat's proxy on the gateway, a direct connection the kernel holds, and
      // a web connection the transparent listener holds (it looks direct from inside).
      const program = python(
        [
          'import base64, os, socket, time, urllib.parse',
          "p = urllib.parse.urlsplit(os.environ['HTTPS_PROXY'])",
          "login = base64.b64encode(f'{p.username}:{p.password}'.encode()).decode()",
          's = socket.create_connection((p.hostname, p.port))',
          "s.sendall(f'CONNECT allowed.test:7000 HTTP/1.1\\r\\nProxy-Authorization: Basic {login}\\r\\n\\r\\n'.encode())",
          "head = b''",
          "while not head.endswith(b'\\r\\n\\r\\n'): head += s.recv(1)",
          // First bytes at once (and plainly not HTTP): the proxy checks a tunnel's first bytes
          // within a deadline.
          "s.sendall(b'\\x00hi'); s.recv(3)",
          "d = socket.create_connection(('allowed.test', 7000))",
          // Web under a deny-all policy: through the transparent listener, decided by name.
          "w = socket.create_connection(('allowed.test', 80))",
          "get = b'GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n'",
          'w.sendall(get); w.recv(4096)',
          "print('open', head.split()[1].decode(), flush=True)",
          "while not os.path.exists('/tmp/go'): time.sleep(0.01)",
          "for c in (s, d): c.sendall(b'ping'); print(c.recv(4).decode(), flush=True)",
          "w.sendall(get); print(w.recv(4096).split(b'\\r\\n')[0].decode(), flush=True)",
        ].join('\n'),
      );
      let printed = '';
      const held = await sandbox.commands.run(program, {
        background: true,
        onStdout: (data) => void (printed += data),
      });
      const deadline = Date.now() + 10_000;
      // The whole line: its start can arrive before its end.
      while (!printed.includes('\n') && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 20));
      expect(printed).toBe('open 200\n');
      const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
        body: { allowOut: ['allowed.test', `${CIDR_IP}/32`], denyOut: ['0.0.0.0/0'] },
      });
      expect(put.status, put.text).toBe(204);
      await run(sandbox, 'touch /tmp/go');
      await held.wait();
      expect(printed).toBe('open 200\nping\nping\nHTTP/1.1 200 OK\n');
    } finally {
      await sandbox.kill();
    }
  });

  it("refuses a sandbox that sends another sandbox's proxy credential (407, counted)", async () => {
    const [mine, theirs] = await Promise.all([
      sandboxWith({ network: { denyOut: ['0.0.0.0/0'] } }),
      sandboxWith({ network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] } }),
    ]);
    const refused = async () =>
      (await harness.moat.metrics.proxyConnections.get()).values.find(
        (v) => v.labels.kind === 'forward' && v.labels.verdict === 'unauthenticated',
      )?.value ?? 0;
    try {
      const theirProxy = (await run(theirs, 'printf %s "$HTTP_PROXY"')).stdout;
      expect(theirProxy).toContain(theirs.sandboxId);
      const before = await refused();
      // Their credential, from my address: my address says who I am.
      const borrowed = await run(
        mine,
        `curl -sS -o /dev/null -w '%{http_code}' --proxy '${theirProxy}' http://allowed.test/`,
      );
      expect(borrowed.stdout, borrowed.stderr).toBe('407');
      expect(await refused()).toBe(before + 1);
      // Theirs works for them.
      const own = await run(theirs, `curl -sS --proxy "$HTTP_PROXY" http://allowed.test/`);
      expect(own.stdout, own.stderr).toBe('world http host=allowed.test\n');
    } finally {
      await Promise.all([mine.kill(), theirs.kill()]);
    }
  });

  it('cuts direct web connections whose Host a tightened policy no longer allows, by the 204', async () => {
    // Opened under an open policy to an address shared by allowed.test and fronted.test (a
    // CDN), naming fronted.test; then only allowed.test is allowed. The address stays learned
    // for allowed.test, but these connections never named it. One keeps asking; the other
    // only waits for bytes (nothing it sends could be refused: only Moat can end it).
    const sandbox = await sandboxWith({});
    try {
      const request = "b'GET / HTTP/1.1\\r\\nHost: fronted.test\\r\\n\\r\\n'";
      const opening = [
        'import socket, time',
        `s = socket.create_connection(('allowed.test', ${WORLD_PORTS.http}), timeout=5)`,
        `s.sendall(${request}); assert b'host=fronted.test' in s.recv(4096)`,
        PRINT_PORT,
        "print('open', flush=True)",
      ];
      const closing = [
        'except TimeoutError:',
        "  print('still open after 5 s', flush=True); exit()",
        'except OSError: pass',
        "print('closed', int(time.time() * 1000), flush=True)",
      ];
      const asking = await watching(
        sandbox,
        [
          ...opening,
          'end = time.time() + 5',
          'try:',
          '  while time.time() < end:',
          `    s.sendall(${request})`,
          '    if not s.recv(4096): break',
          '    time.sleep(0.005)',
          '  else:',
          '    raise TimeoutError()',
          ...closing,
        ].join('\n'),
      );
      const waiting = await watching(
        sandbox,
        [...opening, 'try:', '  s.recv(1)', ...closing].join('\n'),
      );
      const requestedAt = Date.now();
      const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
        body: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
      });
      const appliedAt = Date.now();
      expect(put.status, put.text).toBe(204);
      await endedByThe204(namespaceOf(sandbox), { asking, waiting }, requestedAt, appliedAt);
      // allowed.test itself still works, by its name (through the transparent listener now).
      const allowed = await run(sandbox, curl('http://allowed.test/'));
      expect(allowed.stdout, allowed.stderr).toBe('world http host=allowed.test\n');
    } finally {
      await sandbox.kill();
    }
  });

  it('ends denied direct connections by the 204 whatever their sockets look like', async () => {
    // A sandbox chooses how its sockets look in a listing: an IPv6 socket to an IPv4-mapped
    // address prints as [::ffff:a.b.c.d], one bound to its interface (SO_BINDTODEVICE needs
    // no privilege on an unbound socket) as a.b.c.d%eth0, and one it half-closed (as a client
    // that sent its whole request does) is in FIN-WAIT-2, not established. All only wait for
    // bytes, through the learned address: nothing they send could be refused, only Moat can
    // end them. The half-closed one's peer in the world keeps its end open.
    const sandbox = await sandboxWith({
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    const holder = spawn('/usr/bin/nsenter', [
      `--net=/run/netns/${world.namespace}`,
      '--',
      '/usr/bin/python3',
      '-uc',
      `import socket\nl = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\nl.bind(('0.0.0.0', ${HOLD_PORT})); l.listen(8); print('listening')\nheld = [l.accept() for _ in range(8)]`,
    ]);
    try {
      await new Promise((resolve) => holder.stdout.once('data', resolve));
      const waiting = (open: string) =>
        watching(sandbox, onlyReading(`ip = socket.gethostbyname('allowed.test')\n${open}`));
      const mapped = await waiting(
        "s = socket.socket(socket.AF_INET6); s.connect(('::ffff:' + ip, 7000))",
      );
      const bound = await waiting(
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b'eth0'); s.connect((ip, 7000))",
      );
      const halfClosed = await waiting(
        `s = socket.create_connection((ip, ${HOLD_PORT})); s.shutdown(socket.SHUT_WR)`,
      );
      const requestedAt = Date.now();
      const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
        body: { allowOut: [`${CIDR_IP}/32`], denyOut: ['0.0.0.0/0'] },
      });
      const appliedAt = Date.now();
      expect(put.status, put.text).toBe(204);
      await endedByThe204(
        namespaceOf(sandbox),
        { mapped, bound, halfClosed },
        requestedAt,
        appliedAt,
      );
    } finally {
      holder.kill();
      await sandbox.kill();
    }
  });

  it("keeps, across a publish, the sandbox's connections to itself and its DNS over TCP", async () => {
    // Neither leaves through its firewall: to its own address the sandbox talks over loopback,
    // and TCP to port 53 of any address goes to Moat's DNS. Its view shows them all the same as
    // connections to a sandbox link and to a resolver the policy denies.
    const sandbox = await sandboxWith({
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    try {
      const program = python(
        [
          'import os, socket, struct, time',
          'socket.setdefaulttimeout(5)',
          "l = socket.socket(); l.bind(('0.0.0.0', 8001)); l.listen(1)",
          `c = socket.create_connection(('${addressOf(sandbox)}', 8001)); a, _ = l.accept()`,
          "q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0) + b'\\x07allowed\\x04test\\x00' + struct.pack('>HH', 1, 1)",
          `d = socket.create_connection(('${DENIED_IP}', 53)); f = d.makefile('rb')`,
          'def ask():',
          "  d.sendall(struct.pack('>H', len(q)) + q); r = f.read(struct.unpack('>H', f.read(2))[0])",
          '  return f\'{r[3] & 15} {struct.unpack(">H", r[6:8])[0]}\'',
          "print('open', ask(), flush=True)",
          "while not os.path.exists('/tmp/go'): time.sleep(0.01)",
          "c.sendall(b'ping'); print(a.recv(4).decode(), flush=True)",
          "a.sendall(b'pong'); print(c.recv(4).decode(), flush=True)",
          'print(ask(), flush=True)',
        ].join('\n'),
      );
      let printed = '';
      const held = await sandbox.commands.run(program, {
        background: true,
        onStdout: (data) => void (printed += data),
      });
      // Its whole first line: python -u writes a print's parts separately.
      await until(() => printed.includes('\n'), 10_000);
      expect(printed).toBe('open 0 1\n');
      const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
        body: { allowOut: ['allowed.test', `${CIDR_IP}/32`], denyOut: ['0.0.0.0/0'] },
      });
      expect(put.status, put.text).toBe(204);
      await run(sandbox, 'touch /tmp/go');
      await held.wait().catch(() => undefined);
      expect(printed).toBe('open 0 1\nping\npong\n0 1\n');
    } finally {
      await sandbox.kill();
    }
  });

  it('lets nothing more arrive from a UDP peer once a publish denies it', async () => {
    const sandbox = await sandboxWith({});
    try {
      // The world's talker answers one datagram with 400, one every 10 ms.
      const { handle, lines } = await watching(
        sandbox,
        udpArrivals(DENIED_IP!, WORLD_PORTS.udpTalk),
      );
      await new Promise((resolve) => setTimeout(resolve, 200));
      const requestedAt = Date.now();
      const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
        body: { allowOut: [`${CIDR_IP}/32`], denyOut: ['0.0.0.0/0'] },
      });
      const appliedAt = Date.now();
      expect(put.status, put.text).toBe(204);
      await handle.wait();
      const arrivals = arrivalsOf(lines());
      expect(arrivals.filter((at) => at < requestedAt).length).toBeGreaterThan(5);
      // The talker went on for about 2 s more; none of it reached the sandbox's socket once the
      // PUT was answered (the kernel's receive times).
      const late = arrivals.filter((at) => at > appliedAt);
      expect(late, `last arrival ${Math.max(...arrivals) - appliedAt} ms after the 204`).toEqual(
        [],
      );
      expect(lines()).toContain('done');
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
