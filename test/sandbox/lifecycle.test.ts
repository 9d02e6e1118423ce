/**
 * The sandbox lifecycle with a controllable clock: expiry (kill or pause), timeouts, refresh,
 * connect, pause/resume conflicts, autoResume, snapshots, timers across a restart, concurrent
 * transitions and store failure. Moat runs in-process; HTTP goes over loopback sockets.
 */
import { existsSync } from 'node:fs';
import { readFile, rename } from 'node:fs/promises';
import path from 'node:path';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Prng } from '../../bench/lib/prng.js';
import { type RunningMoat, startMoat } from '../../src/app/index.js';
import { decide, parseDestination } from '../../src/policy/index.js';
import { type CreateRequest, SandboxError, type SandboxRecord } from '../../src/sandbox/index.js';
import { API_KEY, testMoatConfig } from '../support/api-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { shell } from '../support/sandbox-shell.js';

const START = 1_900_000_000_000;
const RULES = { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] };

interface Clock {
  now: number;
}
interface TestMoat {
  readonly moat: RunningMoat;
  readonly clock: Clock;
  readonly dataDir: string;
}

let upstream: FakeDns;
let shared: TestMoat;
/** Moats not yet stopped, and every scratch folder made: afterAll cleans up both. */
const started: TestMoat[] = [];
const removals: Array<() => void> = [];

/** Starts Moat on `dataDir` (fresh when absent); a clock given means time moves only by hand. */
async function launch(
  options: { clock?: Clock; dataDir?: string; flags?: Record<string, string> } = {},
): Promise<TestMoat> {
  const { config, scratch } = testMoatConfig(upstream.port, {
    ...(options.dataDir ? { 'data-dir': options.dataDir } : {}),
    ...options.flags,
  });
  removals.push(scratch.remove);
  const dataDir = config.dataDir;
  const clock = options.clock;
  const moat = await startMoat(config, pino({ level: 'silent' }), {
    now: clock ? () => clock.now : undefined,
    defaultMetrics: false,
  });
  const running = { moat, clock: clock ?? { now: 0 }, dataDir };
  started.push(running);
  return running;
}

async function shutdown(running: TestMoat): Promise<void> {
  started.splice(started.indexOf(running), 1);
  await running.moat.stop();
}

beforeAll(async () => {
  upstream = await new FakeDns(new Map([['allowed.test', { A: ['127.0.0.10'] }]])).start();
  shared = await launch({ clock: { now: START } });
});

afterAll(async () => {
  for (const running of started.splice(0)) await running.moat.stop();
  for (const remove of removals) remove();
  await upstream.stop();
});

interface Reply {
  readonly sandboxID: string;
  readonly message: string;
}

