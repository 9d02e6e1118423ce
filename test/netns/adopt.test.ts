/**
 * Network-only sandboxes, end to end: a `moat serve` in namespace mode adopts network namespaces
 * this test makes (each playing a VM's: `ip netns add`, a veth pair of its own inside standing
 * for the runtime's devices). Every probe runs INSIDE the adopted namespace as nobody
 * (`ip netns exec <ns> setpriv --reuid=65534 ...`), never as Moat: the link is there with its
 * address and default route, DNS goes to the interceptor whatever resolver is asked, an
 * allowed name and address are reached and denied ones refused, the host and Moat's API are
 * not; the flow log shows it; PUT network changes it live; DELETE leaves the namespace and the
 * test's devices with nothing of Moat's. A namespace deleted behind Moat's back is detached
 * within seconds, an expiry detaches, a restart re-adopts what is still there (with its policy)
 * and detaches what is gone. A hostile API client gets a 400 naming why for every namespace it
 * may not have (none, a file, a directory, another kind, Moat's own, the host's, another
 * sandbox's, one adopted already) and every bad ifname, and nothing changes.
 */
import { execFile, execFileSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World } from '../../bench/lib/world.js';
import { API_KEY, ApiClient } from '../support/api-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { GuestBehind } from '../support/guest-behind.js';
import { hostNetworkLines, namespaceSkipReason, poolScope } from '../support/netns.js';
import { ServeChild } from '../support/serve-child.js';

const skip = namespaceSkipReason('test/netns/adopt');

const POOL = '10.232.0.0/24';
const GATEWAY = '10.232.0.1';
const PREFIX = '10.252.32';
const SCOPE = poolScope(POOL);
/** A resolver address no one has: only the interceptor can answer what is sent to it. */
const NOBODYS_RESOLVER = '198.18.99.53';
const IP = '/usr/sbin/ip';
const NFT = '/usr/sbin/nft';

/** Runs inside the adopted namespace as nobody: `dns <name>`, `tcp <host> <port>`, `http <name>`. */
const PROBE = `
const [mode, target, port] = process.argv.slice(1);
const done = (text) => { console.log(text); process.exit(0); };
setTimeout(() => done('timeout'), 3000);
const resolver = new (require('node:dns').promises.Resolver)({ timeout: 2000, tries: 1 });
resolver.setServers(['${NOBODYS_RESOLVER}']);
const tcp = (host, port, then) => {
  const socket = require('node:net').connect({ host, port: Number(port) });
  socket.on('connect', () => then(socket));
  socket.on('error', (error) => done(error.code));
};
if (mode === 'dns') resolver.resolve4(target).then((a) => done(a.join(',')), (e) => done(e.code));
if (mode === 'tcp') tcp(target, port, () => done('open'));
if (mode === 'http')
  resolver.resolve4(target).then(([address]) => tcp(address, 80, (socket) => {
    socket.write('GET / HTTP/1.1\\r\\nHost: ' + target + '\\r\\nConnection: close\\r\\n\\r\\n');
    let text = '';
    socket.on('data', (chunk) => (text += chunk));
    socket.on('end', () => done(text.split('\\r\\n')[0]));
  }), (e) => done(e.code));
`;

/** A probe in namespace `ns` as nobody; its one line of output. */
function probe(ns: string, ...args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(
      IP,
      [
        ...['netns', 'exec', ns, '/usr/bin/setpriv', '--reuid=65534', '--regid=65534'],
        ...['--clear-groups', process.execPath, '-e', PROBE, ...args],
      ],
      { timeout: 10_000, encoding: 'utf8' },
      (error, out, err) =>
        error ? reject(new Error(`${error.message}: ${err}`)) : resolve(out.trim()),
    );
  });
}

const inNs = (ns: string, ...args: string[]) =>
  execFileSync(IP, ['netns', 'exec', ns, ...args], { encoding: 'utf8' });

/** What a namespace holds that Moat might change: interfaces, addresses, routes, nft tables. */
const stateOf = (ns: string) => ({
  links: inNs(ns, IP, '-br', 'link').replace(/\s+/g, ' '),
  addresses: inNs(ns, IP, '-br', 'addr'),
  routes: inNs(ns, IP, 'route'),
  tables: inNs(ns, NFT, 'list', 'tables'),
});

