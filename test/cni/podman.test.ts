/**
 * A Podman container on the network "moat" is held by Moat as any sandbox is. Moat serves in a
 * namespace playing the host (test/support/host-moat.ts), with a world of origins and an
 * upstream resolver linked to it; Podman (CNI backend, runc, the plugin and conflist of
 * `moat cni install --policy`) runs in that namespace too, so its plugin reaches Moat's API
 * on loopback as on a real host. The container resolves an allowed name and fetches from it,
 * is refused a denied name and a denied address (directly and on 80 and 443), reaches neither
 * the host nor Moat's API, shows in GET /flows; a PUT network changes what it reaches at once;
 * `podman rm` detaches it, leaving no link, rule, handle or record of it.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { API_KEY } from '../support/api-client.js';
import { type HostMoat, startHostMoat } from '../support/host-moat.js';
import { hostNetworkLines, namespaceSkipReason, poolScope } from '../support/netns.js';
import { HostWorld, SEEN_PORTS } from './host-world.js';
import { IMAGE, Podman, podmanSkipReason } from './podman.js';
import { type InstalledPlugin, installPlugin } from './plugin-run.js';

const SUITE = 'test/cni/podman';
const skip = namespaceSkipReason(SUITE) ?? podmanSkipReason(SUITE);

const HOST = '198.18.32.1';
const POOL = '10.232.0.0/24';
const WORLD = '198.19.32';
const [ALLOWED, DENIED_NAME_ADDRESS, DENIED] = [`${WORLD}.2`, `${WORLD}.3`, `${WORLD}.4`];
const HOST_PORT = 8099;
const POLICY = { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] };

interface Link {
  netns: string;
  ifname: string;
  address: string;
  router: string;
}

describe.skipIf(skip !== undefined)('a Podman container on the CNI network "moat"', () => {
  let harness: HostMoat;
  let world: HostWorld;
  let plugin: InstalledPlugin;
  let podman: Podman;
  let container: string;
  let sandboxID: string;
  let link: Link;
  /** What the host namespace held before the container: its links, rules and handles. */
  let before: { links: string[]; handles: string[] };
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-cni-podman-'));

  const inHost = (...command: string[]) =>
    execFileSync('/usr/bin/nsenter', [`--net=/run/netns/${harness.host.name}`, '--', ...command], {
      encoding: 'utf8',
    });
  const hostLinks = () =>
    inHost('/usr/sbin/ip', '-o', 'link', 'show')
      .split('\n')
      .map((line) => line.split(':')[1]?.trim().split('@')[0] ?? '')
      .filter((name) => name !== '')
      .sort();
  /** This Moat's namespace handles (a suite running beside this one may make its own). */
  const moatHandles = () =>
    hostNetworkLines(poolScope(POOL)).namespaces.map((line) => line.split(' ')[0]!);

  /** A shell line in the container: its exit status and output. */
  const sh = (script: string) => {
    const ran = podman.run(['exec', container, '/bin/sh', '-c', script]);
    return { status: ran.status, out: ran.stdout, err: ran.stderr };
  };
  /** Whether a TCP echo at address:7000 answers from the container. */
  const echoes = (address: string) =>
    sh(`echo ping | timeout 5 nc ${address} 7000`).out.includes('ping');
  /**
   * Whether a connection from the container to address:port reaches the origin there, counted
   * at the origin (Moat may accept it first: web ports are redirected to its listeners).
   */
  const reaches = (address: string, port: 80 | 443) => {
    const before = world.connectionsTo(address, port);
    sh(`printf 'x\\n' | timeout 5 nc ${address} ${port} >/dev/null`);
    return world.connectionsTo(address, port) > before;
  };
  const fetches = (url: string) => sh(`timeout 8 wget -q -O- ${url}`);

  beforeAll(async () => {
    harness = await startHostMoat('cni', HOST, POOL, []);
    world = await HostWorld.create(harness.host.name, `cni${process.pid}`.slice(0, 10), WORLD, {
      'allowed.test': ALLOWED,
      'denied.test': DENIED_NAME_ADDRESS,
    });
    await harness.host.serve([HOST_PORT]);
    const policy = path.join(scratch, 'policy.json');
    writeFileSync(policy, JSON.stringify({ description: 'the Podman test', ...POLICY }));
    plugin = await installPlugin('http://127.0.0.1:3000', API_KEY, ['--policy', policy]);
    podman = Podman.create(plugin.binDir, plugin.confDir, harness.host.name);
    const imported = podman.importImage();
    expect(imported.status, imported.stderr).toBe(0);
    before = { links: hostLinks(), handles: moatHandles() };
    const started = podman.run([
      'run',
      '-d',
      '--name',
      'held',
      '--network',
      'moat',
      IMAGE,
      '/bin/sleep',
      '600',
    ]);
    expect(started.status, started.stderr).toBe(0);
    container = started.stdout.trim();
    const found = await harness.api.get(
      `/sandboxes?metadata=${encodeURIComponent(`cniContainerID=${container}`)}`,
    );
    expect(found.status, found.text).toBe(200);
    const ids = (found.body as Array<{ sandboxID: string }>).map((s) => s.sandboxID);
    expect(ids).toHaveLength(1);
    sandboxID = ids[0]!;
    link = ((await harness.api.get(`/sandboxes/${sandboxID}`)).body as { link: Link }).link;
  }, 180_000);

  afterAll(async () => {
    podman?.remove();
    world?.close();
    await harness?.stop();
    plugin?.remove();
    rmSync(scratch, { recursive: true, force: true });
  }, 60_000);

  it('is a network-only sandbox on the interface Podman named, in the namespace Podman made', async () => {
    const detail = (await harness.api.get(`/sandboxes/${sandboxID}`)).body as {
      templateID: string;
      metadata: Record<string, string>;
      network: { allowOut: string[]; denyOut: string[] };
    };
    expect(detail.templateID).toBe('network-only');
    expect(detail.metadata).toEqual({ cniContainerID: container });
    expect(detail.network).toMatchObject(POLICY);
    expect(link.ifname).toBe('eth0');
    const sandboxKey = podman.run([
      'inspect',
      '--format',
      '{{.NetworkSettings.SandboxKey}}',
      container,
    ]);
    expect(link.netns).toBe(sandboxKey.stdout.trim());
    const inside = sh('ip -o -4 addr show dev eth0; ip route');
    expect(inside.out).toContain(link.address);
    expect(inside.out).toContain(`default via ${link.router}`);
  });

  it('answers CHECK for it, and refuses a second ADD of its namespace, changing nothing', async () => {
    // The plugin run directly, reaching Moat's API through the test's forwarder.
    const conf = plugin.conf({ api: harness.api.base });
    const env = { CNI_CONTAINERID: container, CNI_NETNS: link.netns, CNI_IFNAME: 'eth0' };
    const checked = await plugin.run({ ...env, CNI_COMMAND: 'CHECK' }, conf);
    expect({ code: checked.code, stdout: checked.stdout }).toEqual({ code: 0, stdout: '' });
    const before = (await harness.api.get('/sandboxes')).body;
    const again = await plugin.run(
      { ...env, CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'another', CNI_IFNAME: 'eth1' },
      conf,
    );
    expect(again.code).not.toBe(0);
    expect(again.json).toMatchObject({ code: 100, msg: expect.stringContaining(sandboxID) });
    expect((await harness.api.get('/sandboxes')).body).toEqual(before);
  });

  it('resolves an allowed name and fetches from its origin', () => {
    expect(sh('nslookup allowed.test').out).toContain(ALLOWED);
    const fetched = fetches('http://allowed.test/');
    expect(fetched.out, fetched.err).toContain('world http host=allowed.test');
  });

  it('is refused a denied name, and a denied address directly and on 80 and 443', () => {
    const lookup = sh('nslookup denied.test');
    expect(lookup.out).not.toContain(DENIED_NAME_ADDRESS);
    expect(echoes(DENIED)).toBe(false);
    expect(fetches(`http://${DENIED}/`).status).not.toBe(0);
    expect(reaches(DENIED, 80)).toBe(false);
    expect(reaches(DENIED, 443)).toBe(false);
    for (const port of SEEN_PORTS)
      expect(world.connectionsTo(DENIED, port), `port ${port}`).toBe(0);
  });

  it("reaches neither the host nor Moat's API", () => {
    const urls = [HOST, link.router, `${WORLD}.1`].flatMap((address) => [
      `http://${address}:${HOST_PORT}/`,
      `http://${address}:3000/health`,
    ]);
    // All at once: each silent drop costs the whole timeout.
    const ran = sh(
      `${urls.map((url) => `(timeout 8 wget -q -O- ${url} >/dev/null 2>&1; echo "${url} $?") &`).join(' ')} wait`,
    );
    const statuses = new Map(
      ran.out
        .trim()
        .split('\n')
        .map((line) => [line.split(' ')[0], line.split(' ')[1]] as const),
    );
    expect([...statuses.keys()].sort(), ran.err).toEqual([...urls].sort());
    for (const url of urls) expect(statuses.get(url), url).not.toBe('0');
    expect(harness.host.served).toEqual([]);
  });

  it('shows its flows in GET /flows', async () => {
    const flows = await harness.api.get(`/flows?sandboxID=${sandboxID}`);
    expect(flows.status, flows.text).toBe(200);
    const records = flows.body as Array<{ verdict: string; destination: { name: string | null } }>;
    const seen = records.map((r) => `${r.verdict} ${r.destination.name}`);
    expect(seen).toContain('allow allowed.test');
    expect(seen).toContain('deny denied.test');
  });

  it('reaches what a PUT network opens at once', async () => {
    expect(echoes(DENIED)).toBe(false);
    const put = await harness.api.put(`/sandboxes/${sandboxID}/network`, {
      allowOut: [...POLICY.allowOut, DENIED],
      denyOut: POLICY.denyOut,
    });
    expect(put.status, put.text).toBe(204);
    expect(echoes(DENIED)).toBe(true);
    expect(reaches(DENIED, 443)).toBe(true);
  });

  it('is detached by podman rm: no link, rule, handle or record of it is left', async () => {
    const removed = podman.run(['rm', '--force', '--time', '0', container]);
    expect(removed.status, removed.stderr).toBe(0);
    expect((await harness.api.get(`/sandboxes/${sandboxID}`)).status).toBe(404);
    const found = await harness.api.get(
      `/sandboxes?metadata=${encodeURIComponent(`cniContainerID=${container}`)}`,
    );
    expect(found.body).toEqual([]);
    expect(hostLinks()).toEqual(before.links);
    expect(moatHandles()).toEqual(before.handles);
    const address = link.address.split('/')[0]!;
    expect(inHost('/usr/sbin/nft', 'list', 'ruleset')).not.toContain(address);
    expect(inHost('/usr/sbin/ip', '-o', 'addr', 'show')).not.toContain(link.router);
  });
});
