/**
 * One sandbox cannot starve its neighbours: while a hostile sandbox floods each shared resource
 * in turn (connections to Moat's proxy in every state, new connections a second, inotify
 * instances, ptys, proxied requests and new intercepted names as fast as it can, its own file
 * agent stopped), a second sandbox's proxy request, DNS query, `commands.run`,
 * `files.watchDir` and `pty.create`, and Moat's `/health`, each answer within 1 s. Sandboxes in their own namespaces, made by a Moat in this process; the origin is
 * in a namespace of this test's own.
 */
import { execFileSync } from 'node:child_process';
import type { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { World } from '../../bench/lib/world.js';
import type { ZoneEntry } from '../support/fake-dns.js';
import { type FloodKind, floodCommand } from '../support/floods.js';
import { until } from '../support/native-relay.js';
import { namespaceSkipReason } from '../support/netns.js';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

const skip = namespaceSkipReason('test/netns/neighbours');

const PREFIX = '198.18.34';
const POOL = '10.224.34.0/24';
const FLOOD_SECONDS = 5;
const AGENT_DEADLINE_MS = 2000;
/**
 * Moat runs in this process: its open files are held to what a host's service limit might be,
 * so a flood of connections reaches the limit within the flood's time when nothing budgets them.
 */
const OPEN_FILES = 4096;

/** Sets this process's soft open-file limit: the one that refuses, and raising it back is always allowed. */
const limitOpenFiles = (limit: string) =>
  execFileSync('/usr/bin/prlimit', ['--pid', String(process.pid), `--nofile=${limit}`]);

/** Milliseconds `work` took; fails the test when it threw. */
async function timed(work: () => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await work();
  return performance.now() - started;
}

describe.skipIf(skip !== undefined)('a flooding sandbox and its neighbour', () => {
  let world: World;
  let harness: SdkMoat;
  let attacker: Sandbox;
  let neighbour: Sandbox;

  let openFilesBefore: string;

  beforeAll(async () => {
    openFilesBefore = execFileSync('/usr/bin/prlimit', [
      '--pid',
      String(process.pid),
      '--nofile',
      '--noheadings',
      '--output=SOFT',
    ])
      .toString()
      .trim();
    limitOpenFiles(`${OPEN_FILES}:`);
    world = await World.create('nbr', PREFIX);
    const zone = new Map<string, ZoneEntry>([
      ['origin.test', { A: [world.origins[0]!], ttl: 300 }],
    ]);
    harness = await startSdkMoat({
      zone,
      flags: {
        enforcement: 'namespace',
        'namespace-pool': POOL,
        // The world's addresses are special-use ones; only link-local stays internal here.
        'internal-deny': '169.254.0.0/16',
        // A sandbox gets one of the machine's two cores, so CPU alone cannot starve Moat.
        'sandbox-cpus': '1',
        'sandbox-agent-deadline-ms': String(AGENT_DEADLINE_MS),
      },
    });
    // Every name under wild.test is the world's origin, and a header rule covers them all,
    // so each new name the attacker asks for is a leaf for Moat to mint.
    for (let n = 1; n <= 20_000; n++)
      zone.set(`n${n}.wild.test`, { A: [world.origins[1]!], ttl: 300 });
    const network = { denyOut: ['0.0.0.0/0'], allowOut: ['origin.test'] };
    [attacker, neighbour] = await Promise.all([
      harness.sandbox({
        network: {
          ...network,
          allowOut: [...network.allowOut, '*.wild.test'],
          rules: { '*.wild.test': [{ transform: { headers: { 'X-Team': 'moat' } } }] },
        },
      }),
      harness.sandbox({ network }),
    ]);
  }, 120_000);

  afterAll(async () => {
    await harness?.stop();
    await world?.close();
    // The flood's sockets may still be closing: retry while this process has no file to spare.
    for (let attempt = 0; openFilesBefore !== undefined && attempt < 50; attempt++) {
      try {
        limitOpenFiles(`${openFilesBefore}:`);
        break;
      } catch {
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
  });

  /** Each of the neighbour's calls, and Moat's /health, answers within 1 s. */
  async function neighbourAnswers(during: FloodKind): Promise<void> {
    const health = `http://127.0.0.1:${harness.moat.listening.api.port}/health`;
    const took: Record<string, number> = {};
    took['/health'] = await timed(async () => {
      expect((await fetch(health, { signal: AbortSignal.timeout(5000) })).status).toBe(200);
    });
    took['commands.run'] = await timed(() => neighbour.commands.run('true'));
    // Timed inside the sandbox: the request and the query alone, not the command around them.
    const inside = await neighbour.commands.run(
      `curl -sS -o /dev/null -w '%{http_code} %{time_total}\\n' --max-time 5 http://origin.test/; ` +
        `python3 -c 'import socket, time; t = time.monotonic(); ` +
        `socket.getaddrinfo("origin.test", 80); print("dns", time.monotonic() - t)'`,
      { timeoutMs: 15_000 },
    );
    const [proxied, dns] = inside.stdout.trim().split('\n');
    expect(proxied?.split(' ')[0], `${during}: the proxied request`).toBe('200');
    took['proxy request'] = Number(proxied!.split(' ')[1]) * 1000;
    took['DNS query'] = Number(dns!.split(' ')[1]) * 1000;
    took['files.watchDir'] = await timed(async () => {
      const handle = await neighbour.files.watchDir('/home/user', () => undefined);
      await handle.stop();
    });
    took['pty.create'] = await timed(async () => {
      const terminal = await neighbour.pty.create({ cols: 80, rows: 24, onData: () => undefined });
      await neighbour.pty.kill(terminal.pid);
    });
    console.log(
      `while the other sandbox floods ${during}: ` +
        Object.entries(took)
          .map(([call, ms]) => `${call} ${ms.toFixed(0)} ms`)
          .join(', '),
    );
    for (const [call, ms] of Object.entries(took)) {
      expect(ms, `${call} while the other sandbox floods ${during}`).toBeLessThan(1000);
    }
  }

  /** Starts a flood in the attacker, waits until it holds something, runs `check`, ends it. */
  async function whileFlooding(kind: FloodKind, check: () => Promise<void>): Promise<string> {
    let printed = '';
    const flood = await attacker.commands.run(floodCommand(kind, FLOOD_SECONDS), {
      background: true,
      timeoutMs: 30_000,
      onStdout: (data: string) => void (printed += data),
    });
    try {
      await until(() => printed.includes('flooding'), 10_000);
      expect(printed, `the ${kind} flood did not start`).toContain('flooding');
      // Let it take what it can before the neighbour asks.
      await new Promise((resolve) => setTimeout(resolve, 1500));
      await check();
    } finally {
      await flood.wait().catch(() => undefined);
    }
    console.log(`the ${kind} flood: ${printed.trim().split('\n').at(-1)}`);
    return printed;
  }

  for (const kind of [
    'idle-connections',
    'keepalive-after-403',
    'connection-churn',
    'inotify',
    'ptys',
    'proxied-requests',
    'intercepted-names',
    'stopped-agent',
  ] as const) {
    it(`the neighbour is answered within 1 s while the other floods ${kind}`, async () => {
      // The attacker's file agent runs from its first file call on.
      if (kind === 'stopped-agent') await attacker.files.list('/home/user');
      const printed = await whileFlooding(kind, async () => {
        await neighbourAnswers(kind);
        if (kind !== 'stopped-agent') return;
        // The stopped agent's own sandbox gets an error within the deadline, never a hang.
        const took = await timed(() =>
          expect(attacker.files.list('/home/user')).rejects.toThrow(/deadline|progress/),
        );
        expect(took).toBeLessThan(AGENT_DEADLINE_MS * 3);
      });
      if (kind === 'stopped-agent') expect(printed).toMatch(/took [1-9]/);
    }, 60_000);
  }
});