/** A namespace playing a VM's, with a veth pair of its own (its runtime's devices). */
function makeNamespace(name: string): string {
  try {
    execFileSync(IP, ['netns', 'delete', name], { stdio: 'ignore' });
  } catch {
    // Not left by an earlier run.
  }
  execFileSync(IP, ['netns', 'add', name]);
  execFileSync(IP, ['-n', name, 'link', 'add', 'd0', 'type', 'veth', 'peer', 'name', 'd1']);
  return `/run/netns/${name}`;
}

const removeNamespace = (name: string) => {
  try {
    execFileSync(IP, ['netns', 'delete', name], { stdio: 'ignore' });
  } catch {
    // Already gone.
  }
};

/** Polls `check` every 100 ms until it holds or `ms` pass; how long it took. */
async function within(ms: number, check: () => Promise<boolean>): Promise<number> {
  const start = Date.now();
  while (Date.now() - start < ms) {
    if (await check()) return Date.now() - start;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`not within ${ms} ms`);
}

interface Adopted {
  sandboxID: string;
  endAt?: string;
  egress: { address: string; gateway: string; dns: string; proxyUrl: string };
  link: { netns: string; ifname: string; address: string; router: string };
}

describe.skipIf(skip !== undefined)('network-only sandboxes (adopted namespaces)', () => {
  const tag = `ad${process.pid}`;
  const names = ['vm', 'gone', 'stay', 'lost', 'bad', 'rd'].map((n) => `moat-t-${tag}-${n}`);
  const [VM, GONE, STAY, LOST, BAD, REDIRECT] = names as [
    string,
    string,
    string,
    string,
    string,
    string,
  ];
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-adopt-'));
  let world: World;
  let upstream: FakeDns;
  let moat: ServeChild;
  let api: ApiClient;
  let args: string[];
  let apiPort: number;
  let sandboxListener: string;

  const start = async () => {
    moat = new ServeChild(args);
    const at = await moat.started();
    apiPort = Number(at.api.split(':').pop());
    sandboxListener = at.sandbox;
    api = new ApiClient(`http://${at.api}`);
    return at;
  };
  const adopt = (body: Record<string, unknown>) =>
    api.call('POST', '/sandboxes', { body: { templateID: 'network-only', ...body } });
  const policy = { allowOut: ['origin.test', `${PREFIX}.3`], denyOut: ['0.0.0.0/0'] };

  beforeAll(async () => {
    world = await World.create('adopt', PREFIX);
    upstream = await new FakeDns(
      new Map([
        ['origin.test', { A: [world.origins[0]!], ttl: 300 }],
        ['denied.test', { A: [world.origins[2]!], ttl: 300 }],
      ]),
    ).start();
    args = [
      ...['--data-dir', path.join(scratch, 'data'), '--enforcement', 'namespace'],
      ...['--namespace-pool', POOL, '--api-keys', API_KEY, '--internal-deny', '169.254.0.0/16'],
      // Moat's API on an address of the host the namespaces could route to, were it not refused.
      ...['--api-listen', `${world.hostAddress}:0`, '--sandbox-listen', '127.0.0.1:0'],
      ...['--dns-listen', '127.0.0.1:0', '--proxy-listen', '127.0.0.1:0'],
      ...['--transparent-listen', 'off', '--dns-upstream', `127.0.0.1:${upstream.port}`],
    ];
    await start();
  }, 60_000);

  afterAll(async () => {
    // A clean stop first: it unmounts the disk of a sandbox a failed test may have left.
    await moat?.stop('SIGTERM').catch(() => undefined);
    await ServeChild.killAll();
    for (const name of names) removeNamespace(name);
    await world?.close();
    await upstream?.stop();
    rmSync(scratch, { recursive: true, force: true });
  });

  it('holds an adopted namespace to its policy, live, and leaves it intact on DELETE', async () => {
    const netns = makeNamespace(VM);
    const before = stateOf(VM);
    const created = await adopt({ netns, network: policy, metadata: { vm: 'one' } });
    expect(created.status, created.text).toBe(201);
    const sandbox = created.body as Adopted;
    const id = sandbox.sandboxID;
    expect(sandbox.link).toMatchObject({ netns, ifname: 'moat0' });
    expect(sandbox.link.address).toMatch(/^10\.232\.0\.\d+\/30$/);
    const address = sandbox.link.address.split('/')[0]!;
    expect(sandbox.egress).toMatchObject({ address, gateway: GATEWAY, dns: `${GATEWAY}:53` });

    const got = await api.call('GET', `/sandboxes/${id}`);
    expect(got.status).toBe(200);
    const detail = got.body as Adopted & { templateID: string; endAt: string };
    expect(detail).toMatchObject({ templateID: 'network-only', link: sandbox.link });
    // No timeout given: no expiry (never E2B's 15 s default).
    expect(detail.endAt).toBe('9999-12-31T23:59:59.999Z');

    // The link, its address and the default route, seen from inside.
    expect(inNs(VM, IP, '-br', 'addr', 'show', 'moat0')).toContain(sandbox.link.address);
    expect(inNs(VM, IP, 'route', 'show', 'default')).toContain(
      `default via ${sandbox.link.router} dev moat0`,
    );
    expect(stateOf(VM).links).toContain('d0@d1');

    // DNS to any resolver is the interceptor's: allowed and denied names.
    expect(await probe(VM, 'dns', 'origin.test')).toBe(world.origins[0]);
    expect(await probe(VM, 'dns', 'denied.test')).not.toBe(world.origins[2]);
    expect(await probe(VM, 'http', 'origin.test')).toMatch(/^HTTP\/1\.1 200/);
    // Direct TCP: the allowed address is reached, a denied one is not.
    expect(await probe(VM, 'tcp', world.origins[1]!, '7000')).toBe('open');
    expect(await probe(VM, 'tcp', world.origins[2]!, '7000')).not.toBe('open');
    // The host and Moat's API (on an address of the host) are never reached.
    expect(await probe(VM, 'tcp', world.hostAddress, String(apiPort))).not.toBe('open');
    expect(await probe(VM, 'tcp', sandbox.link.router, String(apiPort))).not.toBe('open');
    expect(await probe(VM, 'tcp', GATEWAY, String(apiPort))).not.toBe('open');

    const flows = await api.call('GET', `/flows?sandboxID=${id}&limit=1000`);
    expect(flows.status).toBe(200);
    expect(flows.text).toContain('origin.test');
    expect(flows.text).toContain(world.origins[2]);

    // A publish changes it live.
    const put = await api.call('PUT', `/sandboxes/${id}/network`, {
      body: { ...policy, allowOut: [...policy.allowOut, world.origins[2]!] },
    });
    expect(put.status, put.text).toBe(204);
    expect(await probe(VM, 'tcp', world.origins[2]!, '7000')).toBe('open');

    // It has no processes or files: the sandbox API and pause/snapshot/fork answer 501.
    const sandboxApi = await fetch(`http://${sandboxListener}/files?path=/etc/hostname`, {
      headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': '49983' },
    });
    expect(sandboxApi.status).toBe(501);
    expect(await sandboxApi.text()).toContain(
      `sandbox ${id} runs the template network-only: it has no processes or files`,
    );
    // Nor ingress: what listens in the namespace is the runtime's, never published by Moat.
    const listening = spawn(
      '/usr/sbin/ip',
      ['netns', 'exec', VM, 'python3', '-m', 'http.server', '8089', '--bind', '0.0.0.0'],
      { stdio: 'ignore' },
    );
    try {
      await new Promise((resolve) => setTimeout(resolve, 1000));
      const ingress = await fetch(`http://${sandboxListener}/`, {
        headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': '8089' },
      });
      expect(ingress.status).not.toBe(200);
      expect(await ingress.text()).toContain('listens on port 8089');
    } finally {
      listening.kill('SIGKILL');
    }
    for (const [url, body] of [
      [`/sandboxes/${id}/pause`, {}],
      [`/sandboxes/${id}/snapshots`, {}],
      [`/sandboxes/${id}/fork`, { count: 1 }],
    ] as const) {
      const refused = await api.call('POST', url, { body });
      expect(refused.status, `${url}: ${refused.text}`).toBe(501);
      expect(refused.text).toContain('runs the template network-only');
    }

    // Found by its metadata, like a CNI plugin finds a container's.
    const listed = await api.call('GET', '/sandboxes?metadata=vm%3Done');
    expect((listed.body as Array<{ sandboxID: string }>).map((s) => s.sandboxID)).toEqual([id]);

    expect((await api.call('DELETE', `/sandboxes/${id}`)).status).toBe(204);
    // The namespace and the runtime's devices stay; Moat's link, table and handle go.
    expect(stateOf(VM)).toEqual(before);
    expect(hostNetworkLines(SCOPE).namespaces).toEqual([]);
    expect(hostNetworkLines(SCOPE).links).toEqual([]);
    expect((await api.call('GET', `/sandboxes/${id}`)).status).toBe(404);
    expect((await api.call('DELETE', `/sandboxes/${id}`)).status).toBe(404);
  }, 120_000);

  it('refuses, with a 400 naming why and changing nothing, what a client may not adopt', async () => {
    const netns = makeNamespace(BAD);
    const file = path.join(scratch, 'a-file');
    writeFileSync(file, 'not a namespace');
    mkdirSync(path.join(scratch, 'a-dir'), { recursive: true });
    // One adopted already, and one of Moat's own sandboxes.
    const held = await adopt({ netns: makeNamespace(STAY), network: policy });
    expect(held.status, held.text).toBe(201);
    const heldID = (held.body as Adopted).sandboxID;
    const own = await api.call('POST', '/sandboxes', {
      body: { templateID: 'base', timeout: 120 },
    });
    expect(own.status, own.text).toBe(201);
    const ownID = (own.body as Adopted).sandboxID;
    const handles = hostNetworkLines(SCOPE).namespaces.map((line) => line.split(' ')[0]!);
    expect(handles).toHaveLength(2);

    const before = stateOf(BAD);
    const count = async () => ((await api.call('GET', '/sandboxes')).body as unknown[]).length;
    const sandboxes = await count();
    const cases: Array<[Record<string, unknown>, RegExp]> = [
      [{ netns: '/run/netns/moat-no-such-namespace' }, /does not exist/],
      [{ netns: file }, /is not a network namespace \(it is a regular file\)/],
      [{ netns: path.join(scratch, 'a-dir') }, /is not a network namespace \(it is a directory\)/],
      [{ netns: 'run/netns/relative' }, /is not an absolute path/],
      [{ netns: '/proc/self/ns/mnt' }, /is not a network namespace/],
      [{ netns: '/proc/self/ns/net' }, /Moat's own network namespace/],
      // The host's (the machine's process 1): refused as Moat's own, or as unreadable.
      [{ netns: '/proc/1/ns/net' }, /\/proc\/1\/ns\/net (is Moat's own|cannot be read)/],
      [{ netns: `/run/netns/${STAY}` }, new RegExp(`already adopted by sandbox ${heldID}`)],
      ...handles.map((handle): [Record<string, unknown>, RegExp] => [
        { netns: `/run/netns/${handle}` },
        new RegExp(`already adopted by sandbox ${heldID}|namespace of Moat's sandbox ${ownID}`),
      ]),
      [{}, /needs body\.netns/],
      [{ netns, ifname: '' }, /ifname "" is empty/],
      [{ netns, ifname: 'a-very-long-name' }, /longer than 15 characters/],
      ...['a/b', 'a b', 'a:b', 'a";b', 'é'].map((ifname): [Record<string, unknown>, RegExp] => [
        { netns, ifname },
        /holds a character other than letters, digits/,
      ]),
      [{ netns, ifname: '..' }, /is not a device name/],
      [{ netns, ifname: 'lo' }, /loopback/],
      [{ netns, ifname: 'd0' }, /already has an interface named d0/],
      [{ netns, autoPause: true }, /autoPause is not possible/],
    ];
    for (const [body, why] of cases) {
      const refused = await adopt(body);
      expect(refused.status, `${JSON.stringify(body)}: ${refused.text}`).toBe(400);
      expect((refused.body as { message: string }).message, JSON.stringify(body)).toMatch(why);
    }
    // netns with a template Moat runs.
    const mixed = await api.call('POST', '/sandboxes', { body: { templateID: 'base', netns } });
    expect(mixed.status).toBe(400);
    expect(mixed.text).toMatch(/body\.netns is only for the template network-only/);

    expect(stateOf(BAD)).toEqual(before);
    expect(await count()).toBe(sandboxes);
    expect(hostNetworkLines(SCOPE).namespaces.map((line) => line.split(' ')[0])).toEqual(handles);
    for (const id of [heldID, ownID])
      expect((await api.call('DELETE', `/sandboxes/${id}`)).status).toBe(204);
  }, 120_000);

  it('detaches a namespace deleted behind its back, and one whose timeout passed', async () => {
    const created = await adopt({ netns: makeNamespace(LOST), network: policy });
    expect(created.status, created.text).toBe(201);
    const id = (created.body as Adopted).sandboxID;
    removeNamespace(LOST);
    const took = await within(5000, async () => {
      return (await api.call('GET', `/sandboxes/${id}`)).status === 404;
    });
    console.log(`a deleted namespace was detached in ${took} ms`);
    expect(moat.stdout).toContain(`no longer exists`);
    // Its record goes first, then its link.
    await within(2000, async () => hostNetworkLines(SCOPE).links.length === 0);

    const timed = await adopt({ netns: makeNamespace(LOST), network: policy, timeout: 1 });
    expect(timed.status, timed.text).toBe(201);
    const timedID = (timed.body as Adopted).sandboxID;
    await within(5000, async () => (await api.call('GET', `/sandboxes/${timedID}`)).status === 404);
    // Its record goes first, then its link (as above).
    await within(2000, async () => !stateOf(LOST).links.includes('moat0'));
    expect(stateOf(LOST).tables).toBe('');
  }, 60_000);

  it('keeps a guest tc redirects to its interface held across a restart, and removes its pair on DELETE', async () => {
    const netns = makeNamespace(REDIRECT);
    const created = await adopt({ netns, network: policy, ifname: 'veth0', guestLink: 'redirect' });
    expect(created.status, created.text).toBe(201);
    const { sandboxID, link } = created.body as Adopted;
    expect(link).toMatchObject({ ifname: 'veth0', address: '192.0.0.2/30', router: '192.0.0.1' });
    const guest = GuestBehind.redirected('ad', netns, 'veth0', link.address, link.router);
    try {
      const connect = (address: string) =>
        guest.run(
          `import socket\ntry:\n  socket.create_connection(('${address}', 7000), timeout=3).close(); print('open')\nexcept OSError as e: print(type(e).__name__)`,
        );
      const held = async () => {
        expect((await connect(world.origins[1]!)).out).toBe('open\n');
        expect((await connect(world.origins[2]!)).out).toBe('ConnectionRefusedError\n');
      };
      await held();
      await moat.kill(); // SIGKILL: the restarted Moat sweeps the host's end, and takes the pair over
      await start();
      expect((await api.call('GET', `/sandboxes/${sandboxID}`)).status).toBe(200);
      await held();
      expect((await api.call('DELETE', `/sandboxes/${sandboxID}`)).status).toBe(204);
      expect(inNs(REDIRECT, IP, '-br', 'link')).not.toMatch(/^(veth0|moat-in|moat-up)@/m);
    } finally {
      guest.close();
    }
  }, 120_000);

  it('re-adopts at restart what is still there, with its policy, and detaches what is gone', async () => {
    const stay = await adopt({ netns: `/run/netns/${STAY}`, network: policy, ifname: 'eth7' });
    expect(stay.status, stay.text).toBe(201);
    const stayID = (stay.body as Adopted).sandboxID;
    const gone = await adopt({ netns: makeNamespace(GONE), network: policy });
    expect(gone.status, gone.text).toBe(201);
    const goneID = (gone.body as Adopted).sandboxID;

    await moat.kill(); // SIGKILL: nothing of Moat's own clean-up runs
    removeNamespace(GONE);
    await start();

    expect((await api.call('GET', `/sandboxes/${goneID}`)).status).toBe(404);
    expect(moat.stdout).toMatch(/not adopted again at start-up/);
    const again = await api.call('GET', `/sandboxes/${stayID}`);
    expect(again.status).toBe(200);
    expect((again.body as Adopted).link.ifname).toBe('eth7');
    expect(inNs(STAY, IP, '-br', 'link').match(/^eth7@/gm)).toHaveLength(1);
    expect(await probe(STAY, 'tcp', world.origins[1]!, '7000')).toBe('open');
    expect(await probe(STAY, 'tcp', world.origins[2]!, '7000')).not.toBe('open');
    expect(await probe(STAY, 'http', 'origin.test')).toMatch(/^HTTP\/1\.1 200/);

    // A clean stop takes Moat's link and table out of the namespace, which stays.
    expect(await moat.stop('SIGTERM')).toEqual({ code: 0, signal: null });
    expect(stateOf(STAY).links).not.toContain('eth7');
    expect(stateOf(STAY).tables).toBe('');
    expect(hostNetworkLines(SCOPE, GATEWAY)).toEqual({
      namespaces: [],
      links: [],
      tables: [],
      gateway: [],
    });
  }, 120_000);
});
