/**
 * A namespaced `moat serve` child through a crash and a clean stop: SIGKILL leaves its
 * namespaces, links, table and gateway address behind; the next start removes them and makes
 * the namespace of the sandbox it restores again; killing that sandbox and stopping with
 * SIGTERM leaves nothing (`ip netns list`, `ip link`, `nft list tables`, `ip addr show lo`);
 * nor does Ctrl-C (SIGINT to the whole process group), which no helper of Moat's may take for
 * itself: no Python traceback, no warning.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { API_KEY, ApiClient } from '../support/api-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { hostNetworkLines, namespaceSkipReason } from '../support/netns.js';
import { ServeChild } from '../support/serve-child.js';

const skip = namespaceSkipReason('test/netns/lifecycle');
const POOL = '10.217.0.0/24';
const GATEWAY = '10.217.0.1';

describe.skipIf(skip !== undefined)('a namespaced Moat crashing, restarting and stopping', () => {
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-netns-'));
  afterAll(async () => {
    await ServeChild.killAll();
    rmSync(scratch, { recursive: true, force: true });
  });

  /** What the Moat whose host table is new since `tablesBefore` holds on the host. */
  const heldSince = (tablesBefore: string[]) => {
    const scope = hostNetworkLines('')
      .tables.filter((t) => !tablesBefore.includes(t))
      .map((t) => /moat_([0-9a-f]{6})/.exec(t)?.[1])
      .find((s) => s !== undefined);
    expect(scope, 'the host table of this Moat').toBeDefined();
    return () => hostNetworkLines(scope!, GATEWAY);
  };

  it('reconciles what a crash left and leaves nothing after a clean stop', async () => {
    const upstream = await new FakeDns(new Map()).start();
    const args = [
      ...['--data-dir', path.join(scratch, 'data'), '--enforcement', 'namespace'],
      ...['--namespace-pool', POOL, '--api-keys', API_KEY],
      ...['--api-listen', '127.0.0.1:0', '--sandbox-listen', '127.0.0.1:0'],
      ...['--dns-listen', '127.0.0.1:0', '--proxy-listen', '127.0.0.1:0'],
      ...['--transparent-listen', 'off', '--dns-upstream', `127.0.0.1:${upstream.port}`],
    ];
    const tablesBefore = hostNetworkLines('').tables;
    const first = new ServeChild(args);
    const at = await first.started();
    expect(first.stderr).toMatch(/^moat: enforcement +namespace \(/m);
    const held = heldSince(tablesBefore);

    // A second Moat on the same pool, or on one that overlaps it, refuses to start.
    for (const [pool, refusal] of [
      [POOL, /namespace pool 10\.217\.0\.0\/24 is in use by another Moat \(process \d+\)/],
      [
        '10.217.0.128/25',
        /namespace pool 10\.217\.0\.128\/25 overlaps 10\.217\.0\.0\/24, held by process \d+/,
      ],
    ] as const) {
      const other = new ServeChild([
        ...args.map((a) =>
          a === POOL ? pool : a === path.join(scratch, 'data') ? path.join(scratch, 'other') : a,
        ),
      ]);
      expect(await other.exited).toMatchObject({ code: 1 });
      expect(other.stderr).toMatch(refusal);
    }
    expect(held().gateway).toHaveLength(1);

    const api = new ApiClient(`http://${at.api}`);
    const created = await api.call('POST', '/sandboxes', {
      body: { templateID: 'base', timeout: 600 },
    });
    expect(created.status, created.text).toBe(201);
    const id = (created.body as { sandboxID: string }).sandboxID;
    const crashed = held();
    expect(crashed.namespaces).toHaveLength(1);
    expect(crashed.links).toHaveLength(1);
    expect(crashed.tables).toHaveLength(1);
    expect(crashed.gateway).toHaveLength(1);

    await first.kill(); // SIGKILL: nothing of Moat's own clean-up runs
    expect(held()).toEqual(crashed);

    const second = new ServeChild(args);
    const again = await second.started();
    // The restored sandbox has a fresh namespace; nothing else of the crashed run is left.
    expect(held()).toMatchObject({
      namespaces: [expect.any(String)],
      links: [expect.any(String)],
      tables: [expect.any(String)],
      gateway: [expect.any(String)],
    });
    const api2 = new ApiClient(`http://${again.api}`);
    expect((await api2.call('DELETE', `/sandboxes/${id}`)).status).toBe(204);
    expect(held()).toMatchObject({ namespaces: [], links: [] });
    expect(await second.stop('SIGTERM')).toEqual({ code: 0, signal: null });
    expect(held()).toEqual({ namespaces: [], links: [], tables: [], gateway: [] });
    await upstream.stop();
  }, 60_000);

  it('stops cleanly on Ctrl-C (SIGINT to its whole process group) with a sandbox running', async () => {
    const upstream = await new FakeDns(new Map()).start();
    const tablesBefore = hostNetworkLines('').tables;
    const moat = new ServeChild([
      ...['--data-dir', path.join(scratch, 'interrupted'), '--enforcement', 'namespace'],
      ...['--namespace-pool', POOL, '--api-keys', API_KEY],
      ...['--api-listen', '127.0.0.1:0', '--sandbox-listen', '127.0.0.1:0'],
      ...['--dns-listen', '127.0.0.1:0', '--proxy-listen', '127.0.0.1:0'],
      ...['--transparent-listen', 'off', '--dns-upstream', `127.0.0.1:${upstream.port}`],
    ]);
    const at = await moat.started();
    const held = heldSince(tablesBefore);
    const api = new ApiClient(`http://${at.api}`);
    const created = await api.call('POST', '/sandboxes', {
      body: { templateID: 'base', timeout: 600 },
    });
    expect(created.status, created.text).toBe(201);
    // What a namespaced sandbox brings: its nft session and the direct-flow reader (Python).
    expect(held().namespaces).toHaveLength(1);
    const logged = moat.logLines().length;
    expect(await moat.interrupt()).toEqual({ code: 0, signal: null });
    const lines = moat.logLines().slice(logged);
    expect(lines.find((l) => l.msg === 'moat stopping')).toMatchObject({ signal: 'SIGINT' });
    const warned = lines.filter((l) => (l.level as number) >= 40);
    expect(warned, moat.output()).toEqual([]);
    expect(moat.output()).not.toMatch(/Traceback|KeyboardInterrupt/);
    expect(held()).toEqual({ namespaces: [], links: [], tables: [], gateway: [] });
    await upstream.stop();
  }, 60_000);
});
