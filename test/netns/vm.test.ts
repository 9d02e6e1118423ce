/**
 * A VM Moat does not run, held through its network namespace (issue 32): a QEMU guest (TCG, a
 * Debian kernel, a busybox initramfs this test builds) on a tap device in a namespace this test
 * makes, the way Firecracker or Kata hold one. A `moat serve` runs in a namespace playing the
 * host (./host-moat.ts), with a world of origins linked to it and the test's fake DNS as its
 * upstream. First the guest reaches the world without Moat (the plumbing works, so what fails
 * later fails because of Moat); then Moat adopts the namespace (POST /sandboxes, template
 * network-only) and the guest is held exactly as one of Moat's own sandboxes: DNS through the
 * interceptor, an allowed and a denied fetch, a denied address, the host and a side door out of
 * another interface of the namespace all refused.
 */
import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World, WORLD_PORTS } from '../../bench/lib/world.js';
import { type HostMoat, startHostMoat } from '../support/host-moat.js';
import { namespaceSkipReason } from '../support/netns.js';
import { type Boot, TAP, VmNamespace } from '../support/vm.js';
import { type HostDns, serveDnsIn } from '../support/vm-dns.js';
import { type Kernel, prepareGuest, type Probe } from '../support/vm-guest.js';

const SUITE = 'test/netns/vm';
const prepared = namespaceSkipReason(SUITE) ?? prepareGuest(SUITE);
const skip = typeof prepared === 'string' ? prepared : undefined;

/** The host's own address (not internal for this Moat), with a service on it. */
const HOST = '198.18.33.1';
const HOST_PORT = 8081;
const API_PORT = 3000;
/** The world's /24: its end of the link to the host is .1, its origins .2 to .5. */
const PREFIX = '198.18.32';
const [ALLOWED_IP, DENIED_IP, BARE_IP, SIDE_IP] = [2, 3, 4, 5].map((n) => `${PREFIX}.${n}`);
/** A second link straight from the VM's namespace to the world: a runtime's own way out. */
const SIDE = { vm: '198.18.35.2', world: '198.18.35.1', prefix: 30 };
const POOL = '10.232.0.0/24';

const wget = (url: string, seconds: number) => `timeout ${seconds} wget -q -O - ${url}`;

interface Adopted {
  readonly sandboxID: string;
  readonly link: { address: string; router: string; ifname: string };
  readonly egress: { address: string; dns: string };
}

