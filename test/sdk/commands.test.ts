/**
 * The real `e2b` SDK against Moat: sandboxes, commands, background processes, pty, ingress,
 * lifecycle. Nothing here talks to Moat except through the SDK (or plain HTTP where the SDK
 * has no call, such as ingress).
 */
import { CommandExitError, Sandbox, SandboxError, type SandboxOpts, TimeoutError } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type SdkMoat, startSdkMoat, viaHost } from '../support/sdk-moat.js';
import { hostProcesses } from '../support/local-host.js';

let harness: SdkMoat;

const sandbox = (options: SandboxOpts = {}) => harness.sandbox(options);

/**
 * Starts an HTTP server inside `sbx` answering `body` (a JavaScript expression over the request
 * `q`) and resolves with its port. The kernel picks the port: a sandbox without a namespace shares
 * the host's loopback, where a port picked at random can be some other process's (issue 36: a run
 * beside another Moat answered "no process listens" for the whole poll).
 */
async function serveInside(sbx: Sandbox, body: string): Promise<number> {
  let resolve: (port: number) => void = () => undefined;
  const port = new Promise<number>((done) => (resolve = done));
  let printed = '';
  await sbx.commands.run(
    `node -e "require('http').createServer((q,s)=>s.end(${body})).listen(0,'127.0.0.1',function(){console.log(this.address().port)})"`,
    {
      background: true,
      onStdout: (data) => {
        printed += data;
        if (printed.includes('\n')) resolve(Number(printed.trim()));
      },
    },
  );
  return port;
}

beforeAll(async () => {
  harness = await startSdkMoat();
});

afterAll(() => harness.stop());

describe('commands.run', () => {
  it('returns stdout, stderr and exit code 0', async () => {
    const sbx = await sandbox();
    const result = await sbx.commands.run('echo out; echo err >&2');
    expect(result).toMatchObject({ exitCode: 0, stdout: 'out\n', stderr: 'err\n' });
  });

  it('throws CommandExitError with the exit code and output for a failing command', async () => {
    const sbx = await sandbox();
    const error = await sbx.commands.run('echo partial; exit 3').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandExitError);
    expect((error as CommandExitError).exitCode).toBe(3);
    expect((error as CommandExitError).stdout).toBe('partial\n');
    expect((error as CommandExitError).error).toBe('exit status 3');
  });

  it('passes env, cwd and the sandbox envVars; runs as user in /home/user by default', async () => {
    const sbx = await sandbox({ envs: { FROM_CREATE: 'yes' } });
    const result = await sbx.commands.run('echo "$FROM_CREATE $EXTRA $HOME $(pwd)"; whoami', {
      envs: { EXTRA: 'x1' },
    });
    expect(result.stdout).toBe('yes x1 /home/user /home/user\nuser\n');
    await sbx.commands.run('mkdir -p /tmp/work');
    expect((await sbx.commands.run('pwd', { cwd: '/tmp/work' })).stdout).toBe('/tmp/work\n');
    expect((await sbx.commands.run('whoami', { user: 'root' })).stdout).toBe('root\n');
  });

  it('puts the egress proxy with the sandbox credential into the environment', async () => {
    const sbx = await sandbox();
    const { stdout } = await sbx.commands.run('echo "$HTTPS_PROXY"');
    const proxy = new URL(stdout.trim());
    expect(proxy.username).toBe(sbx.sandboxId);
    expect(proxy.password.length).toBeGreaterThan(20);
    expect(proxy.port).toBe(String(harness.moat.listening.proxy.port));
  });

  it('kills a command at timeoutMs', async () => {
    const sbx = await sandbox();
    const started = Date.now();
    const error = await sbx.commands.run('sleep 30', { timeoutMs: 500 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TimeoutError);
    expect(Date.now() - started).toBeLessThan(10_000);
    // The process is gone, not just the stream.
    await expect.poll(async () => (await sbx.commands.list()).length, { timeout: 15_000 }).toBe(0);
  });

  it('streams output to callbacks as it is produced', async () => {
    const sbx = await sandbox();
    const lines: string[] = [];
    await sbx.commands.run('for i in 1 2 3; do echo line$i; done', {
      onStdout: (data) => void lines.push(data),
    });
    expect(lines.join('')).toBe('line1\nline2\nline3\n');
  });
});

