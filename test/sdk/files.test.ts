/**
 * The real `e2b` SDK against Moat, beyond commands: secure sandboxes (the access token), the
 * filesystem (write, read, list, stat, makeDir, rename, remove, watchDir), signed file URLs used
 * by a plain HTTP client, snapshots, paginated listing and the rest of the lifecycle.
 */
import {
  FileNotFoundError,
  type FilesystemEvent,
  Sandbox,
  SandboxError,
  type SandboxOpts,
  TimeoutError,
} from 'e2b';
import diagnostics from 'node:diagnostics_channel';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

let harness: SdkMoat;

const sandbox = (options: SandboxOpts = {}) => harness.sandbox(options);

const fromTemplate = (template: string) => harness.sandbox({}, template);

beforeAll(async () => {
  harness = await startSdkMoat();
});

afterAll(() => harness.stop());

/** The token the SDK keeps (protected on Sandbox) and sends as X-Access-Token. */
const accessToken = (sbx: Sandbox) =>
  (sbx as unknown as { envdAccessToken?: string }).envdAccessToken;

const stdout = async (sbx: Sandbox, cmd: string) => (await sbx.commands.run(cmd)).stdout;

/** A request to the sandbox API the way the SDK routes it (headers), with or without a token. */
function sandboxApi(
  sbx: Sandbox,
  path: string,
  options: { token?: string; method?: string; body?: string; headers?: Record<string, string> },
): Promise<Response> {
  return fetch(`${harness.sandboxUrl}${path}`, {
    method: options.method ?? 'GET',
    body: options.body,
    headers: {
      'E2b-Sandbox-Id': sbx.sandboxId,
      'E2b-Sandbox-Port': '49983',
      ...(options.token === undefined ? {} : { 'X-Access-Token': options.token }),
      ...options.headers,
    },
  });
}

interface SeenRequest {
  readonly method: string;
  readonly path: string;
  readonly headers: Record<string, string>;
}

/**
 * The HTTP requests `action` makes to the sandbox listener, as undici (the SDK's HTTP client)
 * publishes them on its diagnostics channel: what the SDK put on the wire, Moat untouched.
 */
async function requestsDuring(action: () => Promise<unknown>): Promise<SeenRequest[]> {
  const seen: SeenRequest[] = [];
  const onCreate = (message: unknown) => {
    const { request } = message as {
      request: { origin: string; method: string; path: string; headers: string[] | string };
    };
    if (String(request.origin) !== harness.sandboxUrl) return;
    const headers: Record<string, string> = {};
    const raw = Array.isArray(request.headers) ? request.headers : [];
    for (let i = 0; i + 1 < raw.length; i += 2) headers[raw[i]!.toLowerCase()] = raw[i + 1]!;
    seen.push({ method: request.method, path: request.path, headers });
  };
  diagnostics.subscribe('undici:request:create', onCreate);
  try {
    await action();
  } finally {
    diagnostics.unsubscribe('undici:request:create', onCreate);
  }
  return seen;
}

const uploads = (seen: SeenRequest[]) =>
  seen.filter((r) => r.method === 'POST' && r.path.startsWith('/files'));

/** Every page of a paginator (bounded), so a server that never ends its cursor fails. */
async function allPages<T>(paginator: {
  hasNext: boolean;
  nextItems(): Promise<T[]>;
}): Promise<T[][]> {
  const pages: T[][] = [];
  while (paginator.hasNext) {
    if (pages.length >= 20) throw new Error('more than 20 pages');
    pages.push(await paginator.nextItems());
  }
  return pages;
}

async function collect(stream: ReadableStream<Uint8Array>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) {
    chunks.push(Buffer.from(chunk));
  }
  return Buffer.concat(chunks);
}

const streamOf = (...parts: string[]) =>
  new ReadableStream<Uint8Array>({
    start(controller) {
      for (const part of parts) controller.enqueue(new TextEncoder().encode(part));
      controller.close();
    },
  });