describe.skipIf(skip !== undefined)('a QEMU guest on a tap device, held by Moat', () => {
  const kernel = prepared as Kernel;
  let moat: HostMoat;
  let dns: HostDns;
  let world: World;
  let vm: VmNamespace;
  const zone = new Map([
    ['allowed.test', { A: [ALLOWED_IP!], ttl: 300 }],
    ['denied.test', { A: [DENIED_IP!], ttl: 300 }],
  ]);

  beforeAll(async () => {
    moat = await startHostMoat('vm', HOST, POOL);
    await moat.host.serve([HOST_PORT]);
    dns = await serveDnsIn(moat.host.name, zone);
    // The world's link is made in this namespace; its host end moves to the host's.
    world = await World.create('vm', PREFIX);
    execFileSync('/usr/sbin/ip', ['link', 'set', 'mw-vm', 'netns', moat.host.name]);
    moat.host.ip('addr', 'add', `${PREFIX}.1/24`, 'dev', 'mw-vm');
    moat.host.ip('link', 'set', 'mw-vm', 'up');
    vm = VmNamespace.create(`moat-vm-${process.pid}`);
    vm.ip(
      'link',
      'add',
      'side0',
      'type',
      'veth',
      'peer',
      'name',
      'side1',
      'netns',
      world.namespace,
    );
    vm.ip('addr', 'add', `${SIDE.vm}/${SIDE.prefix}`, 'dev', 'side0');
    vm.ip('link', 'set', 'side0', 'up');
    const inWorld = (...args: string[]) =>
      execFileSync('/usr/sbin/ip', ['-n', world.namespace, ...args]);
    inWorld('addr', 'add', `${SIDE.world}/${SIDE.prefix}`, 'dev', 'side1');
    inWorld('link', 'set', 'side1', 'up');
    inWorld('route', 'add', `${TAP.subnet}/${TAP.prefix}`, 'via', SIDE.vm);
  }, 120_000);

  afterAll(async () => {
    vm?.close();
    await world?.close();
    await dns?.close();
    await moat?.stop();
  });

  /** Boots the guest with `probes`; prints the boot's timing for the report. */
  async function boot(resolver: string, probes: Probe[]): Promise<Boot> {
    const booted = await vm.boot(kernel, resolver, probes);
    console.log(
      `${SUITE}: guest network up after ${Math.round(booted.upMs)} ms (guest clock ${booted.guestUpS} s), ` +
        `${probes.length} probes, powered off after ${Math.round(booted.totalMs)} ms`,
    );
    for (const probe of probes)
      expect(booted.results.has(probe.name), `probe ${probe.name}:\n${booted.console}`).toBe(true);
    return booted;
  }

  it('reaches the world without Moat: the plumbing works', async () => {
    vm.ip('route', 'add', 'default', 'via', SIDE.world);
    try {
      const booted = await boot(SIDE.world, [
        { name: 'allowed', command: wget(`http://${ALLOWED_IP}/`, 10) },
        { name: 'echo', command: `echo ping | timeout 5 nc ${DENIED_IP} ${WORLD_PORTS.echo}` },
      ]);
      expect(booted.results.get('allowed')!.out).toContain(`world http host=${ALLOWED_IP}`);
      expect(booted.results.get('echo')!.out).toContain('ping');
      expect(world.seen('http').map((e) => e.from)).toContain(TAP.guest);
    } finally {
      vm.ip('route', 'delete', 'default');
    }
  }, 60_000);

  describe('adopted by Moat (POST /sandboxes, template network-only)', () => {
    let adopted: Adopted | undefined;
    /** Why the adopted guest was not booted: what of issue 32 this build lacks. */
    let missing: string | undefined;
    let booted: Boot;
    /** World events from before the adoption (the plumbing test's). */
    let before = 0;
    const result = (name: string) => booted.results.get(name)!;

    beforeAll(async () => {
      // A runtime's own way out, beside Moat's link: a route to one origin through side0.
      vm.ip('route', 'add', `${SIDE_IP}/32`, 'via', SIDE.world);
      const reply = await moat.api.call('POST', '/sandboxes', {
        body: {
          templateID: 'network-only',
          netns: vm.path,
          network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
        },
      });
      if (reply.status !== 201 || (reply.body as Partial<Adopted>).link === undefined) {
        missing = `adoption of a namespace (issue 32, branch adopt) is not in this build: POST /sandboxes {templateID: "network-only", netns} answered ${reply.status} ${reply.text}`;
        console.warn(`${SUITE}: adopted guest skipped: ${missing}`);
        return;
      }
      adopted = reply.body as Adopted;
      before = world.events.length;
      booted = await boot(hostOf(adopted.egress.dns), [
        { name: 'dns-allowed', command: 'timeout 5 nslookup allowed.test' },
        { name: 'dns-denied', command: 'timeout 5 nslookup denied.test' },
        // A resolver of the guest's own choosing (the world's port 53 only records who came).
        { name: 'dns-elsewhere', command: `timeout 5 nslookup allowed.test ${BARE_IP}` },
        { name: 'fetch-allowed', command: wget('http://allowed.test/', 10) },
        { name: 'fetch-denied', command: wget('http://denied.test/', 3) },
        { name: 'direct-denied', command: wget(`http://${DENIED_IP}/`, 3) },
        {
          name: 'echo-denied',
          command: `echo ping | timeout 3 nc ${BARE_IP} ${WORLD_PORTS.echo}`,
        },
        { name: 'side-door', command: wget(`http://${SIDE_IP}/`, 3) },
        { name: 'host-service', command: wget(`http://${HOST}:${HOST_PORT}/`, 3) },
        { name: 'host-api', command: wget(`http://${adopted.link.router}:${API_PORT}/health`, 3) },
        {
          name: 'gateway-api',
          command: wget(`http://${hostOf(adopted.egress.dns)}:${API_PORT}/health`, 3),
        },
      ]);
    }, 120_000);

    afterAll(async () => {
      if (adopted) await moat.api.call('DELETE', `/sandboxes/${adopted.sandboxID}`);
    });

    it('answers DNS through the interceptor: an allowed name, a denied one NXDOMAIN', (context) => {
      if (missing) return context.skip(missing);
      expect(result('dns-allowed').out).toContain(ALLOWED_IP);
      expect(result('dns-denied').code).not.toBe(0);
      expect(result('dns-denied').out).toContain('NXDOMAIN');
      // Asked of another server, answered by the interceptor all the same.
      expect(result('dns-elsewhere').out).toContain(ALLOWED_IP);
      expect(world.events.slice(before).filter((e) => e.event.startsWith('dns'))).toEqual([]);
      expect(dns.upstream.log.map((q) => q.name)).not.toContain('denied.test');
    });

    it('fetches from an allowed name, through Moat and its host', (context) => {
      if (missing) return context.skip(missing);
      expect(result('fetch-allowed').code, result('fetch-allowed').out).toBe(0);
      expect(result('fetch-allowed').out).toContain('world http host=allowed.test');
      // The host masquerades what its sandboxes send; its answer came back, so what left the
      // guest's namespace was under the sandbox's address (the host has no route to 172.30/24).
      const http = world.events.slice(before).filter((e) => e.event === 'http');
      expect(http.map((e) => [e.host, e.from])).toEqual([['allowed.test', `${PREFIX}.1`]]);
    });

    it('refuses a denied name, a denied address on 80 and on a TCP port', (context) => {
      if (missing) return context.skip(missing);
      for (const probe of ['fetch-denied', 'direct-denied', 'echo-denied'])
        expect(result(probe).code, `${probe}: ${result(probe).out}`).not.toBe(0);
      expect(result('echo-denied').out).not.toContain('ping');
    });

    it('forwards nothing out of another interface of the namespace', (context) => {
      if (missing) return context.skip(missing);
      expect(result('side-door').code, result('side-door').out).not.toBe(0);
      const from = world.events.slice(before).map((e) => e.from);
      expect(from).not.toContain(TAP.guest);
      expect(from).not.toContain(SIDE.vm);
    });

    it("refuses the host: its service, Moat's API on the link and on the gateway", (context) => {
      if (missing) return context.skip(missing);
      for (const probe of ['host-service', 'host-api', 'gateway-api'])
        expect(result(probe).code, `${probe}: ${result(probe).out}`).not.toBe(0);
      expect(moat.host.served).toEqual([]);
    });

    it("records the guest's flows under its sandbox", async (context) => {
      if (missing) return context.skip(missing);
      const flows = await moat.api.call('GET', `/flows?sandboxID=${adopted!.sandboxID}&limit=500`);
      expect(flows.status, flows.text).toBe(200);
      type Flow = {
        kind: string;
        verdict: string;
        destination: { name: string | null; address: string | null };
      };
      const seen = (flows.body as Flow[]).map(
        (f) => `${f.kind} ${f.verdict} ${f.destination.name ?? f.destination.address}`,
      );
      expect(seen).toContain('dns allow allowed.test');
      expect(seen).toContain('dns deny denied.test');
      expect(seen).toContain(`direct deny ${BARE_IP}`);
    });

    it("detaches on DELETE: Moat's link and table go, the namespace and its tap stay", async (context) => {
      if (missing) return context.skip(missing);
      const id = adopted!.sandboxID;
      const gone = await moat.api.call('DELETE', `/sandboxes/${id}`);
      expect(gone.status, gone.text).toBe(204);
      adopted = undefined;
      const links = execFileSync('/usr/sbin/ip', ['-n', vm.name, '-br', 'link'], {
        encoding: 'utf8',
      });
      expect(links).toContain(TAP.name);
      expect(links).not.toMatch(/^moat0/m);
      const tables = execFileSync(
        '/usr/sbin/ip',
        ['netns', 'exec', vm.name, 'nft', 'list', 'tables'],
        {
          encoding: 'utf8',
        },
      );
      expect(tables).not.toContain('moat');
      const after = await moat.api.call('GET', `/sandboxes/${id}`);
      expect(after.status, after.text).toBe(404);
    });
  });
});

/** The address of an `ip:port` (Moat's `egress.dns`). */
const hostOf = (hostPort: string) => hostPort.replace(/:\d+$/, '');
