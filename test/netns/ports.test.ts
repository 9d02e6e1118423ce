/**
 * Port-scoped rules and names in denyOut at the kernel and at DNS, as a sandbox meets them: each
 * sandbox in its own namespace (made by Moat), a "world" namespace with TCP echo on 7000 and UDP
 * echo on 7001 on every address. Programs in the sandbox ignore proxy variables (bash /dev/tcp,
 * python sockets): only the sandbox's firewall can hold them. And as a user would: git over SSH
 * to a host allowed on port 22 (dropbear in the world), while port 80 of that host is refused.
 */
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World, WORLD_PORTS } from '../../bench/lib/world.js';
import type { ZoneEntry } from '../support/fake-dns.js';
import { gitSshSkipReason, startGitSshOrigin } from '../support/git-ssh-origin.js';
import { namespaceSkipReason } from '../support/netns.js';
import { python } from '../support/sandbox-watch.js';
import { shellOutput, tcpEchoScript } from '../support/sdk-shell.js';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

const skip = namespaceSkipReason('test/netns/ports');
/** The git over SSH case needs dropbear too (installed here where the machine allows). */
const sshSkip = skip ?? gitSshSkipReason();
if (sshSkip !== undefined && skip === undefined)
  console.warn(`test/netns/ports: git over SSH skipped: ${sshSkip}`);

const PREFIX = '198.18.41';
const ORIGIN = `${PREFIX}.2`;
const { echo: TCP_PORT, udpEcho: UDP_PORT } = WORLD_PORTS;

const run = shellOutput;

const tcpEcho = (host: string) => tcpEchoScript(host);
/** UDP echo: `pong`, or the errno of a refused send or answer (1, 111), or `timeout`. */
const udpEcho = (host: string) =>
  python(
    `import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); s.connect(("${host}", ${UDP_PORT}))\ntry:\n s.send(b"pong"); print(s.recv(16).decode())\nexcept socket.timeout: print("timeout")\nexcept OSError as e: print(e.errno)`,
  );
/** A DNS question (type A) for `name`, sent to any address: Moat answers it. Prints rcode, count. */
const dnsQuery = (name: string) =>
  python(
    [
      'import socket, struct',
      `q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0) + b''.join(bytes([len(p)]) + p.encode() for p in '${name}'.split('.')) + b'\\x00' + struct.pack('>HH', 1, 1)`,
      's = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)',
      `s.sendto(q, ('${ORIGIN}', 53))`,
      'r = s.recv(512); print(r[3] & 15, struct.unpack(">H", r[6:8])[0])',
    ].join('\n'),
  );

