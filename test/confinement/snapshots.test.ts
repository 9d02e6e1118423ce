/**
 * Attacker-proofing of snapshots: re-taking a named snapshot is atomic. Before, the old template
 * folder was deleted before the new copy was in place, and a SIGKILL in between left a listed
 * snapshot with part of its files. A real `moat serve` child is killed at several moments of a
 * re-snapshot; after each restart the snapshot is whole: all its files, of one moment or the
 * other.
 */
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { removeMoatFolder } from '../../bench/lib/scratch.js';
import { API_KEY, ApiClient } from '../support/api-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { hostProcesses } from '../support/local-host.js';
import { ServeChild } from '../support/serve-child.js';
import { skipReason } from './runtime-harness.js';

const skip = skipReason('confinement/snapshots');
const FILES = 3000;
const NAME = 'atomic';
const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-snapshots-'));
let upstream: FakeDns;

beforeAll(async () => {
  upstream = await new FakeDns(new Map()).start();
});

afterAll(async () => {
  await ServeChild.killAll();
  await upstream.stop();
  removeMoatFolder(scratch);
});

async function start(): Promise<{ child: ServeChild; api: ApiClient }> {
  const child = new ServeChild([
    ...['--data-dir', path.join(scratch, 'data'), '--enforcement', 'proxy'],
    ...['--api-keys', API_KEY, '--api-listen', '127.0.0.1:0', '--sandbox-listen', '127.0.0.1:0'],
    ...['--dns-listen', '127.0.0.1:0', '--proxy-listen', '127.0.0.1:0'],
    ...['--transparent-listen', 'off', '--dns-upstream', `127.0.0.1:${upstream.port}`],
  ]);
  const at = await child.started(60_000);
  Object.assign(process.env, {
    E2B_API_URL: `http://${at.api}`,
    E2B_SANDBOX_URL: `http://${at.sandbox}`,
    E2B_API_KEY: API_KEY,
    E2B_DOMAIN: 'moat.test',
  });
  return { child, api: new ApiClient(`http://${at.api}`) };
}

/** Files and marker of a sandbox made from the snapshot (then killed again). */
async function snapshotContent(): Promise<{ files: number; marker: string }> {
  const made = await Sandbox.create(NAME, { timeoutMs: 60_000 });
  try {
    const out = await made.commands.run('ls /home/user/tree | wc -l; cat /home/user/tree/marker', {
      timeoutMs: 20_000,
    });
    const [files, marker] = out.stdout.trim().split('\n');
    return { files: Number(files), marker: marker! };
  } finally {
    await made.kill();
  }
}

describe.skipIf(skip)('re-taking a named snapshot', () => {
  it('leaves the old snapshot or the new one whole, whenever Moat is killed', async () => {
    let { child, api } = await start();
    const source = await Sandbox.create({ timeoutMs: 600_000 });
    await source.commands.run(
      `mkdir -p /home/user/tree && cd /home/user/tree && for i in $(seq 1 ${FILES - 1}); do echo $i > f$i; done && echo m0 > marker`,
      { timeoutMs: 60_000 },
    );
    const first = await api.post(`/sandboxes/${source.sandboxId}/snapshots`, { name: NAME });
    expect(first.status, first.text).toBe(201);
    expect(await snapshotContent()).toEqual({ files: FILES, marker: 'm0' });
    let taken = 'm0';
    const outcomes: string[] = [];
    for (const [round, killAfterMs] of [20, 150, 400, 900, 2000].entries()) {
      const marker = `m${round + 1}`;
      const connected = await Sandbox.connect(source.sandboxId);
      await connected.commands.run(`echo ${marker} > /home/user/tree/marker`);
      const snapshot = api
        .post(`/sandboxes/${source.sandboxId}/snapshots`, { name: NAME })
        .catch(() => undefined);
      await new Promise((resolve) => setTimeout(resolve, killAfterMs));
      await child.kill();
      const done = await snapshot;
      // Nothing Moat started to copy the layer outlives it (it would write on into the staging
      // folder the next Moat removes).
      const copying = () =>
        hostProcesses().filter((p) => p.includes('layer_tool') && p.includes(scratch));
      const until = Date.now() + 1000;
      while (copying().length > 0 && Date.now() < until)
        await new Promise((resolve) => setTimeout(resolve, 20));
      expect(copying(), `round ${round}`).toEqual([]);
      ({ child, api } = await start());
      const content = await snapshotContent();
      const context = `round ${round}, killed after ${killAfterMs} ms`;
      expect(content.files, context).toBe(FILES);
      expect([taken, marker], context).toContain(content.marker);
      // An acknowledged snapshot is the new one.
      if (done?.status === 201) expect(content.marker, context).toBe(marker);
      outcomes.push(content.marker === marker ? 'new' : 'old');
      taken = content.marker;
    }
    // The kills must have cut some re-snapshot short for this to mean anything.
    expect(outcomes, 'old: the kill came before the new snapshot was in place').toContain('old');
    await child.stop('SIGTERM');
  }, 240_000);
});
