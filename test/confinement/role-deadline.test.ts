/**
 * Attacker tests: a sandbox's user stops (SIGSTOP) its own file agent or launcher. Before,
 * Moat waited on a stopped role for ever: that user's file calls hung until the client gave up
 * and the agent was never replaced. Now a call that sees no progress within the deadline fails,
 * the role is killed by the sandbox's init, the next call gets a new one, and other sandboxes
 * never notice.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SandboxApi } from '../../src/envd/index.js';
import { type RuntimeSandbox, USERS } from '../../src/runtime/index.js';
import { STOP_OWN_ROLES } from '../support/floods.js';
import { shell } from '../support/sandbox-shell.js';
import { type Harness, skipReason, startHarness } from './runtime-harness.js';

const skip = skipReason('confinement/role-deadline');
const DEADLINE_MS = 1000;
let harness: Harness;
let attacker: RuntimeSandbox;
let bystander: RuntimeSandbox;
const missed: string[] = [];
/** The attacker's sandbox API. */
let server: http.Server;

beforeAll(async () => {
  if (skip) return;
  harness = await startHarness({
    budgets: {
      roleDeadline: {
        ms: DEADLINE_MS,
        onMissed: (sandboxID, role, user) => missed.push(`${sandboxID} ${role} ${user}`),
      },
    },
  });
  attacker = await harness.sandbox();
  bystander = await harness.sandbox();
  const api = new SandboxApi(pino({ level: 'silent' }));
  const envd = {
    sandboxID: attacker.sandboxID,
    accessToken: null,
    envVars: {},
    runtime: attacker,
    running: () => true,
  };
  server = http.createServer((request, response) => void api.handle(request, response, envd));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
}, 60_000);

afterAll(async () => {
  server?.closeAllConnections();
  await new Promise((resolve) => server?.close(resolve));
  await harness?.close();
});

/** Filesystem Stat of `path` as `user` through the attacker's sandbox API: status and body. */
async function apiStat(path: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const { port } = server.address() as AddressInfo;
  const response = await fetch(`http://127.0.0.1:${port}/filesystem.Filesystem/Stat`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json',
      'Connect-Protocol-Version': '1',
      Authorization: `Basic ${Buffer.from('user:').toString('base64')}`,
    },
    body: JSON.stringify({ path }),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

/** Python run as `user` in the sandbox (its parent is the user's launcher): prints the pids it stopped. */
const STOP_OWN_AGENTS = `${STOP_OWN_ROLES}\nprint(" ".join(stop_own_roles()))`;

/** Rejects after `ms`: how a test says "this hung". */
const within = <T>(promise: Promise<T>, ms: number): Promise<T> =>
  Promise.race([
    promise,
    new Promise<T>((_, reject) =>
      setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms),
    ),
  ]);

describe.skipIf(skip)('a stopped role of a sandbox', () => {
  it('a stopped file agent fails its API call within the deadline (504), is replaced, and other sandboxes go on', async () => {
    expect((await apiStat('/home/user')).status).toBe(200);
    const stopped = (await shell(attacker, `exec python3 -c '${STOP_OWN_AGENTS}'`)).trim();
    expect(stopped.split(' ')).toHaveLength(1);

    const started = Date.now();
    const call = apiStat('/home/user');
    // Meanwhile another sandbox's files answer at once.
    expect((await within(bystander.files.stat('user', '/home/user'), 1000)).path).toBe(
      '/home/user',
    );
    const answer = await within(call, DEADLINE_MS * 5);
    expect(answer.status).toBe(504);
    expect(answer.body).toMatchObject({
      code: 'deadline_exceeded',
      message: expect.stringMatching(/made no progress within 1 s/),
    });
    expect(Date.now() - started).toBeLessThan(DEADLINE_MS * 3);
    expect(missed).toEqual([`${attacker.sandboxID} file agent user`]);

    // The next call gets a new agent; the stopped one was killed (and, within 5 s even on a
    // loaded machine, reaped by the sandbox's init).
    expect((await within(apiStat('/home/user'), 5000)).status).toBe(200);
    const gone = `for i in $(seq 50); do test -e /proc/${stopped} || { echo gone; exit; }; sleep 0.1; done`;
    expect(await shell(attacker, gone)).toBe('gone\n');
  }, 30_000);

  it('the deadline is on progress: a download read slower than the deadline is not cut', async () => {
    missed.length = 0;
    await shell(bystander, 'head -c 8388608 /dev/urandom > /home/user/big');
    const { size, body } = await bystander.files.read('user', '/home/user/big');
    expect(size).toBe(8 << 20);
    let received = 0;
    for await (const chunk of body) {
      received += (chunk as Buffer).length;
      // The reader stops for over twice the deadline once: the agent waits on it, not it on
      // the agent.
      if (received === (chunk as Buffer).length) {
        await new Promise((resolve) => setTimeout(resolve, DEADLINE_MS * 2.5));
      }
    }
    expect(received).toBe(8 << 20);
    expect(missed).toEqual([]);
  }, 30_000);

  it('a frozen sandbox (paused, or held for a snapshot) is not its roles’ fault: a call waits for the thaw', async () => {
    missed.length = 0;
    await bystander.files.stat('user', '/home/user');
    await harness.runtime.pause(bystander.sandboxID);
    const call = bystander.files.stat('user', '/home/user');
    try {
      await new Promise((resolve) => setTimeout(resolve, DEADLINE_MS * 2.5));
    } finally {
      await harness.runtime.resume(bystander.sandboxID);
    }
    expect((await within(call, 5000)).path).toBe('/home/user');
    expect(missed).toEqual([]);
  }, 30_000);

  it('a stopped launcher is replaced: the next command runs', async () => {
    missed.length = 0;
    // The command's parent is the launcher: it stops that one (its own output stops with it),
    // once the launcher has said it started.
    const stopping = await attacker.processes.start({
      config: { cmd: '/bin/sh', args: ['-c', 'sleep 0.3; kill -STOP $PPID'], envs: {} },
      user: USERS.get('user')!,
      stdin: false,
    });
    stopping.release();
    await new Promise((resolve) => setTimeout(resolve, 800));
    const started = Date.now();
    expect(await within(shell(attacker, 'echo after'), DEADLINE_MS * 5)).toBe('after\n');
    expect(Date.now() - started).toBeLessThan(DEADLINE_MS * 3);
    expect(missed).toEqual([`${attacker.sandboxID} launcher user`]);
  }, 30_000);
});
