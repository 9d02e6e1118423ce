/**
 * A guest joined to Moat's link below the IP stack, as firecracker-containerd's chain (`moat`,
 * then `tc-redirect-tap`) joins a VM: the real CNI plugin attaches a namespace with
 * `guestLink: "redirect"`, and a veth pair standing in for the VM's tap is mirrored to the
 * interface the result names by tc, both ways (test/support/guest-behind.ts `redirected`). The
 * guest, holding the result's address and running as nobody, is held exactly as a routed one
 * is (guest-behind.test.ts). The world and the fake upstream DNS are bench/lib/world.ts's.
 */
import { execFileSync } from 'node:child_process';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World, WORLD_PORTS } from '../../bench/lib/world.js';
import { type InstalledPlugin, installPlugin, type PluginRun } from '../cni/plugin-run.js';
import { API_KEY } from '../support/api-client.js';
import type { ZoneEntry } from '../support/fake-dns.js';
import { get, GuestBehind, tcpEcho, text } from '../support/guest-behind.js';
import {
  expectAllowedReached,
  expectDirectRecords,
  expectDnsHeldByMoat,
} from '../support/guest-checks.js';
import { namespaceSkipReason } from '../support/netns.js';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

const skip = namespaceSkipReason('test/netns/guest-redirect');

const PREFIX = '10.251.9';
const [ALLOWED_IP, DENIED_IP, CIDR_IP] = [2, 3, 4].map((n) => `${PREFIX}.${n}`);
const POOL = '10.216.9.0/24';
/** The container's namespace the runtime made (a VM's, under firecracker-containerd). */
const POD = 'moat-redirect-pod';
const POD_NETNS = `/run/netns/${POD}`;
const CONTAINER = 'c0ffee0rd';

