/**
 * Everything behind a sandbox's namespace is held: a guest (test/support/guest-behind.ts) routed
 * through the namespace, as a VM's tap or a container's bridge is, running as nobody, is decided
 * exactly as the sandbox's own processes are. One suite, over both kinds of sandbox: one of
 * Moat's own, and a network-only sandbox (a namespace this test makes, as a runtime would, and
 * Moat adopts). The world (origin servers) and the fake upstream DNS are kernel.test.ts's
 * (bench/lib/world.ts).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import net from 'node:net';
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World, WORLD_PORTS } from '../../bench/lib/world.js';
import type { ZoneEntry } from '../support/fake-dns.js';
import {
  AS_NOBODY,
  get,
  GuestBehind,
  tcpEcho,
  tcpEchoEach,
  text,
  udpEcho,
} from '../support/guest-behind.js';
import {
  expectAllowedReached,
  expectDirectRecords,
  expectDnsHeldByMoat,
} from '../support/guest-checks.js';
import { hostServer, namespaceSkipReason } from '../support/netns.js';
import { until } from '../support/native-relay.js';
import { arrivalsOf, python, udpArrivals } from '../support/sandbox-watch.js';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

const skip = namespaceSkipReason('test/netns/guest-behind');

const PREFIX = '10.251.7';
const [ALLOWED_IP, DENIED_IP, CIDR_IP] = [2, 3, 4].map((n) => `${PREFIX}.${n}`);
const POOL = '10.216.7.0/24';
const LISTENER_PORT = 8000;

describe.skipIf(skip !== undefined)('what a sandbox namespace forwards (a guest behind it)', () => {
  let world: World;
  let harness: SdkMoat;
  const zone = new Map<string, ZoneEntry>([
    ['allowed.test', { A: [ALLOWED_IP!], ttl: 300 }],
    ['denied.test', { A: [DENIED_IP!], ttl: 300 }],
  ]);
  const guests: GuestBehind[] = [];

  beforeAll(async () => {
    world = await World.create('gb', PREFIX);
    harness = await startSdkMoat({
      zone,
      flags: {
        enforcement: 'namespace',
        'namespace-pool': POOL,
        'internal-deny': '169.254.0.0/16',
      },
    });
  }, 60_000);

  afterAll(async () => {
    for (const guest of guests) guest.close();
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

  /** A guest behind the sandbox's namespace (Moat names it /run/netns/moat-<scope>-<slot>). */
  function guestOf(sandbox: Held, tag: string, uplink?: string): GuestBehind {
    const netns = harness.moat.network!.namespaceOf(sandbox.sandboxId)!;
    // Moat's handle, whoever made the namespace.
    expect(netns).toMatch(/^\/run\/netns\/moat-[0-9a-f]{6}-\d+$/);
    const guest = GuestBehind.create(tag, netns, { uplink });
    guests.push(guest);
    return guest;
  }

  const addressOf = (sandbox: { sandboxId: string }) =>
    harness.moat.table.get(sandbox.sandboxId)!.sourceAddress!.text;

  /** A sandbox of either kind, and how a program of its namespace's own runs (as nobody). */
  interface Held {
    readonly sandboxId: string;
    /** Whether `script` (bash) run in the namespace itself exits 0. */
    local(script: string): Promise<boolean>;
    kill(): Promise<void>;
  }
  let adopted = 0;
  const KINDS: Array<[string, (network: Record<string, unknown>) => Promise<Held>]> = [
    [
      "one of Moat's own sandboxes",
      async (network) => {
        const sandbox = await sandboxWith(network);
        return {
          sandboxId: sandbox.sandboxId,
          local: (script) =>
            sandbox.commands.run(script).then(
              () => true,
              () => false,
            ),
          kill: () => sandbox.kill().then(() => undefined),
        };
      },
    ],
    [
      'a network-only sandbox (a namespace Moat adopted)',
      async (network) => {
        const name = `gb-held-${process.pid}-${++adopted}`;
        execFileSync('/usr/sbin/ip', ['netns', 'add', name]);
        const created = await harness.api.call('POST', '/sandboxes', {
          body: { templateID: 'network-only', netns: `/run/netns/${name}`, network },
        });
        expect(created.status, created.text).toBe(201);
        const sandboxId = (created.body as { sandboxID: string }).sandboxID;
        return {
          sandboxId,
          local: async (script) =>
            spawnSync(
              '/usr/sbin/ip',
              ['netns', 'exec', name, ...AS_NOBODY, '/bin/bash', '-c', script],
              { timeout: 10_000 },
            ).status === 0,
          kill: async () => {
            await harness.api.call('DELETE', `/sandboxes/${sandboxId}`);
            execFileSync('/usr/sbin/ip', ['netns', 'delete', name]);
          },
        };
      },
    ],
  ];

  describe.each(KINDS.map(([what, make], kind) => ({ what, make, kind })))(
    'behind $what',
    ({ make, kind }) => {
      describe('a deny-by-default sandbox with a name and a CIDR allowed', () => {
        let sandbox: Held;
        let guest: GuestBehind;
        beforeAll(async () => {
          sandbox = await make({
            allowOut: ['allowed.test', `${CIDR_IP}/32`],
            denyOut: ['0.0.0.0/0'],
          });
          guest = guestOf(sandbox, `a${kind}`);
        }, 30_000);
        afterAll(() => sandbox?.kill());

        it("sends the guest's DNS, to whichever resolver, to Moat's interceptor", () =>
          expectDnsHeldByMoat(guest, DENIED_IP!, world, harness.upstream));

        it('fetches an allowed name (web by its Host, other TCP by the learned address) and an allowed CIDR', () =>
          expectAllowedReached(guest, CIDR_IP!, { udp: true }));

        it('refuses a denied address at once: direct TCP (reset), UDP (ICMP), and web by its name', async () => {
          const tcp = await guest.run(tcpEcho(text(DENIED_IP!), WORLD_PORTS.echo));
          expect(tcp.out, tcp.err).toBe('ConnectionRefusedError\n');
          expect(tcp.ms).toBeLessThan(1500);
          const udp = await guest.run(udpEcho(DENIED_IP!, WORLD_PORTS.udpEcho));
          expect(udp.out, udp.err).toBe('113\n'); // EHOSTUNREACH: the firewall's ICMP
          expect(udp.ms).toBeLessThan(1500);
          // Web to the denied address: the transparent listener finds no allowed name, and resets.
          for (const port of [WORLD_PORTS.http, WORLD_PORTS.https]) {
            const web = await guest.run(get(text(DENIED_IP!), DENIED_IP!, port));
            expect(web.out, `${port}: ${web.err}`).toBe('ConnectionResetError\n');
          }
          expect(world.seen('http').filter((e) => e.host === DENIED_IP)).toEqual([]);
        });

        it("records the guest's direct flows under the sandbox's ID", () =>
          expectDirectRecords(guest, harness.api, sandbox.sandboxId, {
            cidrIp: CIDR_IP!,
            deniedIp: DENIED_IP!,
          }));
      });

      describe('a default-allow sandbox', () => {
        let sandbox: Held;
        let guest: GuestBehind;
        let hostListener: { port: number; close: () => void } | undefined;
        beforeAll(async () => {
          sandbox = await make({ denyOut: [`${DENIED_IP}/32`] });
          guest = guestOf(sandbox, `b${kind}`, '192.168.78');
          hostListener = await hostServer();
        }, 30_000);
        afterAll(async () => {
          await sandbox?.kill();
          hostListener?.close();
        });

        it("reaches the world under the sandbox's address, never the guest's", async () => {
          const host = `masquerade-${kind}.test`;
          const reached = await guest.run(get(text(ALLOWED_IP!), host));
          expect(reached.out, reached.err).toBe(`world http host=${host}\n`);
          // The host masquerades the sandbox's address in turn: the world sees the host's.
          const seen = world.seen('http').filter((e) => e.host === host);
          expect(seen.map((e) => e.from?.replace(/^::ffff:/, ''))).toEqual([world.hostAddress]);
        });

        it("cannot reach the host, Moat's other listeners on the gateway, or the sandbox itself", async () => {
          const gateway = harness.moat.network!.gateway;
          // Control: the host's server answers whoever may reach it.
          expect(
            await new Promise((resolve) => {
              const socket = net.connect(hostListener!.port, '127.0.0.1', () => socket.end());
              socket.on('data', (data) => resolve(String(data)));
              socket.on('error', () => resolve('refused'));
            }),
          ).toBe('host\n');
          const targets = [world.hostAddress, gateway, addressOf(sandbox), guest.router];
          const reached = await guest.run(
            tcpEchoEach(targets.map((address) => [text(address), hostListener!.port])),
            10_000,
          );
          const results = reached.out.trim().split('\n');
          expect(results, reached.err).toHaveLength(targets.length);
          results.forEach((result, i) =>
            expect(result, `${targets[i]}:${hostListener!.port}`).not.toMatch(/host|ping/),
          );
        });

        it('cannot reach another sandbox, which Moat itself can reach', async () => {
          const other = await sandboxWith({});
          try {
            let printed = '';
            await other.commands.run(
              python(
                `import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(("0.0.0.0", ${LISTENER_PORT})); s.listen(8); print("listening", flush=True)\nwhile True:\n c, a = s.accept(); print("accepted", flush=True); c.close()`,
              ),
              { background: true, onStdout: (data: string) => void (printed += data) },
            );
            await until(() => printed.includes('listening'), 5000);
            const accepted = () => printed.split('\n').filter((l) => l === 'accepted').length;
            // Moat's side of the link (ingress) reaches it...
            await new Promise<void>((resolve, reject) => {
              const socket = net.connect(LISTENER_PORT, addressOf(other), () => {
                socket.end();
                resolve();
              });
              socket.on('error', reject);
            });
            await until(() => accepted() === 1, 5000);
            // ...the guest behind this sandbox does not.
            const tcp = await guest.run(tcpEcho(text(addressOf(other)), LISTENER_PORT), 10_000);
            expect(tcp.out).not.toBe('closed\n');
            await new Promise((resolve) => setTimeout(resolve, 200));
            expect(accepted()).toBe(1);
          } finally {
            await other.kill();
          }
        });

        it("forwards nothing out of the namespace's other devices (a runtime's own uplink)", async () => {
          const outside = guest.spawnOutside(
            `import socket\nl = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\nl.bind(('0.0.0.0', ${LISTENER_PORT})); l.listen(8); print('listening', flush=True)\nwhile True:\n c, a = l.accept(); print('accepted', a[0], flush=True); c.sendall(b'ping'); c.close()`,
          );
          let printed = '';
          outside.stdout!.setEncoding('utf8').on('data', (data: string) => (printed += data));
          try {
            await until(() => printed.includes('listening'), 5000);
            // Control: the outside's listener answers on its own address, and the sandbox's
            // namespace routes to it by the uplink, not by Moat's link.
            const route = execFileSync(
              '/usr/bin/nsenter',
              [
                `--net=${harness.moat.network!.namespaceOf(sandbox.sandboxId)!}`,
                '/usr/sbin/ip',
                'route',
                'get',
                guest.outside!,
              ],
              { encoding: 'utf8' },
            );
            expect(route).toMatch(/dev mub/);
            // Neither the guest nor the sandbox's own processes get out that way.
            const [fromGuest, fromSandbox] = await Promise.all([
              guest.run(tcpEcho(text(guest.outside!), LISTENER_PORT), 10_000),
              sandbox.local(
                `timeout 3 bash -c 'exec 3<>/dev/tcp/${guest.outside}/${LISTENER_PORT}'`,
              ),
            ]);
            expect(fromGuest.out).not.toBe('ping\n');
            expect(fromSandbox).toBe(false);
            expect(printed).not.toContain('accepted');
          } finally {
            outside.kill('SIGKILL');
          }
        });

        it("holds the guest to the sandbox's connection budget (its firewall's refusal counter)", async () => {
          const netns = harness.moat.network!.namespaceOf(sandbox.sandboxId)!;
          const refused = () =>
            Number(
              /counter new_connections_refused \{\s*packets (\d+)/.exec(
                execFileSync('/usr/bin/nsenter', [
                  `--net=${netns}`,
                  '/usr/sbin/nft',
                  'list',
                  'counters',
                  'table',
                  'inet',
                  'moat',
                ]).toString(),
              )![1],
            );
          const before = refused();
          // 3,000 new UDP flows at once: the burst (400) and the rate (200/s) let far fewer out.
          const flood = await guest.run(
            `import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nfor port in range(20000, 23000):\n  try: s.sendto(b'x', ('${ALLOWED_IP}', port))\n  except OSError: pass\nprint('sent')`,
          );
          expect(flood.out, flood.err).toBe('sent\n');
          expect(refused() - before).toBeGreaterThan(1000);
        });

        it('passes nothing of an open connection or a UDP peer a publish denies from its 204 on', async () => {
          // One keeps asking the echo, noting when each round trip that was answered began (a
          // guest's connection ends at its next send: Moat's sock_diag cannot reach a guest's
          // sockets); one listens to the world's UDP talker (a datagram every 10 ms, which only
          // the firewall can stop). Times are the guest's sends and the kernel's receptions, so
          // a guest that wakes late on a loaded host does not read as a late firewall.
          const asking = guest.spawn(
            [
              'import socket, time',
              `s = socket.create_connection(('${ALLOWED_IP}', ${WORLD_PORTS.echo}), timeout=5)`,
              "s.sendall(b'ping'); s.recv(4); print('open', flush=True)",
              'end = time.time() + 5; answered = 0',
              'try:',
              '  while time.time() < end:',
              '    began = int(time.time() * 1000)',
              "    s.sendall(b'ping')",
              '    if not s.recv(4): break',
              '    answered = began; time.sleep(0.005)',
              '  else:',
              "    print('still open after 5 s', flush=True); exit()",
              'except OSError: pass',
              "print('closed', int(time.time() * 1000), answered, flush=True)",
            ].join('\n'),
          );
          const talking = guest.spawn(udpArrivals(ALLOWED_IP!, WORLD_PORTS.udpTalk));
          const out = { asking: '', talking: '' };
          asking.stdout!.setEncoding('utf8').on('data', (data: string) => (out.asking += data));
          talking.stdout!.setEncoding('utf8').on('data', (data: string) => (out.talking += data));
          const ended = (child: typeof asking) =>
            new Promise((resolve) => child.once('close', resolve));
          const done = Promise.all([ended(asking), ended(talking)]);
          await until(() => out.asking.includes('open') && out.talking.includes('open'), 10_000);
          expect(out).toMatchObject({ asking: 'open\n' });
          // The talker's stream is flowing before the publish (a loaded host starts it late).
          // More than six: the sixth's receive time may fall in the very ms the PUT is asked.
          await until(() => arrivalsOf(out.talking.split('\n')).length > 6, 2_000);
          const requestedAt = Date.now();
          const put = await harness.api.call('PUT', `/sandboxes/${sandbox.sandboxId}/network`, {
            body: { denyOut: [`${ALLOWED_IP}/32`] },
          });
          const appliedAt = Date.now();
          expect(put.status, put.text).toBe(204);
          await done;
          const closed = out.asking.split('\n').find((line) => line.startsWith('closed '));
          expect(closed, out.asking).toBeDefined();
          const [closedAt = 0, lastAnswered = 0] = closed!.split(' ').slice(1).map(Number);
          expect(closedAt).toBeGreaterThanOrEqual(requestedAt);
          // It learned of the publish at a send, not at its 5 s timeout.
          expect(closedAt - appliedAt).toBeLessThan(2_000);
          expect(lastAnswered, 'a round trip begun after the 204 was answered').toBeLessThan(
            appliedAt,
          );
          const arrivals = arrivalsOf(out.talking.split('\n'));
          expect(arrivals.filter((at) => at < requestedAt).length).toBeGreaterThan(5);
          expect(arrivals.filter((at) => at > appliedAt)).toEqual([]);
          expect(out.talking).toContain('done');
        });
      });
    },
  );
});