describe.skipIf(skip !== undefined)('ports at the kernel and at DNS', () => {
  let world: World;
  let harness: SdkMoat;
  const zone = new Map<string, ZoneEntry>([
    ['db.test', { A: [ORIGIN], ttl: 300 }],
    ['evil.test', { A: [ORIGIN], ttl: 300 }],
    ['smtp.test', { A: [ORIGIN], ttl: 300 }],
    ['git.test', { A: [ORIGIN], ttl: 300 }],
  ]);

  beforeAll(async () => {
    world = await World.create('ports', PREFIX);
    harness = await startSdkMoat({
      zone,
      flags: {
        enforcement: 'namespace',
        'namespace-pool': '10.216.3.0/24',
        // The world's addresses are benchmarking ones, internal by default.
        'internal-deny': '169.254.0.0/16',
      },
    });
  }, 60_000);

  afterAll(async () => {
    await harness?.stop();
    await world?.close();
  });

  async function sandboxWith(network: Record<string, unknown>): Promise<Sandbox> {
    const created = await harness.api.call('POST', '/sandboxes', {
      body: { templateID: 'base', timeout: 600, network },
    });
    expect(created.status, created.text).toBe(201);
    return Sandbox.connect((created.body as { sandboxID: string }).sandboxID);
  }

  it('reaches an allowed IP:port directly, and not another port of the same address', async () => {
    const tcpOnly = await sandboxWith({
      allowOut: [`${ORIGIN}:${TCP_PORT}`],
      denyOut: ['0.0.0.0/0'],
    });
    const udpOnly = await sandboxWith({
      allowOut: [`${ORIGIN}/32:${UDP_PORT}-${UDP_PORT + 1}`],
      denyOut: ['0.0.0.0/0'],
    });
    try {
      expect(await run(tcpOnly, tcpEcho(ORIGIN))).toBe('ping');
      expect(await run(tcpOnly, udpEcho(ORIGIN))).toBe('1\n'); // EPERM: refused on the way out
      expect(await run(udpOnly, udpEcho(ORIGIN))).toBe('pong\n');
      expect(await run(udpOnly, tcpEcho(ORIGIN))).toMatch(/Connection refused/);
    } finally {
      await Promise.all([tcpOnly.kill(), udpOnly.kill()]);
    }
  });

  it('opens the learned address of a port-scoped name on its port only', async () => {
    const sandbox = await sandboxWith({
      allowOut: [`db.test:${TCP_PORT}`],
      denyOut: ['0.0.0.0/0'],
    });
    try {
      // The name resolves (allowed on some port), and its address opens on that port.
      expect(await run(sandbox, dnsQuery('db.test'))).toBe('0 1\n');
      expect(await run(sandbox, tcpEcho('db.test'))).toBe('ping');
      expect(await run(sandbox, udpEcho('db.test'))).toBe('1\n');
      expect(await run(sandbox, tcpEcho(ORIGIN))).toBe('ping'); // learned, by address
    } finally {
      await sandbox.kill();
    }
  });

  it('lets a learned address through a denyOut IP:port, as decide does (learned before deny), both ways', async () => {
    const sandbox = await sandboxWith({
      allowOut: ['db.test'],
      denyOut: ['0.0.0.0/0', `${ORIGIN}:${TCP_PORT}`],
    });
    try {
      expect(await run(sandbox, tcpEcho('db.test'))).toBe('ping');
      expect(await run(sandbox, tcpEcho(ORIGIN))).toBe('ping');
    } finally {
      await sandbox.kill();
    }
  });

  it('denies a denyOut IP:port directly, and leaves the other ports of the address open', async () => {
    const sandbox = await sandboxWith({ denyOut: [`${ORIGIN}:${TCP_PORT}`] });
    try {
      expect(await run(sandbox, tcpEcho(ORIGIN))).toMatch(/Connection refused/);
      expect(await run(sandbox, udpEcho(ORIGIN))).toBe('pong\n');
    } finally {
      await sandbox.kill();
    }
  });

  it('answers NXDOMAIN for a name denyOut denies on every port; one denied on some ports resolves', async () => {
    const sandbox = await sandboxWith({ denyOut: ['evil.test', `smtp.test:25`] });
    try {
      expect(await run(sandbox, dnsQuery('evil.test'))).toBe('3 0\n');
      expect(await run(sandbox, dnsQuery('smtp.test'))).toBe('0 1\n');
      expect(harness.upstream.log.map((q) => q.name)).not.toContain('evil.test');
    } finally {
      await sandbox.kill();
    }
  });

  it('closes the address DNS gave for a name denied on some ports, on those ports, by address too', async () => {
    const sandbox = await sandboxWith({ denyOut: [`smtp.test:${TCP_PORT}`] });
    try {
      // Nothing ties the address to the name before the sandbox asks for it: default allow.
      expect(await run(sandbox, tcpEcho(ORIGIN))).toBe('ping');
      expect(await run(sandbox, dnsQuery('smtp.test'))).toBe('0 1\n');
      expect(await run(sandbox, tcpEcho('smtp.test'))).toMatch(/Connection refused/);
      expect(await run(sandbox, tcpEcho(ORIGIN))).toMatch(/Connection refused/);
      expect(await run(sandbox, udpEcho(ORIGIN))).toBe('pong\n');
    } finally {
      await sandbox.kill();
    }
  });

  it('closes every port of an address given for a name whose rules decide requests, under a default-allow policy', async () => {
    const sandbox = await sandboxWith({
      rules: {
        'db.test': [{ match: { methods: ['GET'] }, action: 'allow' }, { action: 'deny' }],
      },
    });
    const postByAddress = `curl --noproxy '*' -sS -m 5 -o /dev/null -w '%{http_code}' -X POST http://${ORIGIN}/`;
    try {
      expect(await run(sandbox, tcpEcho(ORIGIN))).toBe('ping');
      expect(await run(sandbox, postByAddress)).toBe('200');
      const seen = world.seen('http').length;
      expect(await run(sandbox, dnsQuery('db.test'))).toBe('0 1\n');
      expect(await run(sandbox, tcpEcho(ORIGIN))).toMatch(/Connection refused/);
      expect(await run(sandbox, udpEcho(ORIGIN))).toBe('1\n');
      // Web ports go to the transparent listener, which does not let a bare address past the
      // name's rules.
      expect(await run(sandbox, postByAddress)).not.toBe('200');
      expect(world.seen('http')).toHaveLength(seen);
    } finally {
      await sandbox.kill();
    }
  });

  it.skipIf(sshSkip !== undefined)(
    'clones with git over SSH from an allowed host:22, while port 80 of that host is refused',
    async () => {
      const origin = await startGitSshOrigin(world.namespace, ORIGIN);
      const sandbox = await sandboxWith({ allowOut: ['git.test:22'], denyOut: ['0.0.0.0/0'] });
      try {
        await sandbox.files.write('/home/user/.ssh/id_ed25519', origin.privateKey);
        const ssh =
          'ssh -i ~/.ssh/id_ed25519 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR';
        expect(
          await run(
            sandbox,
            `chmod 600 ~/.ssh/id_ed25519 && GIT_SSH_COMMAND='${ssh}' git clone -q ssh://root@git.test${origin.repository} repo && cat repo/README`,
          ),
        ).toBe(`${origin.readme}\n`);
        // Port 80 of the same host (the world serves HTTP there): refused by the proxy the
        // sandbox's proxy variables name, and by its firewall when the proxy is bypassed.
        expect(
          await run(sandbox, `curl -sS -m 5 -o /dev/null -w '%{http_code}' http://git.test/`),
        ).toBe('403');
        const direct = await run(
          sandbox,
          `curl --noproxy '*' -sS -m 5 -o /dev/null -w '%{http_code}' http://git.test:${WORLD_PORTS.http}/`,
        );
        // Web ports go to the transparent listener, which refuses the denied port by closing.
        expect(direct).toMatch(/\(52\) Empty reply from server/);
        expect(world.seen('http').filter((e) => e.host?.startsWith('git.test'))).toEqual([]);
      } finally {
        await sandbox.kill();
        await origin.close();
      }
    },
    60_000,
  );
});