describe('background processes', () => {
  it('sendStdin, closeStdin, list and wait', async () => {
    const sbx = await sandbox();
    const handle = await sbx.commands.run('cat', { background: true, stdin: true });
    expect((await sbx.commands.list()).map((p) => p.pid)).toContain(handle.pid);
    await sbx.commands.sendStdin(handle.pid, 'hello\n');
    await sbx.commands.closeStdin(handle.pid);
    const result = await handle.wait();
    expect(result.stdout).toBe('hello\n');
  });

  it('kill ends a running command (and reports false for an unknown pid)', async () => {
    const sbx = await sandbox();
    const handle = await sbx.commands.run('sleep 60', { background: true });
    expect(await sbx.commands.kill(handle.pid)).toBe(true);
    const error = await handle.wait().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandExitError);
    expect((error as CommandExitError).error).toBe('signal: killed');
    expect(await sbx.commands.kill(999_999)).toBe(false);
  });

  it('connect attaches to a running pid and sees its later output', async () => {
    const sbx = await sandbox();
    // Prints only once the test has attached: the file appears after connect resolves.
    const handle = await sbx.commands.run(
      'while [ ! -e /home/user/go ]; do sleep 0.05; done; echo late',
      { background: true },
    );
    const attached = await sbx.commands.connect(handle.pid);
    await sbx.files.write('/home/user/go', '');
    const result = await attached.wait();
    expect(result.stdout).toContain('late');
  });

  it('killing the sandbox during a running command ends it, forked children included', async () => {
    const sbx = await sandbox();
    // A duration no other test on this host uses: the host's process list is shared.
    const sleep = `sleep 300.${process.pid}${Date.now() % 1000}`;
    const handle = await sbx.commands.run(`(${sleep} &) ; ${sleep}`, { background: true });
    await expect
      .poll(() => hostProcesses().filter((l) => l === sleep).length, { timeout: 15_000 })
      .toBe(2);
    await sbx.kill();
    const error = await handle.wait().catch((e: unknown) => e);
    expect(error).toBeDefined();
    // Nothing of that sandbox survives on the host.
    await expect
      .poll(() => hostProcesses().filter((l) => l === sleep), { timeout: 15_000 })
      .toEqual([]);
  });
});

describe('pty', () => {
  it('create, input, resize and kill', async () => {
    const sbx = await sandbox();
    let output = '';
    const terminal = await sbx.pty.create({
      cols: 80,
      rows: 24,
      onData: (data) => void (output += Buffer.from(data).toString('utf8')),
    });
    // The terminal echoes the input line: quote the marker so only the command's output has it.
    await sbx.pty.sendInput(terminal.pid, Buffer.from("stty size; echo RE''ADY\n"));
    await expect.poll(() => output, { timeout: 15_000 }).toContain('READY');
    expect(output).toContain('24 80');
    await sbx.pty.resize(terminal.pid, { cols: 100, rows: 40 });
    await sbx.pty.sendInput(terminal.pid, Buffer.from('stty size\n'));
    await expect.poll(() => output, { timeout: 15_000 }).toContain('40 100');
    expect(await sbx.pty.kill(terminal.pid)).toBe(true);
    await terminal.wait().catch(() => undefined);
  });
});

describe('ingress and hosts', () => {
  it('getHost + a server started inside the sandbox', async () => {
    const sbx = await sandbox();
    const port = await serveInside(sbx, "'hi from '+q.headers.host");
    const host = sbx.getHost(port);
    expect(host).toBe(`${port}-${sbx.sandboxId}.moat.test`);
    await expect
      .poll(async () => (await viaHost(harness.sandboxUrl, host)).body, { timeout: 15_000 })
      .toBe(`hi from ${host}`);
  });

  it('a traffic token is required when public traffic is off (403 / 200)', async () => {
    const sbx = await sandbox({ network: { allowPublicTraffic: false } });
    const port = await serveInside(sbx, "'ok'");
    const host = sbx.getHost(port);
    const headers = { 'e2b-traffic-access-token': sbx.trafficAccessToken! };
    await expect
      .poll(async () => (await viaHost(harness.sandboxUrl, host, { headers })).body, {
        timeout: 15_000,
      })
      .toBe('ok');
    expect((await viaHost(harness.sandboxUrl, host)).status).toBe(403);
    const wrong = {
      'e2b-traffic-access-token': 'x'.repeat(headers['e2b-traffic-access-token'].length),
    };
    expect((await viaHost(harness.sandboxUrl, host, { headers: wrong })).status).toBe(403);
  });
});

describe('lifecycle through the SDK', () => {
  it('setTimeout expiry makes the sandbox unreachable', async () => {
    const sbx = await sandbox();
    await sbx.setTimeout(1000);
    await expect.poll(() => sbx.isRunning(), { timeout: 15_000 }).toBe(false);
    await expect(sbx.commands.run('true')).rejects.toBeInstanceOf(SandboxError);
  });

  it('pause and connect: files and a sleeping process survive', async () => {
    const sbx = await sandbox();
    await sbx.commands.run('echo kept > /home/user/kept.txt');
    const sleeper = await sbx.commands.run('sleep 120', { background: true });
    expect(await sbx.pause()).toBe(true);
    expect(await sbx.isRunning()).toBe(false);
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 });
    expect((await again.commands.run('cat /home/user/kept.txt')).stdout).toBe('kept\n');
    expect((await again.commands.list()).map((p) => p.pid)).toContain(sleeper.pid);
  });

  it('getInfo, updateNetwork and list with metadata', async () => {
    const tag = `run-${Date.now()}`;
    const sbx = await sandbox({ metadata: { suite: tag } });
    await sbx.updateNetwork({ allowOut: ['example.com'], denyOut: ['0.0.0.0/0'] });
    const info = await sbx.getInfo();
    expect(info).toMatchObject({
      sandboxId: sbx.sandboxId,
      metadata: { suite: tag },
      state: 'running',
    });
    const listed = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems();
    expect(listed.map((s) => s.sandboxId)).toEqual([sbx.sandboxId]);
  });
});
