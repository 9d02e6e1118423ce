/**
 * The real `e2b` SDK on the calls where Moat once differed from E2B (docs/e2b-differences.md):
 * not-found and malformed IDs, list filters, refused create fields, signed file URLs, file
 * metadata set inside the sandbox, terminals with no size, a sandbox killed under a running
 * command, and sudo in a command.
 */
import {
  InvalidArgumentError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
} from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

let harness: SdkMoat;
const sandbox = (options: Parameters<SdkMoat['sandbox']>[0] = {}) => harness.sandbox(options);

beforeAll(async () => {
  harness = await startSdkMoat();
});

afterAll(() => harness.stop());

const MISSING = `i${'0'.repeat(20)}`;
const MALFORMED = ['nope', `I${'a'.repeat(20)}`, `i${'a'.repeat(21)}`, 'i-has-dashes-0000000000'];

describe('unknown and malformed sandbox IDs', () => {
  it('kill resolves false; getInfo and connect throw SandboxNotFoundError', async () => {
    for (const id of [MISSING, ...MALFORMED]) {
      expect(await Sandbox.kill(id), id).toBe(false);
      await expect(Sandbox.getInfo(id), id).rejects.toBeInstanceOf(SandboxNotFoundError);
      await expect(Sandbox.connect(id), id).rejects.toBeInstanceOf(SandboxNotFoundError);
      await expect(Sandbox.setTimeout(id, 1000), id).rejects.toBeInstanceOf(SandboxNotFoundError);
    }
  });
});

describe('Sandbox.list startedAfter', () => {
  it('is "at or after": a sandbox started at that moment is in, a later time leaves it out', async () => {
    const tag = `started-${Date.now()}`;
    const sbx = await sandbox({ metadata: { tag } });
    const { startedAt } = await sbx.getInfo();
    const ids = async (startedAfter: Date) =>
      (await Sandbox.list({ query: { metadata: { tag }, startedAfter } }).nextItems()).map(
        (s) => s.sandboxId,
      );
    expect(await ids(startedAt)).toEqual([sbx.sandboxId]);
    expect(await ids(new Date(startedAt.getTime() - 60_000))).toEqual([sbx.sandboxId]);
    expect(await ids(new Date(startedAt.getTime() + 1))).toEqual([]);
  });
});

describe('create fields for features Moat lacks', () => {
  it('mcp and volumeMounts are refused naming the feature', async () => {
    const mcp = await Sandbox.create({ mcp: { exa: { apiKey: 'x' } } }).catch((e: unknown) => e);
    expect(mcp).toBeInstanceOf(SandboxError);
    expect((mcp as Error).message).toBe('400: MCP gateways are not supported by Moat');
    const volumes = await Sandbox.create({ volumeMounts: { '/data': 'vol' } }).catch(
      (e: unknown) => e,
    );
    expect(volumes).toBeInstanceOf(SandboxError);
    expect((volumes as Error).message).toBe('400: volume mounts are not supported by Moat');
  });
});

describe('signed file URLs, as E2B signs them', () => {
  /** A form whose `file` is a plain field (no Blob), as E2B's own signing test sends it. */
  const fieldForm = (content: string) => {
    const form = new FormData();
    form.append('file', content);
    return form;
  };

  it('upload as user and as root to a relative path; the content lands in that home', async () => {
    const sbx = await sandbox();
    for (const [user, home] of [
      [undefined, '/home/user'],
      ['root', '/root'],
    ] as const) {
      const url = await sbx.uploadUrl('hello.txt', { user, useSignatureExpiration: 10_000 });
      const response = await fetch(url, { method: 'POST', body: fieldForm(`for ${home}`) });
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual([
        { name: 'hello.txt', path: `${home}/hello.txt`, type: 'file' },
      ]);
      expect(await sbx.files.read(`${home}/hello.txt`, { user: 'root' })).toBe(`for ${home}`);
    }
    // A root signature is no user signature: the user named is part of what is signed.
    const asRoot = new URL(await sbx.downloadUrl('hello.txt', { user: 'root' }));
    asRoot.searchParams.set('username', 'user');
    expect((await fetch(asRoot)).status).toBe(401);
  });

  it('download as root with a signature that has not expired', async () => {
    const sbx = await sandbox();
    await sbx.files.write('hello.txt', 'hello root', { user: 'root' });
    const url = await sbx.downloadUrl('hello.txt', {
      user: 'root',
      useSignatureExpiration: 10_000,
    });
    const response = await fetch(url);
    expect(response.status).toBe(200);
    expect(await response.text()).toBe('hello root');
  });

  it('an expired signature is 401 {code, message: "signature is already expired"}, exactly envd’s body', async () => {
    const sbx = await sandbox();
    await sbx.files.write('hello.txt', 'hello world');
    const download = await sbx.downloadUrl('hello.txt', { useSignatureExpiration: -10_000 });
    const upload = await sbx.uploadUrl('hello.txt', { useSignatureExpiration: -100_000 });
    for (const response of [
      await fetch(download),
      await fetch(upload, { method: 'POST', body: fieldForm('late') }),
    ]) {
      expect(response.status).toBe(401);
      expect(await response.json()).toEqual({ code: 401, message: 'signature is already expired' });
    }
    expect(await sbx.files.read('hello.txt')).toBe('hello world');
  });

  it('a signature made for another path, user or operation is 401 {code, message: "invalid signature"}', async () => {
    const sbx = await sandbox();
    await sbx.files.write('hello.txt', 'hello world');
    const otherPath = new URL(
      await sbx.downloadUrl('hello.txt', { useSignatureExpiration: 10_000 }),
    );
    otherPath.searchParams.set('path', 'other.txt');
    const otherUser = new URL(await sbx.downloadUrl('hello.txt', { user: 'root' }));
    otherUser.searchParams.set('username', 'user');
    const readAsWrite = await sbx.uploadUrl('hello.txt');
    for (const url of [otherPath, otherUser, readAsWrite]) {
      const response = await fetch(url);
      expect(response.status, String(url)).toBe(401);
      expect(await response.json()).toEqual({ code: 401, message: 'invalid signature' });
    }
  });

  it('an upload field over 64 KiB is refused, not truncated', async () => {
    const sbx = await sandbox();
    const url = await sbx.uploadUrl('big.txt');
    const response = await fetch(url, { method: 'POST', body: fieldForm('x'.repeat(65 << 10)) });
    expect(response.status).toBe(413);
    expect(await sbx.files.exists('big.txt')).toBe(false);
  });
});

