/**
 * The real `e2b` SDK against Moat: fork, metrics, files-only pause and the lifecycle fields of
 * create. Everything goes through the SDK, except requests the SDK refuses to send (it checks
 * some lifecycle combinations itself), which go as plain HTTP to show Moat refuses them too.
 */
import { Sandbox, SandboxError, SandboxNotFoundError } from 'e2b';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';
import { hostProcesses } from '../support/local-host.js';

let harness: SdkMoat;

const BOOT_ID = '/proc/sys/kernel/random/boot_id';
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

const exists = async (sbx: Sandbox, path: string) => sbx.files.exists(path);

/** Forks that started; the test fails on any fork that did not. */
function started(results: Array<Sandbox | Error>): Sandbox[] {
  for (const result of results) if (result instanceof Error) throw result;
  return results as Sandbox[];
}

beforeAll(async () => {
  harness = await startSdkMoat();
});

afterAll(() => harness.stop());

describe('fork', () => {
  it('makes a sandbox from the source’s files and network config, without its processes', async () => {
    const source = await harness.sandbox({
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
      metadata: { purpose: 'fork-source' },
    });
    await source.files.write('/home/user/before.txt', 'from before the fork');
    await source.commands.run('sleep 311', { background: true });
    const before = await source.getInfo();

    const [fork] = started(await source.fork({ timeoutMs: 60_000 }));
    // Written in the source after the fork: not in the fork.
    await source.files.write('/home/user/after.txt', 'after');

    expect(fork!.sandboxId).not.toBe(source.sandboxId);
    expect(await fork!.files.read('/home/user/before.txt')).toBe('from before the fork');
    expect(await exists(fork!, '/home/user/after.txt')).toBe(false);
    expect(await fork!.commands.list()).toEqual([]);
    const info = await fork!.getInfo();
    expect(info.state).toBe('running');
    expect(info.network?.allowOut).toEqual(['allowed.test']);
    expect(info.network?.denyOut).toEqual(['0.0.0.0/0']);
    expect(info.metadata).toEqual({ purpose: 'fork-source' });
    // Enforced, not only shown: the egress proxy refuses a name the rules do not allow.
    const status = (host: string) =>
      fork!.commands
        .run(`curl -sS -o /dev/null -w '%{http_code}' -x "$HTTP_PROXY" http://${host}/`)
        .then(
          (r) => r,
          (e: { stdout: string; stderr: string }) => e,
        );
    const denied = await status('denied.test');
    expect(denied.stdout, denied.stderr).toBe('403');
    const allowed = await status('allowed.test');
    expect(allowed.stdout, allowed.stderr).not.toBe('403');

    // The source keeps its id, expiry and processes.
    const after = await source.getInfo();
    expect(after.state).toBe('running');
    expect(after.endAt).toEqual(before.endAt);
    const running = await source.commands.list();
    expect(running.map((p) => [p.cmd, ...p.args].join(' ')).join('\n')).toContain('sleep 311');
    await fork!.kill();
  });

  it('makes two independent forks from one copy (Sandbox.fork by id)', async () => {
    const source = await harness.sandbox();
    await source.files.write('/home/user/shared.txt', 'one copy');
    const forks = started(await Sandbox.fork(source.sandboxId, { count: 2, timeoutMs: 60_000 }));
    expect(forks).toHaveLength(2);
    expect(new Set(forks.map((f) => f.sandboxId)).size).toBe(2);
    for (const fork of forks) {
      expect(await fork.files.read('/home/user/shared.txt')).toBe('one copy');
    }
    await forks[0]!.files.write('/home/user/only-first.txt', 'x');
    expect(await exists(forks[1]!, '/home/user/only-first.txt')).toBe(false);
    expect(await exists(source, '/home/user/only-first.txt')).toBe(false);
    expect((await forks[1]!.commands.run('echo alive')).stdout).toBe('alive\n');
    await Promise.all(forks.map((f) => f.kill()));
  });

  it('forks a paused sandbox from its files; it stays paused', async () => {
    const source = await harness.sandbox();
    await source.files.write('/home/user/paused.txt', 'while paused');
    await source.pause({ keepMemory: false });
    const [fork] = started(await source.fork({ timeoutMs: 60_000 }));
    expect(await fork!.files.read('/home/user/paused.txt')).toBe('while paused');
    expect((await source.getInfo()).state).toBe('paused');
    await fork!.kill();
  });

  it('refuses count 0 and more than 10 with a 400, and an unknown source as not found', async () => {
    const source = await harness.sandbox();
    const zero = await source.fork({ count: 0 }).catch((e: unknown) => e);
    expect(zero).toBeInstanceOf(SandboxError);
    expect((zero as SandboxError).message).toBe('400: body.count must be >= 1');
    const many = await source.fork({ count: 11 }).catch((e: unknown) => e);
    expect((many as SandboxError).message).toBe('400: body.count must be <= 10');
    const unknown = await Sandbox.fork(`i${'0'.repeat(20)}`).catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(SandboxNotFoundError);
    const garbage = await harness.api.call('POST', `/sandboxes/${source.sandboxId}/fork`, {
      body: { count: '2', options: {} },
    });
    expect(garbage.status).toBe(400);
  });
});

