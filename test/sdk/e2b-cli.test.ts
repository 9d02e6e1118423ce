/**
 * The E2B CLI (`@e2b/cli`) against Moat, as a real child process pointed at Moat only through
 * E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and E2B_DOMAIN: `sandbox list`, `info`, `exec`,
 * `metrics`, `kill`, and `logs` (which Moat does not serve: its 501 reaches the user).
 */
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import path from 'node:path';
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fileURLToPath } from 'node:url';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

const CLI = fileURLToPath(new URL('../../node_modules/@e2b/cli/dist/index.js', import.meta.url));
const CLI_TIMEOUT_MS = 60_000;

let harness: SdkMoat;
let home: string;

beforeAll(async () => {
  harness = await startSdkMoat();
  // The CLI keeps its settings under HOME: an empty one, so no user's login is read.
  home = await mkdtemp(path.join(tmpdir(), 'moat-e2b-cli-'));
});

afterAll(async () => {
  await harness.stop();
  await rm(home, { recursive: true, force: true });
});

interface CliRun {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/**
 * `e2b <args>` as a child process, `input` piped to its standard input (the CLI forwards piped
 * input to the command); never a network address but Moat's.
 */
function e2b(args: string[], input = ''): Promise<CliRun> {
  const env = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: home,
    E2B_API_URL: process.env.E2B_API_URL!,
    E2B_SANDBOX_URL: process.env.E2B_SANDBOX_URL!,
    E2B_API_KEY: process.env.E2B_API_KEY!,
    E2B_DOMAIN: process.env.E2B_DOMAIN!,
    // Its update check would ask the public npm registry.
    NO_UPDATE_NOTIFIER: '1',
    NO_COLOR: '1',
  };
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      [CLI, ...args],
      { env, timeout: CLI_TIMEOUT_MS, maxBuffer: 1 << 20 },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === 'number' ? error.code : -1;
        resolve({ code, stdout, stderr });
      },
    );
    child.stdin?.end(input);
  });
}

describe('e2b sandbox', () => {
  it('list shows a running sandbox with its metadata; --format json too', async () => {
    const tag = `cli-${Date.now()}`;
    const sbx = await harness.sandbox({ metadata: { tag } });
    const pretty = await e2b(['sandbox', 'list', '--metadata', `tag=${tag}`]);
    expect(pretty.code, pretty.stderr).toBe(0);
    expect(pretty.stdout).toContain(sbx.sandboxId);
    const json = await e2b(['sandbox', 'list', '--metadata', `tag=${tag}`, '--format', 'json']);
    expect(json.code, json.stderr).toBe(0);
    const listed = JSON.parse(json.stdout) as Array<{ sandboxId: string; metadata: object }>;
    expect(listed.map((s) => [s.sandboxId, s.metadata])).toEqual([[sbx.sandboxId, { tag }]]);
  });

  it('info shows the sandbox; an unknown one is reported not found', async () => {
    const sbx = await harness.sandbox({ metadata: { shown: 'yes' } });
    const info = await e2b(['sandbox', 'info', sbx.sandboxId, '--format', 'json']);
    expect(info.code, info.stderr).toBe(0);
    expect(JSON.parse(info.stdout)).toMatchObject({
      sandboxId: sbx.sandboxId,
      templateId: 'base',
      metadata: { shown: 'yes' },
      state: 'running',
    });
    const missing = await e2b(['sandbox', 'info', `i${'0'.repeat(20)}`]);
    expect(missing.code).not.toBe(0);
    expect(missing.stdout + missing.stderr).toContain("wasn't found");
  });

  it('exec runs a command in the sandbox, with its output and exit status', async () => {
    const sbx = await harness.sandbox();
    // One argument is a shell command line; several are quoted one by one.
    const run = await e2b(['sandbox', 'exec', sbx.sandboxId, 'echo from-cli $HOME']);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toBe('from-cli /home/user\n');
    const quoted = await e2b(['sandbox', 'exec', sbx.sandboxId, 'echo', 'a b', '$HOME']);
    expect(quoted.stdout).toBe('a b $HOME\n');
    const piped = await e2b(['sandbox', 'exec', sbx.sandboxId, 'wc -c'], 'x'.repeat(100_000));
    expect(piped.stdout.trim()).toBe('100000');
    const asRoot = await e2b(['sandbox', 'exec', '-u', 'root', sbx.sandboxId, 'whoami']);
    expect(asRoot.stdout).toBe('root\n');
    const failing = await e2b(['sandbox', 'exec', sbx.sandboxId, 'exit 3']);
    expect(failing.code).toBe(3);
  });

  it('kill ends the sandbox; the SDK then finds it gone', async () => {
    const sbx = await harness.sandbox();
    const killed = await e2b(['sandbox', 'kill', sbx.sandboxId]);
    expect(killed.code, killed.stderr).toBe(0);
    expect(killed.stdout).toContain(`Sandbox ${sbx.sandboxId} has been killed`);
    expect(await Sandbox.kill(sbx.sandboxId)).toBe(false);
    // Gone, or never a sandbox ID at all: not found, never "invalid".
    for (const id of [sbx.sandboxId, 'not-an-id']) {
      const again = await e2b(['sandbox', 'kill', id]);
      expect(again.stderr).toContain(`Sandbox ${id} wasn't found`);
    }
  });

  it("metrics prints the sandbox's sampled CPU, memory and disk figures", async () => {
    const sbx = await harness.sandbox();
    // The first sample needs two CPU readings, taken a few seconds apart.
    const deadline = Date.now() + 30_000;
    while ((await sbx.getMetrics()).length === 0 && Date.now() < deadline) await sleep(500);
    const run = await e2b(['sandbox', 'metrics', sbx.sandboxId, '--format', 'json']);
    expect(run.code, run.stderr).toBe(0);
    const lines = run.stdout.split('\n').filter((l) => l.startsWith('{'));
    expect(lines.length).toBeGreaterThan(0);
    const metric = JSON.parse(lines[0]!) as Record<string, number>;
    expect(metric.cpuCount).toBeGreaterThan(0);
    expect(metric.memTotal).toBeGreaterThan(metric.memUsed!);
    expect(metric.memUsed).toBeGreaterThan(0);
    expect(metric.diskTotal).toBeGreaterThan(0);
  }, 60_000);

  it('logs shows that Moat does not serve sandbox logs', async () => {
    const sbx = await harness.sandbox();
    const logs = await e2b(['sandbox', 'logs', sbx.sandboxId]);
    expect(logs.code).not.toBe(0);
    expect(logs.stdout + logs.stderr).toContain('Sandbox logs is not supported by Moat');
  });
});