describe('secure sandboxes', () => {
  it('create with metadata and envs; the sandbox API refuses callers without the token', async () => {
    const tag = `secure-${Date.now()}`;
    const sbx = await sandbox({ metadata: { suite: tag }, envs: { GREETING: 'hi there' } });
    const token = accessToken(sbx);
    expect(token).toEqual(expect.any(String));
    expect(token!.length).toBeGreaterThanOrEqual(20);
    expect((await sbx.getInfo()).metadata).toEqual({ suite: tag });
    // The SDK itself sends the token, so its calls work.
    expect(await stdout(sbx, 'echo "$GREETING"')).toBe('hi there\n');

    const withToken = await sandboxApi(sbx, '/envs', { token });
    expect(withToken.status).toBe(200);
    expect(await withToken.json()).toMatchObject({ GREETING: 'hi there' });

    const rpc = (t: string | undefined) =>
      sandboxApi(sbx, '/process.Process/List', {
        token: t,
        method: 'POST',
        body: '{}',
        headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' },
      });
    const wrong = 'x'.repeat(token!.length);
    const refused = [
      await sandboxApi(sbx, '/envs', {}),
      await sandboxApi(sbx, '/envs', { token: wrong }),
      await sandboxApi(sbx, '/files?path=%2Fetc%2Fhostname', {}),
      await rpc(undefined),
      await rpc(wrong),
    ];
    expect(refused.map((r) => r.status)).toEqual([401, 401, 401, 401, 401]);
    expect((await rpc(token)).status).toBe(200);
    // Health answers anyone (it is how isRunning works).
    expect((await sandboxApi(sbx, '/health', {})).status).toBe(204);
  });
});