describe('file metadata set through xattrs inside the sandbox', () => {
  it('user.e2b.* xattrs are the metadata of getInfo and list; other xattrs are not', async () => {
    const sbx = await sandbox();
    await sbx.files.makeDir('tagged');
    await sbx.files.write('tagged/x.txt', 'content');
    // setfattr is not on every host; python3 is (Moat's supervisor needs it).
    await sbx.commands.run(
      `python3 -c "import os; p='/home/user/tagged/x.txt'; os.setxattr(p, 'user.e2b.author', b'mish'); os.setxattr(p, 'user.other', b'hidden')"`,
    );
    expect((await sbx.files.getInfo('tagged/x.txt')).metadata).toEqual({ author: 'mish' });
    const listed = await sbx.files.list('tagged');
    expect(listed.find((e) => e.name === 'x.txt')?.metadata).toEqual({ author: 'mish' });
  });
});

describe('a terminal with no size (CI)', () => {
  it('0x0 gets 80x24; a negative or huge size is refused', async () => {
    const sbx = await sandbox();
    let output = '';
    const terminal = await sbx.pty.create({
      cols: 0,
      rows: 0,
      onData: (data) => void (output += Buffer.from(data).toString('utf8')),
    });
    await sbx.pty.sendInput(terminal.pid, Buffer.from("stty size; echo RE''ADY\n"));
    await expect.poll(() => output, { timeout: 15_000 }).toContain('READY');
    expect(output).toContain('24 80');
    expect(await sbx.pty.kill(terminal.pid)).toBe(true);
    await terminal.wait().catch(() => undefined);
    for (const [cols, rows] of [
      [-1, 24],
      [80, 10_001],
    ] as const) {
      await expect(sbx.pty.create({ cols, rows, onData: () => undefined })).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
    }
  });
});

describe('a sandbox killed while a command runs', () => {
  it('the command fails with the SDK\'s "sandbox was killed" error, not the command\'s', async () => {
    const sbx = await sandbox();
    const command = await sbx.commands.run('sleep 60', { background: true });
    await sbx.kill();
    const error = await command.wait().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TimeoutError);
    expect((error as Error).message).toContain('sandbox was killed or reached its end of life');
  });

  it('a command that ends on its own still ends with its own status', async () => {
    const sbx = await sandbox();
    const command = await sbx.commands.run('sleep 0.2; exit 4', { background: true });
    const error = await command.wait().catch((e: unknown) => e);
    expect((error as { exitCode?: number }).exitCode).toBe(4);
  });
});

describe('sudo in a command', () => {
  it('bash command scoped env vars do not reach a later command, sudo or not', async () => {
    const sbx = await sandbox();
    const scoped = await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } });
    expect([scoped.exitCode, scoped.stdout.trim()]).toEqual([0, 'bar']);
    const later = await sbx.commands.run('sudo echo "$FOO"');
    expect([later.exitCode, later.stdout.trim()]).toEqual([0, '']);
  });

  it('sudo runs the command as the caller, and says so unless that is root', async () => {
    const sbx = await sandbox();
    const asUser = await sbx.commands.run('sudo -E -u root whoami; bash -c "sudo id -un"');
    expect(asUser.stdout).toBe('user\nuser\n');
    expect(asUser.stderr).toContain('a Moat sandbox cannot raise privileges; running as user');
    expect(asUser.stderr).toContain("user: 'root'");
    const asRoot = await sbx.commands.run('sudo whoami', { user: 'root' });
    expect([asRoot.stdout, asRoot.stderr]).toEqual(['root\n', '']);
    // Its exit status is the command's.
    const failing = await sbx.commands.run('sudo false').catch((e: unknown) => e);
    expect((failing as { exitCode?: number }).exitCode).toBe(1);
  });
});
