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

const fetch = (url: string, seconds: number) => `timeout ${seconds} wget -q -O - ${url}`;

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
    inWorld('route', 'add', `${TAP.router.replace(/\.1$/, '.0')}/${TAP.prefix}`, 'via', SIDE.vm);
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
        { name: 'allowed', command: fetch(`http://${ALLOWED_IP}/`, 10) },
        { name: 'echo', command: `echo ping | timeout 5 nc ${DENIED_IP} ${WORLD_PORTS.echo}` },
      ]);
      expect(booted.results.get('allowed')!.out).toContain(`world http host=${ALLOWED_IP}`);
      expect(booted.results.get('echo')!.out).toContain('ping');
      expect(world.seen('http').map((e) => e.from)).toContain(TAP.guest);
    } finally {
      vm.ip('route', 'delete', 'default');
    }
  }, 60_000);
});