describe('files.write', () => {
  it('writes a string, an ArrayBuffer and a Blob, returning the written entry', async () => {
    const sbx = await sandbox();
    const bytes = new Uint8Array([0, 1, 2, 200, 255, 10]);
    const cases: { path: string; data: string | ArrayBuffer | Blob; expected: Buffer }[] = [
      { path: '/home/user/w/s.txt', data: 'a string\n', expected: Buffer.from('a string\n') },
      { path: '/home/user/w/b.bin', data: bytes.buffer, expected: Buffer.from(bytes) },
      {
        path: '/tmp/w/blob.txt',
        data: new Blob(['from ', 'a blob']),
        expected: Buffer.from('from a blob'),
      },
    ];
    for (const { path, data, expected } of cases) {
      const info = await sbx.files.write(path, data);
      expect(info).toMatchObject({ name: path.split('/').pop(), type: 'file', path });
      expect(Buffer.from(await sbx.files.read(path, { format: 'bytes' }))).toEqual(expected);
    }
  });

  it('writes many files in one multipart request; relative paths land in /home/user', async () => {
    const sbx = await sandbox();
    let infos: Awaited<ReturnType<typeof sbx.files.write>> = [];
    const seen = await requestsDuring(async () => {
      infos = await sbx.files.write([
        { path: 'multi/a.txt', data: 'A' },
        { path: '/tmp/multi/b.txt', data: 'B' },
        { path: 'multi/deep/c.txt', data: new Blob(['C']) },
      ]);
    });
    expect(uploads(seen)).toHaveLength(1);
    expect(uploads(seen)[0]!.headers['content-type']).toMatch(/^multipart\/form-data/);
    expect(infos.map((i) => i.path)).toEqual([
      '/home/user/multi/a.txt',
      '/tmp/multi/b.txt',
      '/home/user/multi/deep/c.txt',
    ]);
    expect(await stdout(sbx, 'cat multi/a.txt /tmp/multi/b.txt multi/deep/c.txt')).toBe('ABC');
  });

  it.each([
    { how: 'useOctetStream', data: () => 'octet body', options: { useOctetStream: true } },
    { how: 'a ReadableStream', data: () => streamOf('streamed ', 'body'), options: {} },
    { how: 'gzip', data: () => 'gzipped body '.repeat(50), options: { gzip: true } },
  ])('uploads as application/octet-stream with $how', async ({ data, options }) => {
    const sbx = await sandbox();
    const body = data();
    const expected = typeof body === 'string' ? body : 'streamed body';
    const seen = await requestsDuring(() => sbx.files.write('octet/x.txt', body, options));
    expect(uploads(seen)).toHaveLength(1);
    const headers = uploads(seen)[0]!.headers;
    expect(headers['content-type']).toBe('application/octet-stream');
    expect(headers['content-encoding']).toBe(options.gzip ? 'gzip' : undefined);
    expect(await sbx.files.read('/home/user/octet/x.txt')).toBe(expected);
  });

  it('as the default user, writes where only root may create: the new folders and file are the user’s', async () => {
    const sbx = await sandbox();
    // E2B's own test writes these as `user`: envd makes them as root and hands them over.
    const files = [
      { path: '/0/multi_test_file0.txt', data: 'zero' },
      { path: '/home/user/multi_test_file1.txt', data: 'one' },
      { path: '/2/deep/multi_test_file2.txt', data: 'two' },
    ];
    const infos = await sbx.files.write(files);
    expect(infos.map((i) => i.path)).toEqual(files.map((f) => f.path));
    for (const { path, data } of files) expect(await sbx.files.read(path)).toBe(data);
    const owners = await stdout(
      sbx,
      "stat -c '%n %U:%G %a' / /0 /0/multi_test_file0.txt /2 /2/deep /2/deep/multi_test_file2.txt",
    );
    expect(owners.trim().split('\n')).toEqual([
      '/ root:root 755',
      '/0 user:user 755',
      '/0/multi_test_file0.txt user:user 644',
      '/2 user:user 755',
      '/2/deep user:user 755',
      '/2/deep/multi_test_file2.txt user:user 644',
    ]);
    // What exists stays as it is: root's file in root's folder is not the user's to replace.
    await sbx.files.write('/rooted/kept.txt', 'root’s', { user: 'root' });
    await expect(sbx.files.write('/rooted/kept.txt', 'the user’s')).rejects.toThrow(
      /cannot write '\/rooted\/kept.txt': permission denied/,
    );
    expect(await sbx.files.read('/rooted/kept.txt')).toBe('root’s');
  });

  it('stores metadata on the file; getInfo and list return it', async () => {
    const sbx = await sandbox();
    const info = await sbx.files.write('meta.txt', 'm', {
      metadata: { Owner: 'alice', stage: '2' },
    });
    // Keys are lowercased by the sandbox.
    expect(info.metadata).toEqual({ owner: 'alice', stage: '2' });
    expect((await sbx.files.getInfo('meta.txt')).metadata).toEqual({ owner: 'alice', stage: '2' });
    const listed = await sbx.files.list('/home/user');
    expect(listed.find((e) => e.name === 'meta.txt')?.metadata).toEqual({
      owner: 'alice',
      stage: '2',
    });
    // A file written without metadata has none.
    await sbx.files.write('plain.txt', 'p');
    expect((await sbx.files.getInfo('plain.txt')).metadata).toBeUndefined();
  });
});

describe('files.read', () => {
  it('reads text, bytes, a blob and a stream', async () => {
    const sbx = await sandbox();
    const content = 'line one\nline two ✓\n';
    await sbx.files.write('r.txt', content);
    expect(await sbx.files.read('r.txt')).toBe(content);
    expect(await sbx.files.read('/home/user/r.txt', { format: 'text' })).toBe(content);
    expect(Buffer.from(await sbx.files.read('r.txt', { format: 'bytes' })).toString()).toBe(
      content,
    );
    expect(await (await sbx.files.read('r.txt', { format: 'blob' })).text()).toBe(content);
    expect((await collect(await sbx.files.read('r.txt', { format: 'stream' }))).toString()).toBe(
      content,
    );
    // An empty file reads as empty, not as a missing body.
    await sbx.files.write('empty.txt', '');
    expect(await sbx.files.read('empty.txt')).toBe('');
  });

  it('throws FileNotFoundError for a missing file (read and getInfo)', async () => {
    const sbx = await sandbox();
    await expect(sbx.files.read('/home/user/nope.txt')).rejects.toBeInstanceOf(FileNotFoundError);
    await expect(sbx.files.read('nope.txt', { format: 'bytes' })).rejects.toBeInstanceOf(
      FileNotFoundError,
    );
    await expect(sbx.files.getInfo('nope.txt')).rejects.toBeInstanceOf(FileNotFoundError);
  });
});