describe('metrics', () => {
  it('reports CPU, memory and disk that a command uses', async () => {
    const sbx = await harness.sandbox();
    const info = await sbx.getInfo();
    // Bounded: each stops by itself within 20 s.
    await sbx.commands.run("timeout 20 sh -c 'while :; do :; done'", { background: true });
    await sbx.commands.run('(head -c 96m /dev/zero; sleep 20) | tail > /dev/null', {
      background: true,
    });
    await sbx.commands.run('head -c 48m /dev/urandom > /home/user/big.bin');

    const MiB = 2 ** 20;
    await expect
      .poll(
        async () => {
          const samples = await sbx.getMetrics();
          // An idle sandbox reads about 0 %; its busy loop gets far less than a core when the
          // host is busy (two other loops and the suite on two cores), never below 5 %.
          return samples.some(
            (m) => m.cpuUsedPct > 5 && m.memUsed > 80 * MiB && m.diskUsed > 48 * MiB,
          );
        },
        { timeout: 40_000, interval: 1000 },
      )
      .toBe(true);
    const [sample] = await sbx.getMetrics();
    expect(sample!.timestamp).toBeInstanceOf(Date);
    expect(sample!.cpuCount).toBe(info.cpuCount);
    expect(sample!.memTotal).toBe(info.memoryMB * MiB);
    expect(sample!.diskTotal).toBeGreaterThan(48 * MiB);
    expect(sample!.cpuUsedPct).toBeGreaterThanOrEqual(0);
    expect(sample!.cpuUsedPct).toBeLessThanOrEqual(100);

    // The time range the SDK sends (Unix seconds).
    const future = new Date(Date.now() + 3_600_000);
    expect(await sbx.getMetrics({ start: future })).toEqual([]);
    const all = await sbx.getMetrics();
    const last = all.at(-1)!.timestamp;
    const ranged = await sbx.getMetrics({ start: last, end: last });
    expect(ranged.map((m) => m.timestamp.getTime())).toContain(last.getTime());

    // The list form.
    const listed = await harness.api.call(
      'GET',
      `/sandboxes/metrics?sandbox_ids=${sbx.sandboxId},i${'0'.repeat(20)}`,
    );
    expect(listed.status).toBe(200);
    expect(Object.keys((listed.body as { sandboxes: object }).sandboxes)).toEqual([sbx.sandboxId]);

    await sbx.kill();
    await expect(Sandbox.getMetrics(sbx.sandboxId)).rejects.toBeInstanceOf(SandboxNotFoundError);
  }, 60_000);

  it('refuses bad time ranges and lists without ids', async () => {
    const sbx = await harness.sandbox();
    const path = `/sandboxes/${sbx.sandboxId}/metrics`;
    expect((await harness.api.call('GET', `${path}?start=20&end=10`)).status).toBe(400);
    expect((await harness.api.call('GET', `${path}?start=yesterday`)).status).toBe(400);
    expect((await harness.api.call('GET', `${path}?start=-5`)).status).toBe(400);
    expect((await harness.api.call('GET', '/sandboxes/metrics')).status).toBe(400);
    const many = Array.from({ length: 101 }, () => sbx.sandboxId).join(',');
    expect((await harness.api.call('GET', `/sandboxes/metrics?sandbox_ids=${many}`)).status).toBe(
      400,
    );
    expect((await harness.api.call('GET', path, { key: 'wrong' })).status).toBe(401);
  });
});