describe.skipIf(skip !== undefined)('a guest tc redirects to the interface Moat attached', () => {
  let world: World;
  let harness: SdkMoat;
  let plugin: InstalledPlugin;
  let added: PluginRun;
  let guest: GuestBehind;
  let hostServer: net.Server;
  let hostPort: number;
  const zone = new Map<string, ZoneEntry>([
    ['allowed.test', { A: [ALLOWED_IP!], ttl: 300 }],
    ['denied.test', { A: [DENIED_IP!], ttl: 300 }],
  ]);
  const env = (command: string) => ({
    CNI_COMMAND: command,
    CNI_CONTAINERID: CONTAINER,
    CNI_NETNS: POD_NETNS,
    CNI_IFNAME: 'eth0',
  });
  const conf = () =>
    plugin.conf({
      guestLink: 'redirect',
      policy: { allowOut: ['allowed.test', `${CIDR_IP}/32`], denyOut: ['0.0.0.0/0'] },
    });

  beforeAll(async () => {
    world = await World.create('rd', PREFIX);
    harness = await startSdkMoat({
      zone,
      flags: {
        enforcement: 'namespace',
        'namespace-pool': POOL,
        'internal-deny': '169.254.0.0/16',
      },
    });
    plugin = await installPlugin(`http://127.0.0.1:${harness.moat.listening.api.port}`, API_KEY);
    removePod();
  }, 60_000);

  afterAll(async () => {
    guest?.close();
    if (plugin !== undefined) await plugin.run(env('DEL'), conf());
    removePod();
    plugin?.remove();
    hostServer?.close();
    await harness?.stop();
    await world?.close();
  });

  const removePod = () => {
    try {
      execFileSync('/usr/sbin/ip', ['netns', 'delete', POD], { stdio: 'ignore' });
    } catch {
      // Not there.
    }
  };
  /** The network-only sandbox ADD made. */
  let sandboxID = '';

  it("ADD answers the guest's address behind Moat's inner end, and CHECK holds it", async () => {
    execFileSync('/usr/sbin/ip', ['netns', 'add', POD]);
    execFileSync('/usr/sbin/ip', ['-n', POD, 'link', 'set', 'lo', 'up']);
    added = await plugin.run(env('ADD'), conf());
    expect(added.code, added.stdout + added.stderr).toBe(0);
    expect(added.json).toMatchObject({
      interfaces: [{ name: 'eth0', sandbox: POD_NETNS, mac: expect.any(String) }],
      ips: [{ address: '192.0.0.2/30', gateway: '192.0.0.1', interface: 0 }],
      routes: [{ dst: '0.0.0.0/0', gw: '192.0.0.1' }],
    });
    // The interface holds no address: the guest tc joins to it does.
    const shown = execFileSync('/usr/sbin/ip', ['-n', POD, '-o', '-4', 'addr', 'show', 'eth0']);
    expect(String(shown)).toBe('');
    const listed = await harness.api.call('GET', '/sandboxes');
    sandboxID = (listed.body as Array<{ sandboxID: string }>)[0]!.sandboxID;
    const checked = await plugin.run(env('CHECK'), conf());
    expect(checked.code, checked.stdout).toBe(0);
    const { address, gateway } = (
      added.json!.ips as Array<{ address: string; gateway: string }>
    )[0]!;
    guest = GuestBehind.redirected('rd', POD_NETNS, 'eth0', address, gateway);
  }, 30_000);

  it("sends the guest's DNS, to whichever resolver, to Moat's interceptor", () =>
    expectDnsHeldByMoat(guest, DENIED_IP!, world, harness.upstream));

  it('fetches an allowed name (web by its Host, other TCP by the learned address) and an allowed CIDR', () =>
    expectAllowedReached(guest, CIDR_IP!, { udp: false }));

  it('refuses a denied address at once: direct TCP (reset) and web (80)', async () => {
    const tcp = await guest.run(tcpEcho(text(DENIED_IP!), WORLD_PORTS.echo));
    expect(tcp.out, tcp.err).toBe('ConnectionRefusedError\n');
    expect(tcp.ms).toBeLessThan(1500);
    const web = await guest.run(get(text(DENIED_IP!), DENIED_IP!, WORLD_PORTS.http));
    expect(web.out, web.err).toBe('ConnectionResetError\n');
    expect(world.seen('http').filter((e) => e.host === DENIED_IP)).toEqual([]);
  });

  it("cannot reach the host or Moat's API", async () => {
    hostServer = net.createServer((socket) => socket.end('host\n'));
    await new Promise<void>((resolve) => hostServer.listen(0, '0.0.0.0', resolve));
    hostPort = (hostServer.address() as net.AddressInfo).port;
    const apiPort = harness.moat.listening.api.port;
    const sandboxAddress = harness.moat.table.get(sandboxID)!.sourceAddress!.text;
    const hostEnd = sandboxAddress.replace(/\d+$/, (n) => String(Number(n) - 1));
    const gateway = harness.moat.network!.gateway;
    const tries = [world.hostAddress, gateway, hostEnd, sandboxAddress].flatMap((address) => [
      [address, hostPort] as const,
      [address, apiPort] as const,
    ]);
    const reached = await Promise.all(
      tries.map(async ([address, port]) => {
        const ran = await guest.run(tcpEcho(text(address), port), 10_000);
        return `${address}:${port} ${ran.out.trim()}`;
      }),
    );
    for (const line of reached) expect(line).toMatch(/ [A-Za-z]+Error$/);
  }, 30_000);

  it("records the guest's direct flows under the sandbox's ID", () =>
    expectDirectRecords(guest, harness.api, sandboxID, { cidrIp: CIDR_IP!, deniedIp: DENIED_IP! }));

  it("refuses an ifname that is one of Moat's own devices under redirect", async () => {
    const created = await harness.api.call('POST', '/sandboxes', {
      body: {
        templateID: 'network-only',
        netns: POD_NETNS,
        ifname: 'moat-in',
        guestLink: 'redirect',
      },
    });
    expect(created.status, created.text).toBe(400);
    expect((created.body as { message: string }).message).toBe(
      'body.ifname "moat-in" is a name Moat gives its own devices with guestLink "redirect"',
    );
  });

  it("DEL removes Moat's devices, the guest's end with them", async () => {
    const deleted = await plugin.run(env('DEL'), conf());
    expect(deleted.code, deleted.stdout).toBe(0);
    const links = String(execFileSync('/usr/sbin/ip', ['-n', POD, '-o', 'link', 'show']));
    expect(links).not.toMatch(/: (eth0|moat-in|moat-up)[@:]/);
  });
});