describe('files: list, exists, getInfo, makeDir, rename, remove', () => {
  it('lists one level with depth 1 and three levels with depth 3', async () => {
    const sbx = await sandbox();
    await sbx.commands.run(
      'mkdir -p t/sub/deep/deeper && touch t/a.txt t/sub/b.txt t/sub/deep/c.txt t/sub/deep/deeper/e.txt',
    );
    const paths = async (depth: number) =>
      (await sbx.files.list('t', { depth })).map((e) => e.path).sort();
    expect(await paths(1)).toEqual(['/home/user/t/a.txt', '/home/user/t/sub']);
    expect(await paths(3)).toEqual(
      [
        'a.txt',
        'sub',
        'sub/b.txt',
        'sub/deep',
        'sub/deep/c.txt',
        'sub/deep/deeper', // its content is level 4
      ].map((p) => `/home/user/t/${p}`),
    );
    const types = new Map((await sbx.files.list('/home/user/t')).map((e) => [e.name, e.type]));
    expect(types).toEqual(
      new Map([
        ['a.txt', 'file'],
        ['sub', 'dir'],
      ]),
    );
  });

  it('exists is true for a file and a folder, false for a missing path', async () => {
    const sbx = await sandbox();
    await sbx.files.write('here.txt', 'x');
    expect(await sbx.files.exists('here.txt')).toBe(true);
    expect(await sbx.files.exists('/home/user')).toBe(true);
    expect(await sbx.files.exists('/home/user/not-here.txt')).toBe(false);
  });

  it('getInfo agrees with stat inside the sandbox', async () => {
    const sbx = await sandbox();
    const before = Date.now();
    await sbx.files.write('info.txt', '12345');
    await sbx.commands.run('chmod 640 info.txt && mkdir -p infodir');
    const file = await sbx.files.getInfo('info.txt');
    expect(file).toMatchObject({
      name: 'info.txt',
      type: 'file',
      path: '/home/user/info.txt',
      size: 5,
      permissions: '-rw-r-----',
      owner: 'user',
      group: 'user',
    });
    expect(file.mode & 0o777).toBe(0o640);
    expect(file.modifiedTime!.getTime()).toBeGreaterThanOrEqual(before - 2000);
    expect(file.modifiedTime!.getTime()).toBeLessThanOrEqual(Date.now() + 2000);
    const [permissions, size, owner] = (await stdout(sbx, "stat -c '%A %s %U' info.txt"))
      .trim()
      .split(' ');
    expect([file.permissions, String(file.size), file.owner]).toEqual([permissions, size, owner]);
    const dir = await sbx.files.getInfo('/home/user/infodir');
    expect(dir).toMatchObject({ name: 'infodir', type: 'dir', path: '/home/user/infodir' });
    expect(dir.permissions.startsWith('d')).toBe(true);
  });

  it('makeDir creates parents and answers false when the folder exists', async () => {
    const sbx = await sandbox();
    expect(await sbx.files.makeDir('/tmp/made/a/b')).toBe(true);
    expect((await sbx.files.getInfo('/tmp/made/a/b')).type).toBe('dir');
    expect(await sbx.files.makeDir('/tmp/made/a/b')).toBe(false);
    expect(await sbx.files.makeDir('relmade')).toBe(true);
    expect(await stdout(sbx, 'test -d /home/user/relmade && echo yes')).toBe('yes\n');
  });

  it('rename moves a file and returns its new entry; remove deletes files and folders', async () => {
    const sbx = await sandbox();
    await sbx.files.write('old.txt', 'moving');
    const moved = await sbx.files.rename('old.txt', '/home/user/newdir/new.txt');
    expect(moved).toMatchObject({
      name: 'new.txt',
      type: 'file',
      path: '/home/user/newdir/new.txt',
    });
    expect(await sbx.files.exists('old.txt')).toBe(false);
    expect(await sbx.files.read('newdir/new.txt')).toBe('moving');

    await sbx.files.remove('newdir/new.txt');
    expect(await sbx.files.exists('newdir/new.txt')).toBe(false);
    await sbx.files.write('gone/inner/f.txt', 'f');
    await sbx.files.remove('/home/user/gone');
    expect(await sbx.files.exists('gone')).toBe(false);
    expect(await stdout(sbx, 'ls -A /home/user/gone 2>&1 || true')).toMatch(/No such file/);
  });
});