describe('files-only pause', () => {
  it('keeps the files and ends the processes; resume cold-boots', async () => {
    const sbx = await harness.sandbox();
    await sbx.files.write('/home/user/kept.txt', 'kept');
    await sbx.commands.run('sleep 312', { background: true });
    expect(hostProcesses()).toContain('sleep 312');

    expect(await sbx.pause({ keepMemory: false })).toBe(true);
    expect((await sbx.getInfo()).state).toBe('paused');
    await expect.poll(() => hostProcesses().includes('sleep 312'), { timeout: 15_000 }).toBe(false);

    await sbx.connect();
    expect((await sbx.getInfo()).state).toBe('running');
    expect(await sbx.files.read('/home/user/kept.txt')).toBe('kept');
    expect(await sbx.commands.list()).toEqual([]);
    expect((await sbx.commands.run('echo booted')).stdout).toBe('booted\n');
  });

  it('a files-only resume is a new boot (boot_id changes, as E2B’s test reads it); a pause with memory is not', async () => {
    const hostBootId = readFileSync(BOOT_ID, 'utf8');
    const sbx = await harness.sandbox();
    const other = await harness.sandbox();
    const bootId = async (of: Sandbox) => (await of.commands.run(`cat ${BOOT_ID}`)).stdout.trim();
    const first = await bootId(sbx);
    expect(first).toMatch(UUID);
    expect(first).not.toBe(hostBootId.trim());
    expect(await bootId(other)).not.toBe(first);

    await sbx.pause();
    await sbx.connect();
    expect(await bootId(sbx)).toBe(first);

    await sbx.pause({ keepMemory: false });
    await sbx.connect();
    const second = await bootId(sbx);
    expect(second).toMatch(UUID);
    expect(second).not.toBe(first);
    // The file API reads the same value; the host's own boot id is untouched.
    expect((await sbx.files.read(BOOT_ID)).trim()).toBe(second);
    expect(readFileSync(BOOT_ID, 'utf8')).toBe(hostBootId);
  });

  it('connect with onResume reboot cold-boots a sandbox paused with its memory', async () => {
    const sbx = await harness.sandbox();
    await sbx.commands.run('sleep 314', { background: true });
    await sbx.pause();
    await sbx.connect({ onResume: 'reboot' });
    expect(await sbx.commands.list()).toEqual([]);
    expect(hostProcesses()).not.toContain('sleep 314');
  });
});

describe('lifecycle on create', () => {
  const waitForState = (sbx: Sandbox, state: 'paused' | 'running') =>
    expect
      .poll(async () => (await sbx.getInfo()).state, { timeout: 20_000, interval: 500 })
      .toBe(state);

  it('onTimeout pause pauses at expiry instead of killing; the sandbox resumes', async () => {
    const sbx = await harness.sandbox({
      timeoutMs: 2000,
      lifecycle: { onTimeout: 'pause' },
    });
    await sbx.files.write('/home/user/survives.txt', 'yes');
    await sbx.commands.run('sleep 315', { background: true });
    await waitForState(sbx, 'paused');
    expect((await sbx.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: false });
    await sbx.connect({ timeoutMs: 60_000 });
    expect(await sbx.files.read('/home/user/survives.txt')).toBe('yes');
    // Paused with its memory: the process goes on.
    const running = await sbx.commands.list();
    expect(running.map((p) => [p.cmd, ...p.args].join(' ')).join('\n')).toContain('sleep 315');
  });

  it('onTimeout pause with keepMemory false pauses as files only', async () => {
    const sbx = await harness.sandbox({
      timeoutMs: 2000,
      lifecycle: { onTimeout: { action: 'pause', keepMemory: false } },
    });
    await sbx.files.write('/home/user/survives.txt', 'yes');
    await sbx.commands.run('sleep 316', { background: true });
    await waitForState(sbx, 'paused');
    expect(hostProcesses()).not.toContain('sleep 316');
    await sbx.connect({ timeoutMs: 60_000 });
    expect(await sbx.files.read('/home/user/survives.txt')).toBe('yes');
    expect(await sbx.commands.list()).toEqual([]);
  });

  it('shows onTimeout kill and autoResume as the SDK reads them', async () => {
    const plain = await harness.sandbox();
    expect((await plain.getInfo()).lifecycle).toEqual({ onTimeout: 'kill', autoResume: false });
    const waking = await harness.sandbox({ lifecycle: { onTimeout: 'pause', autoResume: true } });
    expect((await waking.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: true });
  });

  it('refuses the combinations the SDK documents as unsupported', async () => {
    const refused = [
      [{ autoResume: { enabled: true } }, 'autoResume.enabled true requires autoPause true'],
      [{ autoPause: false, autoPauseMemory: false }, 'autoPauseMemory (onTimeout.keepMemory)'],
      [
        { autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } },
        'cannot be combined with autoPauseMemory false',
      ],
      [{ autoPauseMemory: 'no' }, 'body.autoPauseMemory must be boolean'],
    ] as const;
    for (const [fields, message] of refused) {
      const reply = await harness.api.call('POST', '/v2/sandboxes', {
        body: { templateID: 'base', ...fields },
      });
      expect(reply.status).toBe(400);
      expect((reply.body as { message: string }).message).toContain(message);
    }
  });
});