/** One platform API call over HTTP; the JSON body when there is one. */
async function api<T = Reply>(moat: RunningMoat, method: string, url: string, body?: object) {
  const { host, port } = moat.listening.api;
  const response = await fetch(`http://${host}:${port}${url}`, {
    method,
    headers: {
      'X-API-Key': API_KEY,
      ...(body === undefined ? {} : { 'Content-Type': 'application/json' }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, body: text === '' ? undefined : (JSON.parse(text) as T) };
}

const create = (request: Partial<CreateRequest> = {}, running = shared) =>
  running.moat.sandboxes.create({ templateID: 'base', network: RULES, ...request });

/** Moves the clock and runs the sweep the expiry timer runs. */
async function advance(seconds: number, running = shared): Promise<void> {
  running.clock.now += seconds * 1000;
  await running.moat.sandboxes.expireDue();
}

/** Expects `promise` to reject with a SandboxError of `status`. */
async function refused(promise: Promise<unknown>, status: number): Promise<void> {
  const error: unknown = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(SandboxError);
  expect((error as SandboxError).status).toBe(status);
}

/** The stored state, or 'gone' when get answers 404 (any other error fails the test). */
async function stateOf(id: string, running = shared): Promise<string> {
  try {
    return (await running.moat.sandboxes.get(id)).state;
  } catch (error) {
    if (error instanceof SandboxError && error.status === 404) return 'gone';
    throw error;
  }
}

/** What the enforcement table decides for `host` on port 443, or 'unregistered'. */
function verdict(id: string, host: string, running = shared): string {
  const entry = running.moat.table.get(id);
  if (entry === undefined) return 'unregistered';
  const destination = parseDestination(`${host}:443`);
  if (!destination.ok) throw new Error(destination.error);
  return decide(entry.policy, destination.value).verdict;
}

/** Running sandboxes are enforced with their stored rules; paused and gone ones are not. */
async function expectEnforcedAsStored(id: string, running = shared): Promise<void> {
  if ((await stateOf(id, running)) !== 'running') {
    expect(running.moat.table.get(id)).toBeUndefined();
    return;
  }
  expect(verdict(id, 'allowed.test', running)).toBe('allow');
  expect(verdict(id, 'denied.test', running)).toBe('deny');
}

/** The sandbox's folder in the data folder (its files and record: gone when it is). */
const folderOf = (id: string, running = shared) => path.join(running.dataDir, 'sandboxes', id);
/** A shell command inside a running sandbox; its stdout. */
const inside = (id: string, script: string, running = shared) =>
  shell(running.moat.runtime.sandbox(id)!, script);

describe('expiry', () => {
  it('defaults to 15 s and expires at endAt exactly, not before', async () => {
    const { status, body } = await api(shared.moat, 'POST', '/sandboxes', { templateID: 'base' });
    expect(status).toBe(201);
    const id = body!.sandboxID;
    const record = await shared.moat.sandboxes.get(id);
    expect(record.endAt - record.startedAt).toBe(15_000);
    expect(record.startedAt).toBe(shared.clock.now);
    await advance(14.999);
    expect(await stateOf(id)).toBe('running');
    await advance(0.001);
    expect(await stateOf(id)).toBe('gone');
  });

  it('kills on expiry: 404 from get and GET, out of the table, root removed', async () => {
    const record = await create({ timeout: 30 });
    expect(shared.moat.table.get(record.sandboxID)).toBeDefined();
    expect(existsSync(folderOf(record.sandboxID))).toBe(true);
    await advance(30);
    await refused(shared.moat.sandboxes.get(record.sandboxID), 404);
    expect(shared.moat.table.get(record.sandboxID)).toBeUndefined();
    expect((await api(shared.moat, 'GET', `/sandboxes/${record.sandboxID}`)).status).toBe(404);
    expect(existsSync(folderOf(record.sandboxID))).toBe(false);
  });

  it('pauses on expiry with autoPause: paused, out of the table, listed as paused', async () => {
    const record = await create({ timeout: 30, autoPause: true });
    await advance(31);
    const paused = await shared.moat.sandboxes.get(record.sandboxID);
    expect(paused.state).toBe('paused');
    expect(shared.moat.table.get(record.sandboxID)).toBeUndefined();
    const listed = await api<Reply[]>(shared.moat, 'GET', '/v2/sandboxes?state=paused');
    expect(listed.body!.map((s) => s.sandboxID)).toContain(record.sandboxID);
    expect(existsSync(folderOf(record.sandboxID))).toBe(true);
  });

  it.each([
    { autoPause: false, after: 'gone' },
    { autoPause: true, after: 'paused' },
  ])('timeout 0 expires at once (autoPause $autoPause)', async ({ autoPause, after }) => {
    const { status, body } = await api(shared.moat, 'POST', '/sandboxes', {
      templateID: 'base',
      timeout: 0,
      autoPause,
    });
    expect(status).toBe(201);
    expect(await stateOf(body!.sandboxID)).toBe(after);
    expect(shared.moat.table.get(body!.sandboxID)).toBeUndefined();
  });
});

describe('timeouts, refresh and connect', () => {
  it('setTimeout counts from the call and may shorten: expiry at the new time', async () => {
    const { sandboxID: id } = await create({ timeout: 60 });
    await advance(10);
    expect(
      (await api(shared.moat, 'POST', `/sandboxes/${id}/timeout`, { timeout: 5 })).status,
    ).toBe(204);
    expect((await shared.moat.sandboxes.get(id)).endAt).toBe(shared.clock.now + 5_000);
    await advance(4.999);
    expect(await stateOf(id)).toBe('running');
    await advance(0.001);
    expect(await stateOf(id)).toBe('gone');
  });

  it('setTimeout may also lengthen past the original expiry', async () => {
    const { sandboxID: id, endAt } = await create({ timeout: 20 });
    await advance(10);
    await shared.moat.sandboxes.setTimeout(id, 100);
    await advance((endAt - shared.clock.now) / 1000 + 1);
    expect(await stateOf(id)).toBe('running');
    await shared.moat.sandboxes.kill(id);
  });

  it('refresh only extends: a shorter refresh leaves endAt', async () => {
    const { sandboxID: id, endAt } = await create({ timeout: 60 });
    await advance(10);
    expect(
      (await api(shared.moat, 'POST', `/sandboxes/${id}/refreshes`, { duration: 5 })).status,
    ).toBe(204);
    expect((await shared.moat.sandboxes.get(id)).endAt).toBe(endAt);
    await shared.moat.sandboxes.refresh(id, 120);
    expect((await shared.moat.sandboxes.get(id)).endAt).toBe(shared.clock.now + 120_000);
    await shared.moat.sandboxes.kill(id);
  });

  it('connect never shortens a running sandbox (200) and resumes a paused one (201)', async () => {
    const { sandboxID: id, endAt } = await create({ timeout: 60 });
    const connect = (timeout: number) =>
      api(shared.moat, 'POST', `/sandboxes/${id}/connect`, { timeout });
    expect((await connect(5)).status).toBe(200);
    expect((await shared.moat.sandboxes.get(id)).endAt).toBe(endAt);
    await shared.moat.sandboxes.pause(id);
    await advance(100);
    const resumed = await connect(30);
    expect(resumed.status).toBe(201);
    expect(resumed.body!.sandboxID).toBe(id);
    const record = await shared.moat.sandboxes.get(id);
    expect(record.state).toBe('running');
    expect(record.endAt).toBe(shared.clock.now + 30_000);
    await expectEnforcedAsStored(id);
    await shared.moat.sandboxes.kill(id);
  });
});

describe('state conflicts', () => {
  it('answers pause twice 409, resume on running 409, network on paused 404', async () => {
    const { sandboxID: id } = await create();
    await refused(shared.moat.sandboxes.resume(id, 10), 409);
    expect((await api(shared.moat, 'POST', `/sandboxes/${id}/resume`, {})).status).toBe(409);
    await shared.moat.sandboxes.pause(id);
    await refused(shared.moat.sandboxes.pause(id), 409);
    expect((await api(shared.moat, 'POST', `/sandboxes/${id}/pause`)).status).toBe(409);
    await refused(shared.moat.sandboxes.updateNetwork(id, { allowOut: ['x.test'] }), 404);
    expect((await api(shared.moat, 'PUT', `/sandboxes/${id}/network`, {})).status).toBe(404);
    await refused(shared.moat.sandboxes.setTimeout(id, 10), 404);
    expect(await stateOf(id)).toBe('paused');
  });

  it('wake resumes a paused autoResume sandbox and leaves others paused', async () => {
    const waking = await create({ autoPause: true, autoResume: { enabled: true } });
    const sleeping = await create();
    // Paused as files only, it must be resumed explicitly: traffic does not wake it.
    const cold = await create({ autoPause: true, autoResume: { enabled: true } });
    for (const { sandboxID } of [waking, sleeping]) await shared.moat.sandboxes.pause(sandboxID);
    await shared.moat.sandboxes.pause(cold.sandboxID, false);
    expect((await shared.moat.sandboxes.wake(cold.sandboxID)).state).toBe('paused');
    expect((await shared.moat.sandboxes.wake(waking.sandboxID)).state).toBe('running');
    expect((await shared.moat.sandboxes.get(waking.sandboxID)).endAt).toBe(
      shared.clock.now + 15_000,
    );
    await expectEnforcedAsStored(waking.sandboxID);
    expect((await shared.moat.sandboxes.wake(sleeping.sandboxID)).state).toBe('paused');
    expect(shared.moat.table.get(sleeping.sandboxID)).toBeUndefined();
  });

  it('kills a paused sandbox', async () => {
    const { sandboxID: id } = await create();
    await shared.moat.sandboxes.pause(id);
    expect((await api(shared.moat, 'DELETE', `/sandboxes/${id}`)).status).toBe(204);
    expect(await stateOf(id)).toBe('gone');
    expect(existsSync(folderOf(id))).toBe(false);
  });
});

describe('snapshots', () => {
  it('copies the files into sandboxes made from it; delete is refused while one uses it', async () => {
    const source = await create({ timeout: 600 });
    await inside(source.sandboxID, 'printf "kept in the snapshot" > /home/user/notes.txt');
    const snapshot = await shared.moat.sandboxes.createSnapshot(source.sandboxID, 'notes');
    expect(snapshot.snapshotID).toBe('moat/notes:default');
    const made = await api(shared.moat, 'POST', '/sandboxes', { templateID: 'notes' });
    expect(made.status).toBe(201);
    expect(await inside(made.body!.sandboxID, 'cat /home/user/notes.txt')).toBe(
      'kept in the snapshot',
    );
    const refusal = await api(shared.moat, 'DELETE', '/templates/notes');
    expect(refusal.status).toBe(409);
    expect(refusal.body!.message).toContain(made.body!.sandboxID);
    await shared.moat.sandboxes.kill(made.body!.sandboxID);
    expect((await api(shared.moat, 'DELETE', '/templates/notes')).status).toBe(204);
    await refused(create({ templateID: 'notes' }), 404);
  });
});

describe('restart', () => {
  it('expires what fell due while stopped, keeps the rest with endAt and enforcement', async () => {
    const first = await launch({ clock: { now: START } });
    const make = (count: number, timeout: number, autoPause = false) =>
      Promise.all(Array.from({ length: count }, () => create({ timeout, autoPause }, first)));
    const [killed, paused, [keptPausing], [kept], [wasPaused]] = await Promise.all([
      make(10, 10),
      make(10, 10, true),
      make(1, 100, true),
      make(1, 100),
      make(1, 100),
    ]);
    await first.moat.sandboxes.pause(wasPaused!.sandboxID);
    await shutdown(first);
    const expected = new Map<string, string>([
      ...killed.map((r) => [r.sandboxID, 'gone'] as const),
      ...paused.map((r) => [r.sandboxID, 'paused'] as const),
      [wasPaused!.sandboxID, 'paused'],
      [keptPausing!.sandboxID, 'running'],
      [kept!.sandboxID, 'running'],
    ]);

    const second = await launch({ clock: { now: START + 50_000 }, dataDir: first.dataDir });
    try {
      // startMoat has resolved and its listeners are open: what fell due must be expired now,
      // and only running sandboxes may be in the enforcement table.
      const states = new Map<string, string>();
      const enforced = new Map<string, boolean>();
      for (const id of expected.keys()) {
        states.set(id, await stateOf(id, second));
        enforced.set(id, second.moat.table.get(id) !== undefined);
      }
      expect(states).toEqual(expected);
      expect(enforced).toEqual(new Map([...expected].map(([id, s]) => [id, s === 'running'])));
      for (const record of [keptPausing!, kept!]) {
        expect((await second.moat.sandboxes.get(record.sandboxID)).endAt).toBe(record.endAt);
        await expectEnforcedAsStored(record.sandboxID, second);
      }
      // Stored source addresses are reserved again: a new sandbox gets another one.
      const fresh = await create({}, second);
      expect([kept!.sourceAddress, keptPausing!.sourceAddress]).not.toContain(fresh.sourceAddress);
      await advance(50, second);
      expect(await stateOf(keptPausing!.sandboxID, second)).toBe('paused');
      expect(await stateOf(kept!.sandboxID, second)).toBe('gone');
    } finally {
      await shutdown(second);
    }
    // 23 confined sandboxes made and two Moats started: about 10 s quiet, 30 s under load.
  }, 60_000);
});

describe('files-only pause', () => {
  it('runs nothing of the sandbox while paused, across a restart; resuming boots it from its files', async () => {
    const first = await launch({ clock: { now: START } });
    const { sandboxID: id } = await create({ timeout: 600 }, first);
    await inside(id, 'echo kept > /tmp/kept.txt', first);
    await first.moat.sandboxes.pause(id, false);
    expect(first.moat.runtime.sandbox(id)).toBeUndefined();
    expect(first.moat.table.get(id)).toBeUndefined();
    await shutdown(first);

    const second = await launch({ clock: { now: START + 1000 }, dataDir: first.dataDir });
    try {
      expect(await stateOf(id, second)).toBe('paused');
      expect(second.moat.runtime.sandbox(id)).toBeUndefined();
      const { resumed } = await second.moat.sandboxes.connect(id, 60);
      expect(resumed).toBe(true);
      expect(await inside(id, 'cat /tmp/kept.txt', second)).toBe('kept\n');
      await expectEnforcedAsStored(id, second);
      expect((await second.moat.sandboxes.get(id)).filesOnly).toBe(false);
    } finally {
      await shutdown(second);
    }
  });
});

describe('restore failure', () => {
  it('leaves a sandbox that cannot come back paused with its files; the rest start; resuming retries', async () => {
    const first = await launch({ clock: { now: START } });
    const [broken, healthy] = await Promise.all([create({}, first), create({}, first)]);
    await inside(broken!.sandboxID, 'echo still here > /home/user/kept.txt', first);
    await shutdown(first);
    // Its disk image is gone when Moat starts again: restore fails (and keeps its record).
    const meta = JSON.parse(
      await readFile(path.join(folderOf(broken!.sandboxID, first), 'sandbox.json'), 'utf8'),
    ) as { disk: string };
    const image = path.join(first.dataDir, 'disks', `${meta.disk}.img`);
    await rename(image, `${image}.away`);

    const second = await launch({ clock: { now: START + 1000 }, dataDir: first.dataDir });
    try {
      expect(await stateOf(broken!.sandboxID, second)).toBe('paused');
      expect(second.moat.table.get(broken!.sandboxID)).toBeUndefined();
      expect(second.moat.runtime.sandbox(broken!.sandboxID)).toBeUndefined();
      expect(await stateOf(healthy!.sandboxID, second)).toBe('running');
      await expectEnforcedAsStored(healthy!.sandboxID, second);

      const error: unknown = await second.moat.sandboxes
        .connect(broken!.sandboxID, 60)
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(SandboxError);
      expect((error as SandboxError).status).toBe(503);
      expect((error as SandboxError).message).toContain(broken!.sandboxID);
      expect((error as SandboxError).message).toContain('disk image');
      expect(await stateOf(broken!.sandboxID, second)).toBe('paused');

      await rename(`${image}.away`, image);
      const resumed = await second.moat.sandboxes.connect(broken!.sandboxID, 60);
      expect(resumed.resumed).toBe(true);
      expect(await stateOf(broken!.sandboxID, second)).toBe('running');
      expect(second.moat.runtime.sandbox(broken!.sandboxID)).toBeDefined();
      expect(await inside(broken!.sandboxID, 'cat /home/user/kept.txt', second)).toBe(
        'still here\n',
      );
      await expectEnforcedAsStored(broken!.sandboxID, second);
    } finally {
      await shutdown(second);
    }
  });
});

describe('concurrency', () => {
  const WIDER = { allowOut: ['allowed.test', 'other.test'], denyOut: ['0.0.0.0/0'] };
  type Model = { state: 'running' | 'paused'; endAt: number; rules: typeof RULES };

  /**
   * Starts one random operation and returns the status a one-at-a-time model predicts for it
   * (0: success), updating the model. Calls queue in arrival order, so the model is exact.
   */
  function startOp(id: string, model: Model, random: Prng) {
    const service = shared.moat.sandboxes;
    const now = shared.clock.now;
    const seconds = 1 + random.int(90);
    const running = model.state === 'running';
    switch (random.int(4)) {
      case 0:
        if (running) Object.assign(model, { state: 'paused', endAt: now });
        return { promise: service.pause(id), expected: running ? 0 : 409 };
      case 1:
        model.endAt = Math.max(running ? model.endAt : 0, now + seconds * 1000);
        model.state = 'running';
        return { promise: service.connect(id, seconds), expected: 0 };
      case 2: {
        const rules = random.int(2) === 0 ? RULES : WIDER;
        if (running) model.rules = rules;
        return { promise: service.updateNetwork(id, rules), expected: running ? 0 : 404 };
      }
      default:
        if (running) model.endAt = now + seconds * 1000;
        return { promise: service.setTimeout(id, seconds), expected: running ? 0 : 404 };
    }
  }

  it.each([1, 2, 3])('serialises 50 mixed transitions of one sandbox (seed %i)', async (seed) => {
    const { sandboxID: id, endAt } = await create({ timeout: 60 });
    const model: Model = { state: 'running', endAt, rules: RULES };
    const random = new Prng(seed);
    const calls = Array.from({ length: 50 }, () => startOp(id, model, random));
    const outcomes = await Promise.allSettled(calls.map((c) => c.promise));
    const statuses = outcomes.map((o) =>
      o.status === 'fulfilled' ? 0 : o.reason instanceof SandboxError ? o.reason.status : -1,
    );
    expect(statuses).toEqual(calls.map((c) => c.expected));
    const record = await shared.moat.sandboxes.get(id);
    expect([record.state, record.endAt, record.network.allowOut]).toEqual([
      model.state,
      model.endAt,
      model.rules.allowOut,
    ]);
    // Registered in the table exactly when running, with the rules last stored.
    const expected =
      model.state === 'paused' ? 'unregistered' : model.rules === RULES ? 'deny' : 'allow';
    expect(verdict(id, 'other.test')).toBe(expected);
    await shared.moat.sandboxes.kill(id);
  });

  it('gives sandboxes made under another source pool addresses of the new one', async () => {
    const first = await launch({
      clock: { now: START },
      flags: { 'source-pool': '127.88.0.0/24' },
    });
    const made = [await create({}, first), await create({}, first)];
    await shutdown(first);
    const second = await launch({
      clock: { now: START },
      dataDir: first.dataDir,
      flags: { 'source-pool': '127.89.0.0/24' },
    });
    const moved = await Promise.all(made.map((r) => second.moat.sandboxes.get(r.sandboxID)));
    expect(moved.map((r) => r.sourceAddress)).toEqual(['127.89.0.1', '127.89.0.2']);
    for (const record of moved) {
      expect(second.moat.table.fromSource(record.sourceAddress)?.sandboxID).toBe(record.sandboxID);
    }
  });

  it('gives 50 concurrent creates distinct IDs and source addresses', async () => {
    const records: SandboxRecord[] = await Promise.all(
      Array.from({ length: 50 }, () => create({ timeout: 600 })),
    );
    expect(new Set(records.map((r) => r.sandboxID)).size).toBe(50);
    expect(new Set(records.map((r) => r.sourceAddress)).size).toBe(50);
    for (const r of records) {
      expect(shared.moat.table.get(r.sandboxID)?.sourceAddress?.text).toBe(r.sourceAddress);
    }
    await Promise.all(records.map((r) => shared.moat.sandboxes.kill(r.sandboxID)));
  });
});

describe('store failure', () => {
  it('answers 503 when the store takes no writes, and leaves the sandbox as it was', async () => {
    const running = await launch({ clock: { now: START } });
    try {
      const { sandboxID: id } = await create({ timeout: 30 }, running);
      await running.moat.store.close();
      const made = await api(running.moat, 'POST', '/sandboxes', { templateID: 'base' });
      expect(made.status).toBe(503);
      expect(made.body!.message).toContain('closed');
      expect((await api(running.moat, 'POST', `/sandboxes/${id}/pause`)).status).toBe(503);
      await refused(running.moat.sandboxes.setTimeout(id, 5), 503);
      expect(await stateOf(id, running)).toBe('running');
      await expectEnforcedAsStored(id, running);
      // An expiry that cannot be stored is kept due, not lost or half done.
      await advance(31, running);
      expect(await stateOf(id, running)).toBe('running');
    } finally {
      await shutdown(running);
    }
  });
});

describe('real time', () => {
  it('expires a sandbox with timeout 1 by the real timer', async () => {
    const running = await launch();
    try {
      const made = await api(running.moat, 'POST', '/sandboxes', {
        templateID: 'base',
        timeout: 1,
      });
      expect(made.status).toBe(201);
      const deadline = Date.now() + 3_000;
      let status = 200;
      while (status !== 404 && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 100));
        status = (await api(running.moat, 'GET', `/sandboxes/${made.body!.sandboxID}`)).status;
      }
      expect(status).toBe(404);
    } finally {
      await shutdown(running);
    }
  });
});