describe('files and commands see the same filesystem', () => {
  it('SDK writes are visible to commands and command writes to the SDK; relative = /home/user', async () => {
    const sbx = await sandbox();
    await sbx.files.write('x', 'written by the SDK');
    expect(await stdout(sbx, 'cat /home/user/x')).toBe('written by the SDK');
    expect(await stdout(sbx, "stat -c '%U' /home/user/x")).toBe('user\n');

    await sbx.commands.run('mkdir -p rel && printf "from a command" > rel/y.txt');
    expect(await sbx.files.read('/home/user/rel/y.txt')).toBe('from a command');
    expect(await sbx.files.read('rel/y.txt')).toBe('from a command');
    expect((await sbx.files.getInfo('rel/y.txt')).path).toBe('/home/user/rel/y.txt');
  });
});

describe('watchDir', () => {
  /** Starts a watch that records its events; `until` polls for one. */
  async function watching(
    sbx: Sandbox,
    path: string,
    options: { recursive?: boolean; includeEntry?: boolean } = {},
  ) {
    const events: FilesystemEvent[] = [];
    let exited: { error?: Error } | undefined;
    const handle = await sbx.files.watchDir(path, (event) => void events.push(event), {
      ...options,
      onExit: (error) => void (exited = { error }),
    });
    const until = (name: string, type: string) =>
      expect
        .poll(() => events.some((e) => e.name === name && e.type === type), { timeout: 15_000 })
        .toBe(true);
    return { events, handle, until, exited: () => exited };
  }

  it('reports create, write and remove, and nothing after stop()', async () => {
    const sbx = await sandbox();
    await sbx.files.makeDir('watched');
    const watch = await watching(sbx, '/home/user/watched');
    await sbx.commands.run('echo one > watched/f.txt');
    await watch.until('f.txt', 'create');
    await watch.until('f.txt', 'write');
    await sbx.files.remove('watched/f.txt');
    await watch.until('f.txt', 'remove');

    await watch.handle.stop();
    await expect.poll(() => watch.exited(), { timeout: 15_000 }).toBeDefined();
    // stop() aborts the stream: the SDK reports that as a canceled TimeoutError.
    expect(watch.exited()!.error).toBeInstanceOf(TimeoutError);
    const count = watch.events.length;
    await sbx.commands.run('echo two > watched/late.txt');
    await sleep(300);
    expect(watch.events.length).toBe(count);
  });

  it('recursive sees subfolders (names relative to the watched folder); includeEntry', async () => {
    const sbx = await sandbox();
    await sbx.files.makeDir('rw/sub');
    const flat = await watching(sbx, 'rw');
    const deep = await watching(sbx, 'rw', { recursive: true, includeEntry: true });
    await sbx.files.write('rw/sub/inner.txt', 'inner');
    await sbx.files.write('rw/top.txt', 'top');
    await deep.until('sub/inner.txt', 'write');
    await deep.until('top.txt', 'write');
    await flat.until('top.txt', 'write');
    const created = deep.events.find((e) => e.name === 'sub/inner.txt' && e.type === 'create');
    expect(created?.entry).toMatchObject({
      name: 'inner.txt',
      type: 'file',
      path: '/home/user/rw/sub/inner.txt',
    });
    // Without recursive, the subfolder's file is never reported (only, at most, the folder).
    expect(flat.events.some((e) => e.name.includes('inner.txt'))).toBe(false);
    expect(flat.events.every((e) => e.entry === undefined)).toBe(true);
    await flat.handle.stop();
    await deep.handle.stop();
  });
});

describe('signed file URLs (no sandbox id in them: the listener finds it by signature)', () => {
  it('downloadUrl works with plain fetch; a tampered signature or path is 401', async () => {
    const sbx = await sandbox();
    await sandbox(); // another secure sandbox whose token must not match
    await sbx.files.write('/home/user/d.txt', 'download me');
    await sbx.files.write('/home/user/other.txt', 'not signed');
    const url = new URL(await sbx.downloadUrl('/home/user/d.txt'));
    expect(url.origin).toBe(harness.sandboxUrl);
    expect(url.pathname).toBe('/files');
    expect(url.href).not.toContain(sbx.sandboxId);
    const response = await fetch(url);
    expect(response.status).toBe(200);
    expect(await response.text()).toBe('download me');

    const signature = url.searchParams.get('signature')!;
    expect(signature).toMatch(/^v1_/);
    const tampered = new URL(url);
    // A character in the middle: the last one of unpadded base64 partly carries padding bits.
    const swapped = signature[10] === 'A' ? 'B' : 'A';
    tampered.searchParams.set('signature', signature.slice(0, 10) + swapped + signature.slice(11));
    const otherPath = new URL(url);
    otherPath.searchParams.set('path', '/home/user/other.txt');
    const unsigned = new URL(url);
    unsigned.searchParams.delete('signature');
    for (const bad of [tampered, otherPath]) {
      const refused = await fetch(bad);
      expect(refused.status).toBe(401);
      expect(await refused.text()).not.toContain('not signed');
    }
    // Without a signature nothing names the sandbox: refused, not served.
    expect((await fetch(unsigned)).status).toBeGreaterThanOrEqual(400);
  });

  it('a relative path and an expiration in the future work; an expired one is 401', async () => {
    const sbx = await sandbox();
    await sbx.files.write('rel.txt', 'relative');
    const fresh = await sbx.downloadUrl('rel.txt', { useSignatureExpiration: 60 });
    expect(new URL(fresh).searchParams.get('signature_expiration')).toMatch(/^[0-9]+$/);
    expect(await (await fetch(fresh)).text()).toBe('relative');
    const expired = await sbx.downloadUrl('rel.txt', { useSignatureExpiration: -10 });
    expect((await fetch(expired)).status).toBe(401);
  });

  it('uploadUrl takes a multipart upload from plain fetch, and is no download URL', async () => {
    const sbx = await sandbox();
    const url = await sbx.uploadUrl('/home/user/up/load.txt');
    const form = new FormData();
    form.append('file', new Blob(['uploaded with fetch']), 'load.txt');
    const response = await fetch(url, { method: 'POST', body: form });
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual([
      expect.objectContaining({ name: 'load.txt', path: '/home/user/up/load.txt' }),
    ]);
    expect(await sbx.files.read('up/load.txt')).toBe('uploaded with fetch');
    // A write signature does not grant reads.
    expect((await fetch(url)).status).toBe(401);

    // Without a path the signature covers "" and each part names its own target.
    const anywhere = await sbx.uploadUrl();
    const parts = new FormData();
    parts.append('file', new Blob(['part']), 'parts/p.txt');
    expect((await fetch(anywhere, { method: 'POST', body: parts })).status).toBe(200);
    expect(await stdout(sbx, 'cat /home/user/parts/p.txt')).toBe('part');
  });
});

describe('snapshots', () => {
  it('createSnapshot without a name; a sandbox from it has its files; deleteSnapshot', async () => {
    const sbx = await sandbox();
    await sbx.files.write('snap/kept.txt', 'in the snapshot');
    const snapshot = await sbx.createSnapshot();
    expect(snapshot.snapshotId).toMatch(/^[^/]+:default$/);
    expect(snapshot.names).toEqual([]);
    // The source keeps running, and a later change is not in the snapshot.
    await sbx.files.write('snap/later.txt', 'after');

    const child = await fromTemplate(snapshot.snapshotId);
    expect(await child.files.read('snap/kept.txt')).toBe('in the snapshot');
    expect(await child.files.exists('snap/later.txt')).toBe(false);
    expect((await child.getInfo()).templateId).toBe(snapshot.snapshotId);
    expect(await child.kill()).toBe(true);

    expect(await Sandbox.deleteSnapshot(snapshot.snapshotId)).toBe(true);
    expect(await Sandbox.deleteSnapshot(snapshot.snapshotId)).toBe(false);
    await expect(
      Sandbox.create(snapshot.snapshotId, { timeoutMs: 120_000 }),
    ).rejects.toBeInstanceOf(SandboxError);
  });

  it('named snapshots; listSnapshots per sandbox and across pages', async () => {
    const sbx = await sandbox();
    const other = await sandbox();
    const name = `files-suite-${Date.now()}`;
    const named = await sbx.createSnapshot({ name });
    expect(named.snapshotId.endsWith(`/${name}:default`)).toBe(true);
    expect(named.names).toEqual([named.snapshotId]);
    const unnamed = await sbx.createSnapshot();
    const elsewhere = await other.createSnapshot();

    const ids = (pages: { snapshotId: string }[][]) => pages.flat().map((s) => s.snapshotId);
    const own = ids(await allPages(sbx.listSnapshots()));
    expect(own.sort()).toEqual([named.snapshotId, unnamed.snapshotId].sort());

    const pages = await allPages(Sandbox.listSnapshots({ limit: 1 }));
    expect(pages.every((p) => p.length <= 1)).toBe(true);
    const all = ids(pages);
    expect(new Set(all).size).toBe(all.length);
    expect(all).toEqual(
      expect.arrayContaining([named.snapshotId, unnamed.snapshotId, elsewhere.snapshotId]),
    );
    // Newest first.
    expect(all.indexOf(elsewhere.snapshotId)).toBeLessThan(all.indexOf(named.snapshotId));

    expect(ids(await allPages(Sandbox.listSnapshots({ name })))).toEqual([named.snapshotId]);
    const child = await fromTemplate(named.snapshotId);
    expect(await child.files.exists('/home/user')).toBe(true);
  });
});

describe('listing and lifecycle', () => {
  it('Sandbox.list with a metadata filter walks every page once', async () => {
    const tag = `batch-${Date.now()}`;
    const mine = await Promise.all(
      Array.from({ length: 5 }, (_, i) => sandbox({ metadata: { batch: tag, n: String(i) } })),
    );
    await sandbox({ metadata: { batch: `${tag}-not` } });
    const paginator = Sandbox.list({ query: { metadata: { batch: tag } }, limit: 2 });
    expect(paginator.hasNext).toBe(true);
    const pages = await allPages(paginator);
    expect(pages.map((p) => p.length)).toEqual([2, 2, 1]);
    expect(paginator.hasNext).toBe(false);
    expect(paginator.nextToken).toBeUndefined();
    const listed = pages.flat().map((s) => s.sandboxId);
    expect(new Set(listed).size).toBe(5);
    expect([...listed].sort()).toEqual(mine.map((s) => s.sandboxId).sort());
    expect(pages.flat().every((s) => s.metadata['batch'] === tag && s.state === 'running')).toBe(
      true,
    );
  });

  it('getInfo fields; isRunning; kill answers true, then false', async () => {
    const before = Date.now();
    const sbx = await sandbox({ metadata: { role: 'info' } });
    const info = await sbx.getInfo();
    expect(info).toMatchObject({
      sandboxId: sbx.sandboxId,
      templateId: 'base',
      metadata: { role: 'info' },
      state: 'running',
      envdVersion: '0.6.4',
      // `domain` is deprecated and always null (spec), so the SDK falls back to E2B_DOMAIN.
      sandboxDomain: undefined,
    });
    expect(info.cpuCount).toBeGreaterThan(0);
    expect(info.memoryMB).toBeGreaterThan(0);
    expect(info.startedAt.getTime()).toBeGreaterThanOrEqual(before - 2000);
    expect(info.startedAt.getTime()).toBeLessThanOrEqual(Date.now() + 2000);
    // timeoutMs 120_000 from creation.
    expect(info.endAt.getTime() - info.startedAt.getTime()).toBeGreaterThanOrEqual(119_000);
    expect(info.endAt.getTime() - info.startedAt.getTime()).toBeLessThanOrEqual(122_000);

    expect(await sbx.isRunning()).toBe(true);
    expect(await sbx.kill()).toBe(true);
    expect(await sbx.isRunning()).toBe(false);
    expect(await sbx.kill()).toBe(false);
    expect(await Sandbox.kill(sbx.sandboxId)).toBe(false);
    await expect(sbx.files.read('/etc/hostname')).rejects.toBeInstanceOf(SandboxError);
  });
});
