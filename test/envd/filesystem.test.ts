/**
 * The sandbox API's filesystem: `filesystem.Filesystem` over Connect JSON, REST /files and
 * /files/compose, through real HTTP on loopback against SandboxApi with real sandboxes of a
 * ProcessRuntime (confined where this host allows it). Files are set up and checked by commands
 * run inside the sandbox, as the sandbox sees them; the last block checks that no path (`..`,
 * absolute, symlinks pointing at host paths) reads or writes anything of the host.
 */
import { createHash } from 'node:crypto';
import {
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type EnvdSandbox, SandboxApi } from '../../src/envd/index.js';
import { ProcessRuntime, type RuntimeSandbox } from '../../src/runtime/index.js';
import { envelope, type Frame as ConnectFrame, StreamCall } from '../support/connect-client.js';
import { shell } from '../support/sandbox-shell.js';
import { BUDGETS } from '../confinement/runtime-harness.js';

const OPEN = 'ifsopen000000000000001';
const SECURE = 'ifssecure00000000000001';
const TOKEN = 'envd-token-fs-1';
const LIMITS = { cpuCount: 1, memoryMB: 512, diskSizeMB: 512, pids: 512 };

let dataDir: string;
let outside: string;
let runtime: ProcessRuntime;
let server: http.Server;
let base: string;
const sandboxes = new Map<string, EnvdSandbox>();
const SECRET = 'host secret, never served';

const runtimeOf = (id: string): RuntimeSandbox => sandboxes.get(id)!.runtime;
/** A shell command inside the open sandbox (as `user` unless told); its stdout. */
const sh = (script: string, ...args: string[]) => shell(runtimeOf(OPEN), script, { args });
const shAs = (user: string, script: string, ...args: string[]) =>
  shell(runtimeOf(OPEN), script, { user, args });
const cat = (view: string) => sh('cat -- "$1"', view);
const exists = async (view: string) =>
  (await sh('if [ -e "$1" ] || [ -L "$1" ]; then echo yes; else echo no; fi', view)).trim() ===
  'yes';
const names = async (view: string) =>
  (await sh('ls -A -- "$1"', view)).split('\n').filter((n) => n !== '');
const put = (view: string, data: string | Buffer) =>
  shell(runtimeOf(OPEN), 'cat > "$1"', { args: [view], stdin: data });
const sha256 = (data: Buffer | string) => createHash('sha256').update(data).digest('hex');
const outsideFile = () => path.join(outside, 'secret.txt');

beforeAll(async () => {
  dataDir = mkdtempSync(path.join(os.tmpdir(), 'moat-fs-'));
  outside = mkdtempSync(path.join(os.tmpdir(), 'moat-fs-outside-'));
  writeFileSync(outsideFile(), SECRET);
  runtime = await ProcessRuntime.start(dataDir, {
    allowUnconfined: true,
    ids: 'auto',
    defaultDiskMB: LIMITS.diskSizeMB,
    ...BUDGETS,
  });
  for (const [id, token] of [
    [OPEN, null],
    [SECURE, TOKEN],
  ] as const) {
    await runtime.create(id, 'base', {}, '127.0.0.1', LIMITS);
    sandboxes.set(id, {
      sandboxID: id,
      accessToken: token,
      envVars: {},
      runtime: runtime.sandbox(id)!,
      running: () => runtime.sandbox(id) !== undefined,
    });
  }
  const api = new SandboxApi(pino({ level: 'silent' }));
  server = http.createServer((request, response) => {
    const sandbox = sandboxes.get(String(request.headers['e2b-sandbox-id']));
    if (!sandbox) response.writeHead(502).end();
    else void api.handle(request, response, sandbox);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}, 60_000);

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  await runtime.destroy(OPEN);
  await runtime.destroy(SECURE);
  await runtime.stop();
  rmSync(dataDir, { recursive: true, force: true });
  rmSync(outside, { recursive: true, force: true });
});

// --- Clients ------------------------------------------------------------------------------------

interface Options {
  sandbox?: string;
  headers?: Record<string, string>;
}

const headersFor = ({ sandbox = OPEN, headers = {} }: Options) => ({
  'E2b-Sandbox-Id': sandbox,
  'E2b-Sandbox-Port': '49983',
  ...(sandbox === SECURE ? { 'X-Access-Token': TOKEN } : {}),
  ...headers,
});

const basicUser = (name: string) => ({
  Authorization: `Basic ${Buffer.from(`${name}:`).toString('base64')}`,
});

/** EntryInfo as the wire carries it. */
interface Entry {
  name: string;
  type?: string;
  path: string;
  size?: string;
  mode?: number;
  permissions: string;
  owner: string;
  group: string;
  modifiedTime: string;
  symlinkTarget?: string;
  metadata?: Record<string, string>;
}

type Event = { name: string; type: string; entry?: Entry };

/** The JSON replies these tests read (unary messages, Connect errors, REST bodies). */
interface Reply {
  code?: string | number;
  message?: string;
  sandboxID?: string;
  entry: Entry;
  entries: Entry[];
  events: Event[];
  watcherId: string;
  error?: { code: string; message: string };
  start?: object;
  keepalive?: object;
  filesystem?: Event;
}

/** A unary Connect call: status and parsed JSON body. */
async function rpc(method: string, body: object, options: Options = {}) {
  const response = await fetch(`${base}/filesystem.Filesystem/${method}`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json',
      'Connect-Protocol-Version': '1',
      ...headersFor(options),
    },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as Reply };
}

/** A unary call that must succeed. */
async function ok(method: string, body: object, options: Options = {}) {
  const reply = await rpc(method, body, options);
  expect(reply, JSON.stringify(reply.body)).toMatchObject({ status: 200 });
  return reply.body;
}

/** A unary call that must fail with this Connect code. */
async function fails(method: string, body: object, code: string, options: Options = {}) {
  const reply = await rpc(method, body, options);
  expect(reply.body.code, `${method} ${JSON.stringify(body)}: ${JSON.stringify(reply.body)}`).toBe(
    code,
  );
  expect(reply.status).not.toBe(200);
  return reply.body;
}

/** A filesystem.Filesystem server stream, read frame by frame as it arrives. */
const streamCall = (method: string, body: object, options: Options = {}) =>
  new StreamCall<Reply>(
    new URL(`${base}/filesystem.Filesystem/${method}`),
    {
      'Content-Type': 'application/connect+json',
      'Connect-Protocol-Version': '1',
      ...headersFor(options),
    },
    envelope(body),
  );

/** Opens a WatchDir stream and waits for its start message. */
async function watchDir(body: object, options: Options = {}) {
  const call = streamCall('WatchDir', body, options);
  await call.ready;
  expect(call.status).toBe(200);
  expect(call.contentType).toMatch(/^application\/connect\+json/);
  expect(await call.next()).toEqual({ flags: 0, message: { start: {} } });
  return call;
}

const eventsOf = (frames: ConnectFrame<Reply>[]): Event[] =>
  frames.filter((f) => f.message.filesystem).map((f) => f.message.filesystem as Event);
const has = (name: string, type: string) => (frames: ConnectFrame<Reply>[]) =>
  eventsOf(frames).some((e) => e.name === name && e.type === `EVENT_TYPE_${type}`);

const filesUrl = (query: Record<string, string>) => `${base}/files?${new URLSearchParams(query)}`;

async function download(query: Record<string, string>, options: Options = {}) {
  const response = await fetch(filesUrl(query), { headers: headersFor(options) });
  const bytes = Buffer.from(await response.arrayBuffer());
  return { status: response.status, headers: response.headers, bytes };
}

async function uploadForm(
  query: Record<string, string>,
  files: Array<{ filename: string; data: string | Buffer }>,
  options: Options = {},
) {
  const form = new FormData();
  for (const file of files) form.append('file', new Blob([file.data]), file.filename);
  const response = await fetch(filesUrl(query), {
    method: 'POST',
    headers: headersFor(options),
    body: form,
  });
  return { status: response.status, body: (await response.json()) as Reply & Entry[] };
}

async function uploadRaw(
  query: Record<string, string>,
  data: string | Buffer,
  options: Options = {},
) {
  const response = await fetch(filesUrl(query), {
    method: 'POST',
    headers: { 'Content-Type': 'application/octet-stream', ...headersFor(options) },
    body: data,
  });
  return { status: response.status, body: (await response.json()) as Reply & Entry[] };
}

async function compose(body: unknown, options: Options = {}) {
  const response = await fetch(`${base}/files/compose`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headersFor(options) },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as Reply & Entry[] };
}

/** A fresh folder in the user's home for one test (its path as the sandbox names it). */
let serial = 0;
async function scratch(label: string): Promise<string> {
  const view = `/home/user/${label}-${++serial}`;
  await sh('mkdir -p -- "$1"', view);
  return view;
}

/** No temporary upload/compose files left in a folder. */
const leftovers = async (folder: string) =>
  (await names(folder)).filter((n) => n.startsWith('.moat-'));

/** inotify watches held by the open sandbox's processes (its file agents hold every watch). */
async function inotifyWatches(): Promise<number> {
  let count = 0;
  for (const pid of await runtimeOf(OPEN).processIds()) {
    let fds: string[];
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    for (const fd of fds) {
      let link: string;
      try {
        link = readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        continue;
      }
      if (link !== 'anon_inode:inotify') continue;
      const info = readFileSync(`/proc/${pid}/fdinfo/${fd}`, 'utf8');
      count += info.split('\n').filter((line) => line.startsWith('inotify wd:')).length;
    }
  }
  return count;
}

const RFC3339 = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/;

// --- Stat ---------------------------------------------------------------------------------------

describe('Stat', () => {
  it('describes a file with the proto3 JSON EntryInfo the SDK parses', async () => {
    const dir = await scratch('stat');
    await sh('cd -- "$1" && printf "hello world" > a.txt && chmod 644 a.txt', dir);
    const { entry } = await ok('Stat', { path: `${dir}/a.txt` });
    expect(entry).toMatchObject({
      name: 'a.txt',
      type: 'FILE_TYPE_FILE',
      path: `${dir}/a.txt`,
      size: '11',
      mode: 0o644,
      permissions: '-rw-r--r--',
      owner: 'user',
      group: 'user',
    });
    expect(entry.modifiedTime).toMatch(RFC3339);
    const mtime = Number((await sh('stat -c %.9Y -- "$1"', `${dir}/a.txt`)).trim()) * 1000;
    expect(Math.abs(Date.parse(entry.modifiedTime) - mtime)).toBeLessThan(2);
    expect(entry.symlinkTarget).toBeUndefined();
    expect(entry.metadata).toBeUndefined();
  });

  it('resolves relative paths against the user home, and root against /root', async () => {
    const dir = await scratch('rel');
    await put(`${dir}/r.txt`, 'x');
    const { entry } = await ok('Stat', { path: `${path.basename(dir)}/r.txt` });
    expect(entry.path).toBe(`${dir}/r.txt`);
    await shAs('root', 'echo root file > /root/mine.txt');
    const asRoot = await ok('Stat', { path: 'mine.txt' }, { headers: basicUser('root') });
    expect(asRoot.entry).toMatchObject({ path: '/root/mine.txt', owner: 'root', group: 'root' });
    // The user may not look into /root.
    await fails('Stat', { path: '/root/mine.txt' }, 'permission_denied');
  });

  it('describes folders and symlinks (never following the symlink)', async () => {
    const dir = await scratch('statdir');
    await sh('cd -- "$1" && printf 12345 > target.txt && ln -s target.txt link', dir);
    const folder = await ok('Stat', { path: dir });
    expect(folder.entry).toMatchObject({ type: 'FILE_TYPE_DIRECTORY', name: path.basename(dir) });
    expect(folder.entry.permissions).toMatch(/^drwx/);
    const link = await ok('Stat', { path: `${dir}/link` });
    expect(link.entry).toMatchObject({
      type: 'FILE_TYPE_SYMLINK',
      symlinkTarget: `${dir}/target.txt`,
      permissions: 'Lrwxrwxrwx',
    });
  });

  it('answers not_found for a missing path and invalid_argument for an empty one', async () => {
    const body = await fails('Stat', { path: '/home/user/nope.txt' }, 'not_found');
    expect(body.message).toContain('/home/user/nope.txt');
    expect(body.message).not.toContain(dataDir);
    await fails('Stat', {}, 'invalid_argument');
    await fails('Stat', { path: 42 }, 'invalid_argument');
    await fails('Stat', { path: 'a\u0000b' }, 'invalid_argument');
  });
});

// --- MakeDir ------------------------------------------------------------------------------------

describe('MakeDir', () => {
  it('creates the folder with its parents and returns its entry, owned by the user', async () => {
    const dir = await scratch('mk');
    const { entry } = await ok('MakeDir', { path: `${dir}/a/b/c` });
    expect(entry).toMatchObject({
      name: 'c',
      type: 'FILE_TYPE_DIRECTORY',
      path: `${dir}/a/b/c`,
      owner: 'user',
    });
    expect((await sh('stat -c %U:%F -- "$1"', `${dir}/a/b/c`)).trim()).toBe('user:directory');
  });

  it('answers already_exists for an existing folder, invalid_argument for a file', async () => {
    const dir = await scratch('mkexists');
    await fails('MakeDir', { path: dir }, 'already_exists');
    await put(`${dir}/f`, 'x');
    await fails('MakeDir', { path: `${dir}/f` }, 'invalid_argument');
    await fails('MakeDir', { path: `${dir}/f/sub` }, 'invalid_argument');
    // Where the user may not write: permission_denied.
    await fails('MakeDir', { path: '/etc/mine' }, 'permission_denied');
  });
});

// --- Move ---------------------------------------------------------------------------------------

describe('Move', () => {
  it('renames, creating the destination parents, and returns the new entry', async () => {
    const dir = await scratch('mv');
    await put(`${dir}/a.txt`, 'moved');
    const { entry } = await ok('Move', {
      source: `${dir}/a.txt`,
      destination: `${dir}/new/place/b.txt`,
    });
    expect(entry).toMatchObject({ name: 'b.txt', path: `${dir}/new/place/b.txt`, size: '5' });
    expect(await exists(`${dir}/a.txt`)).toBe(false);
    expect(await cat(`${dir}/new/place/b.txt`)).toBe('moved');
  });

  it('answers not_found for a missing source and refuses to move the root', async () => {
    const dir = await scratch('mvmissing');
    await fails('Move', { source: `${dir}/x`, destination: `${dir}/y` }, 'not_found');
    await fails('Move', { source: '/', destination: `${dir}/root` }, 'invalid_argument');
    await fails('Move', { source: dir, destination: '/' }, 'invalid_argument');
    await fails('Move', { source: dir }, 'invalid_argument');
  });

  it('refuses to move a folder into itself', async () => {
    const dir = await scratch('mvself');
    await sh('mkdir -- "$1/a"', dir);
    await fails('Move', { source: `${dir}/a`, destination: `${dir}/a/b` }, 'invalid_argument');
  });
});

// --- ListDir ------------------------------------------------------------------------------------

describe('ListDir', () => {
  it('lists one level for depth 0 or 1, deeper levels depth-first in name order', async () => {
    const dir = await scratch('ls');
    await sh(
      'cd -- "$1" && mkdir -p b/c/d && echo -n a > a.txt && echo i > b/inner.txt && echo d > b/c/deep.txt',
      dir,
    );
    const relative = (entries: Entry[]) => entries.map((e) => e.path.slice(dir.length + 1));
    for (const depth of [undefined, 0, 1]) {
      const { entries } = await ok('ListDir', {
        path: dir,
        ...(depth === undefined ? {} : { depth }),
      });
      expect(relative(entries)).toEqual(['a.txt', 'b']);
    }
    const two = await ok('ListDir', { path: dir, depth: 2 });
    expect(relative(two.entries)).toEqual(['a.txt', 'b', 'b/c', 'b/inner.txt']);
    const all = await ok('ListDir', { path: dir, depth: '10' });
    expect(relative(all.entries)).toEqual([
      'a.txt',
      'b',
      'b/c',
      'b/c/d',
      'b/c/deep.txt',
      'b/inner.txt',
    ]);
    expect(all.entries[0]).toMatchObject({ name: 'a.txt', type: 'FILE_TYPE_FILE', size: '1' });
    expect(all.entries[1]).toMatchObject({ name: 'b', type: 'FILE_TYPE_DIRECTORY' });
  });

  it('lists symlinked folders as symlinks without entering them', async () => {
    const dir = await scratch('lslink');
    await sh('cd -- "$1" && mkdir real && echo x > real/x.txt && ln -s "$1/real" alias', dir);
    const { entries } = await ok('ListDir', { path: dir, depth: 5 });
    expect(entries.map((e) => [e.name, e.type])).toEqual([
      ['alias', 'FILE_TYPE_SYMLINK'],
      ['real', 'FILE_TYPE_DIRECTORY'],
      ['x.txt', 'FILE_TYPE_FILE'],
    ]);
    expect(entries[0]?.symlinkTarget).toBe(`${dir}/real`);
    // Listing through a symlinked folder lists the real folder.
    const through = await ok('ListDir', { path: `${dir}/alias` });
    expect(through.entries.map((e) => e.path)).toEqual([`${dir}/real/x.txt`]);
  });

  it('lists the sandbox’s own root and answers errors with Connect codes', async () => {
    const { entries } = await ok('ListDir', { path: '/' });
    const listed = entries.map((e) => e.name);
    expect(listed).toEqual(expect.arrayContaining(['home', 'tmp', 'usr', 'etc']));
    await fails('ListDir', { path: '/home/user/none' }, 'not_found');
    const dir = await scratch('lsfile');
    await put(`${dir}/f`, 'x');
    await fails('ListDir', { path: `${dir}/f` }, 'invalid_argument');
    await fails('ListDir', { path: dir, depth: -1 }, 'invalid_argument');
  });
});

// --- Remove -------------------------------------------------------------------------------------

describe('Remove', () => {
  it('removes files and whole folders; a missing path is not an error', async () => {
    const dir = await scratch('rm');
    await sh('cd -- "$1" && echo x > f && mkdir -p d/e && echo x > d/e/g', dir);
    expect(await ok('Remove', { path: `${dir}/f` })).toEqual({});
    expect(await ok('Remove', { path: `${dir}/d` })).toEqual({});
    expect(await names(dir)).toEqual([]);
    expect(await ok('Remove', { path: `${dir}/never-existed` })).toEqual({});
  });

  it('removes a symlink, not what it points to, and never the root', async () => {
    const dir = await scratch('rmlink');
    await sh('cd -- "$1" && echo kept > target && ln -s "$1/target" link', dir);
    await ok('Remove', { path: `${dir}/link` });
    expect(await cat(`${dir}/target`)).toBe('kept\n');
    expect(await exists(`${dir}/link`)).toBe(false);
    await fails('Remove', { path: '/' }, 'invalid_argument');
    // The user's own permissions apply: a system file is not the user's to remove.
    await fails('Remove', { path: '/etc/hostname' }, 'permission_denied');
    expect(await cat('/etc/hostname')).toBe('sandbox\n');
  });
});

// --- WatchDir -----------------------------------------------------------------------------------

describe('WatchDir', () => {
  it('starts with {start:{}} and reports create, write, chmod, rename and remove', async () => {
    const dir = await scratch('watch');
    await put(`${dir}/old.txt`, 'o');
    const call = await watchDir({ path: dir });
    try {
      await put(`${dir}/new.txt`, 'first');
      await call.until(has('new.txt', 'WRITE'));
      await put(`${dir}/old.txt`, 'changed');
      await call.until(has('old.txt', 'WRITE'));
      await sh('chmod 600 -- "$1"', `${dir}/old.txt`);
      await call.until(has('old.txt', 'CHMOD'));
      await sh('mv -- "$1/old.txt" "$1/renamed.txt"', dir);
      const renamed = await call.until(has('renamed.txt', 'CREATE'));
      expect(eventsOf(renamed)).toContainEqual({ name: 'old.txt', type: 'EVENT_TYPE_RENAME' });
      await sh('rm -- "$1"', `${dir}/new.txt`);
      const removed = eventsOf(await call.until(has('new.txt', 'REMOVE')));
      expect(removed.at(-1)).toEqual({ name: 'new.txt', type: 'EVENT_TYPE_REMOVE' });
    } finally {
      call.close();
    }
  });

  it('with recursive reports names relative to the watched folder, with includeEntry entries', async () => {
    const dir = await scratch('watchrec');
    await sh('mkdir -- "$1/sub"', dir);
    const call = await watchDir({ path: dir, recursive: true, includeEntry: true });
    try {
      await put(`${dir}/sub/new.txt`, 'abc');
      const frames = await call.until(has('sub/new.txt', 'WRITE'));
      const event = eventsOf(frames).find((e) => e.name === 'sub/new.txt')!;
      expect(event.entry).toMatchObject({
        name: 'new.txt',
        path: `${dir}/sub/new.txt`,
        type: 'FILE_TYPE_FILE',
      });
      // A folder made after the watch started is watched too.
      await sh('mkdir -- "$1/later"', dir);
      await call.until(has('later', 'CREATE'));
      await put(`${dir}/later/deep.txt`, 'x');
      await call.until(has('later/deep.txt', 'CREATE'));
    } finally {
      call.close();
    }
  });

  it('without recursive ignores changes in subfolders', async () => {
    const dir = await scratch('watchflat');
    await sh('mkdir -- "$1/sub"', dir);
    const call = await watchDir({ path: dir });
    try {
      await put(`${dir}/sub/hidden.txt`, 'x');
      await put(`${dir}/top.txt`, 'x');
      const frames = await call.until(has('top.txt', 'CREATE'));
      expect(eventsOf(frames).map((e) => e.name)).not.toContain('sub/hidden.txt');
    } finally {
      call.close();
    }
  });

  it('shows an upload as a create and write of its target, never the temporary file', async () => {
    const dir = await scratch('watchupload');
    const call = await watchDir({ path: dir, recursive: true });
    try {
      expect((await uploadRaw({ path: `${dir}/up.txt` }, 'uploaded')).status).toBe(200);
      const frames = await call.until(has('up.txt', 'WRITE'));
      expect(has('up.txt', 'CREATE')(frames)).toBe(true);
      expect((await uploadRaw({ path: `${dir}/up.txt` }, 'again')).status).toBe(200);
      frames.push(...(await call.until(has('up.txt', 'WRITE'))));
      // Into a folder the upload itself creates.
      expect((await uploadRaw({ path: `${dir}/new/in.txt` }, 'deep')).status).toBe(200);
      frames.push(...(await call.until(has('new/in.txt', 'CREATE'))));
      const seen = new Set(eventsOf(frames).map((e) => e.name));
      expect([...seen].sort()).toEqual(['new', 'new/in.txt', 'up.txt']);
    } finally {
      call.close();
    }
  });

  it('sends keepalives and ends cleanly at Connect-Timeout-Ms', async () => {
    const dir = await scratch('watchdeadline');
    const started = Date.now();
    const call = await watchDir(
      { path: dir },
      { headers: { 'Connect-Timeout-Ms': '1500', 'Keepalive-Ping-Interval': '1' } },
    );
    const frames = await call.until(() => false, 5000);
    expect(frames.filter((f) => f.message.keepalive).length).toBeGreaterThanOrEqual(1);
    expect(frames.at(-1)).toEqual({ flags: 2, message: {} });
    expect(Date.now() - started).toBeGreaterThanOrEqual(1400);
  });

  it('ends with an error frame (HTTP 200) when the folder is missing, a file, or removed', async () => {
    await put('/home/user/plain-file', 'x');
    for (const [body, code] of [
      [{ path: '/home/user/no-such-folder' }, 'not_found'],
      [{ path: '/home/user/plain-file' }, 'invalid_argument'],
      [{ path: '/root' }, 'permission_denied'],
      [{}, 'invalid_argument'],
    ] as const) {
      const call = streamCall('WatchDir', body);
      await call.ready;
      expect(call.status).toBe(200);
      const frame = await call.next();
      expect(frame, JSON.stringify(body)).toMatchObject({ flags: 2, message: { error: { code } } });
    }
    const dir = await scratch('watchgone');
    const call = await watchDir({ path: dir });
    await sh('rm -r -- "$1"', dir);
    const frames = await call.until((f) => f.some((x) => x.flags === 2));
    expect(frames.at(-1)).toMatchObject({ flags: 2, message: { error: { code: 'not_found' } } });
  });

  it('drops its inotify watches when the client goes away', async () => {
    const dir = await scratch('watchleave');
    await sh('mkdir -p -- "$1/a/b"', dir);
    const idle = await inotifyWatches();
    const call = await watchDir({ path: dir, recursive: true });
    expect(await inotifyWatches()).toBe(idle + 3);
    call.close();
    for (let i = 0; i < 50 && (await inotifyWatches()) !== idle; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(await inotifyWatches()).toBe(idle);
  });
});

// --- Polling watchers ---------------------------------------------------------------------------

describe('CreateWatcher / GetWatcherEvents / RemoveWatcher', () => {
  const poll = async (id: string, done: (events: Event[]) => boolean) => {
    const seen: Event[] = [];
    for (let i = 0; i < 100 && !done(seen); i++) {
      seen.push(...(await ok('GetWatcherEvents', { watcherId: id })).events);
      if (!done(seen)) await new Promise((resolve) => setTimeout(resolve, 30));
    }
    return seen;
  };

  it('queues events between polls and forgets a removed watcher', async () => {
    const dir = await scratch('poll');
    const { watcherId } = await ok('CreateWatcher', { path: dir, recursive: true });
    expect(typeof watcherId).toBe('string');
    expect((await ok('GetWatcherEvents', { watcherId })).events).toEqual([]);
    await sh('mkdir -- "$1/d" && echo x > "$1/d/f.txt"', dir);
    const events = await poll(watcherId, (seen) =>
      seen.some((e) => e.name === 'd/f.txt' && e.type === 'EVENT_TYPE_CREATE'),
    );
    expect(events).toContainEqual({ name: 'd', type: 'EVENT_TYPE_CREATE' });
    // The snake_case proto name is accepted too.
    expect(await ok('RemoveWatcher', { watcher_id: watcherId })).toEqual({});
    await fails('GetWatcherEvents', { watcherId }, 'not_found');
    await fails('RemoveWatcher', { watcherId }, 'not_found');
    await fails('CreateWatcher', { path: `${dir}/none` }, 'not_found');
  });

  it('bounds the number of watchers per sandbox', async () => {
    const dir = await scratch('pollcap');
    const ids: string[] = [];
    try {
      for (let i = 0; i < 32; i++) ids.push((await ok('CreateWatcher', { path: dir })).watcherId);
      await fails('CreateWatcher', { path: dir }, 'resource_exhausted');
      // Another sandbox has its own table.
      const other = await ok('CreateWatcher', { path: '/tmp' }, { sandbox: SECURE });
      await ok('RemoveWatcher', { watcherId: other.watcherId }, { sandbox: SECURE });
      await fails('GetWatcherEvents', { watcherId: ids[0] }, 'not_found', { sandbox: SECURE });
    } finally {
      for (const watcherId of ids) await ok('RemoveWatcher', { watcherId });
    }
  });

  it('bounds the folders one recursive watch takes (1,000): past it the stream ends exhausted', async () => {
    const dir = await scratch('watchfolders');
    // 1,001 subfolders and the watched folder itself: past the bound by two.
    await sh('cd -- "$1" && seq 1 1001 | xargs mkdir', dir);
    const refused = streamCall('WatchDir', { path: dir, recursive: true });
    await refused.ready;
    expect(await refused.next()).toMatchObject({
      flags: 2,
      message: { error: { code: 'resource_exhausted', message: expect.stringMatching(/folders/) } },
    });
    // The same folder watched without its subfolders is one folder.
    const flat = await watchDir({ path: dir });
    flat.close();
  });

  it('bounds the watches (streams and watchers together) a sandbox holds', async () => {
    const dir = await scratch('watchcap');
    const ids: string[] = [];
    const streams: Array<{ close(): void }> = [];
    try {
      for (let i = 0; i < 32; i++) ids.push((await ok('CreateWatcher', { path: dir })).watcherId);
      for (let i = 0; i < 32; i++) streams.push(await watchDir({ path: dir }));
      const refused = streamCall('WatchDir', { path: dir });
      await refused.ready;
      expect(await refused.next()).toMatchObject({
        flags: 2,
        message: { error: { code: 'resource_exhausted' } },
      });
    } finally {
      for (const stream of streams) stream.close();
      for (const watcherId of ids) await ok('RemoveWatcher', { watcherId });
    }
  });
});

// --- GET /files ---------------------------------------------------------------------------------

describe('GET /files', () => {
  it('streams the exact bytes with an accurate Content-Length', async () => {
    const dir = await scratch('get');
    const binary = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    await put(`${dir}/bin`, binary);
    const small = await download({ path: `${dir}/bin` });
    expect(small.status).toBe(200);
    expect(small.headers.get('content-type')).toBe('application/octet-stream');
    expect(small.headers.get('content-length')).toBe('256');
    expect(small.bytes.equals(binary)).toBe(true);
    const big = Buffer.alloc(6 << 20, 'moat');
    await put(`${dir}/big`, big);
    const large = await download({ path: `${dir}/big` });
    expect(large.headers.get('content-length')).toBe(String(big.length));
    expect(sha256(large.bytes)).toBe(sha256(big));
  });

  it('sends an empty file with Content-Length 0', async () => {
    const dir = await scratch('getempty');
    await put(`${dir}/empty`, '');
    const empty = await download({ path: `${dir}/empty` });
    expect(empty.status).toBe(200);
    expect(empty.headers.get('content-length')).toBe('0');
    expect(empty.bytes.length).toBe(0);
  });

  it('answers 404 missing, 400 folder and 403 unreadable with the sandbox error body', async () => {
    const dir = await scratch('geterr');
    const missing = await download({ path: `${dir}/none` });
    expect(missing.status).toBe(404);
    expect(JSON.parse(missing.bytes.toString())).toMatchObject({ code: 404, sandboxID: OPEN });
    const folder = await download({ path: dir });
    expect(folder.status).toBe(400);
    expect(JSON.parse(folder.bytes.toString())).toMatchObject({ code: 400, sandboxID: OPEN });
    expect((await download({})).status).toBe(400);
    expect((await download({ path: '/etc/shadow' })).status).toBe(403);
  });

  it('reads as the user of `username=` (relative to that home)', async () => {
    await shAs('root', 'printf "root data" > /root/for-root.txt');
    const asRoot = await download({ path: 'for-root.txt', username: 'root' });
    expect(asRoot.bytes.toString()).toBe('root data');
    expect((await download({ path: '/root/for-root.txt' })).status).toBe(403);
    expect((await download({ path: 'x', username: 'mallory' })).status).toBe(401);
  });
});

// --- POST /files --------------------------------------------------------------------------------

describe('POST /files', () => {
  it('writes one multipart file to ?path=, creating parents and overwriting', async () => {
    const dir = await scratch('post');
    const target = `${dir}/a/b/file.txt`;
    const first = await uploadForm({ path: target }, [{ filename: target, data: 'one' }]);
    expect(first).toEqual({
      status: 200,
      body: [{ name: 'file.txt', type: 'file', path: target }],
    });
    expect(await cat(target)).toBe('one');
    expect((await sh('stat -c %U -- "$1"', target)).trim()).toBe('user');
    await sh('chmod 755 -- "$1"', target);
    await uploadForm({ path: target }, [{ filename: target, data: 'two, longer' }]);
    expect(await cat(target)).toBe('two, longer');
    // An overwrite keeps the file's permissions.
    expect((await sh('stat -c %a -- "$1"', target)).trim()).toBe('755');
    expect(await leftovers(`${dir}/a/b`)).toEqual([]);
  });

  it('without ?path= writes each part to its filename (relative ones in the home)', async () => {
    const dir = await scratch('postmany');
    const name = path.basename(dir);
    const reply = await uploadForm({}, [
      { filename: `${name}/x/1.txt`, data: 'one' },
      { filename: `${dir}/2.txt`, data: 'two' },
      { filename: `${name}/ünï cödé.txt`, data: 'utf8' },
    ]);
    expect(reply.status).toBe(200);
    expect(reply.body.map((f) => f.path)).toEqual([
      `${dir}/x/1.txt`,
      `${dir}/2.txt`,
      `${dir}/ünï cödé.txt`,
    ]);
    expect(await cat(`${dir}/x/1.txt`)).toBe('one');
    expect(await cat(`${dir}/2.txt`)).toBe('two');
    expect(await cat(`${dir}/ünï cödé.txt`)).toBe('utf8');
  });

  it('takes application/octet-stream, plain or gzip', async () => {
    const dir = await scratch('postraw');
    const data = Buffer.alloc(3 << 20, 'raw-bytes');
    expect((await uploadRaw({ path: `${dir}/raw.bin` }, data)).status).toBe(200);
    expect((await sh('sha256sum -- "$1"', `${dir}/raw.bin`)).split(' ')[0]).toBe(sha256(data));
    const response = await fetch(filesUrl({ path: `${dir}/zipped.txt` }), {
      method: 'POST',
      headers: {
        'Content-Type': 'application/octet-stream',
        'Content-Encoding': 'gzip',
        ...headersFor({}),
      },
      body: gzipSync('decoded on arrival'),
    });
    expect(response.status).toBe(200);
    expect(await cat(`${dir}/zipped.txt`)).toBe('decoded on arrival');
  });

  it('refuses bad uploads without leaving a file or a temporary behind', async () => {
    const dir = await scratch('postbad');
    const target = `${dir}/bad.txt`;
    const badGzip = await fetch(filesUrl({ path: target }), {
      method: 'POST',
      headers: {
        'Content-Type': 'application/octet-stream',
        'Content-Encoding': 'gzip',
        ...headersFor({}),
      },
      body: Buffer.concat([gzipSync('x'.repeat(1000)).subarray(0, 20), Buffer.from('garbage')]),
    });
    expect(badGzip.status).toBe(400);
    expect(await badGzip.json()).toMatchObject({ code: 400, sandboxID: OPEN });
    expect((await uploadRaw({}, 'no path')).status).toBe(400);
    const text = await fetch(filesUrl({ path: target }), {
      method: 'POST',
      headers: { 'Content-Type': 'text/plain', ...headersFor({}) },
      body: 'x',
    });
    expect(text.status).toBe(400);
    // Two parts with ?path=, or a second part that cannot be written (root's file, which no
    // write as the user replaces): nothing lands.
    const two = await uploadForm({ path: target }, [
      { filename: target, data: 'a' },
      { filename: target, data: 'b' },
    ]);
    expect(two.status).toBe(400);
    const passwd = await sh('cat /etc/passwd');
    const partial = await uploadForm({}, [
      { filename: `${dir}/good.txt`, data: 'good' },
      { filename: '/etc/passwd', data: 'bad' },
    ]);
    expect(partial.status).toBe(403);
    expect(await sh('cat /etc/passwd')).toBe(passwd);
    const folder = await uploadRaw({ path: dir }, 'x');
    expect(folder.status).toBe(400);
    expect(await names(dir)).toEqual([]);
  });

  it('survives broken gzip uploads that fail while their files are still being staged', async () => {
    // Many at once queue at the file agent, so gzip fails before the upload reads it: that
    // error must reach the one who asked (400), never go unheard and end Moat.
    const dir = await scratch('gzipburst');
    const truncated = gzipSync('x'.repeat(1000)).subarray(0, 20);
    const answers = await Promise.all(
      Array.from({ length: 24 }, (_, i) =>
        fetch(filesUrl({ path: `${dir}/${i}.txt` }), {
          method: 'POST',
          headers: {
            'Content-Type': 'application/octet-stream',
            'Content-Encoding': 'gzip',
            ...headersFor({}),
          },
          body: truncated,
        }).then((r) => r.status),
      ),
    );
    expect(answers).toEqual(answers.map(() => 400));
    expect(await names(dir)).toEqual([]);
  });

  it('stores X-Metadata-* headers as user.e2b.* xattrs and returns them from Stat, ListDir and Move', async () => {
    const dir = await scratch('meta');
    const response = await fetch(filesUrl({ path: `${dir}/m.txt` }), {
      method: 'POST',
      headers: {
        'Content-Type': 'application/octet-stream',
        'X-Metadata-Owner': 'alice',
        'X-Metadata-Build': '42',
        ...headersFor({}),
      },
      body: 'with metadata',
    });
    const reply = await response.json();
    expect(reply).toEqual([
      {
        name: 'm.txt',
        type: 'file',
        path: `${dir}/m.txt`,
        metadata: { owner: 'alice', build: '42' },
      },
    ]);
    const stat = await ok('Stat', { path: `${dir}/m.txt` });
    expect(stat.entry.metadata).toEqual({ owner: 'alice', build: '42' });
    await ok('Move', { source: `${dir}/m.txt`, destination: `${dir}/moved.txt` });
    const { entries } = await ok('ListDir', { path: dir });
    expect(entries).toHaveLength(1);
    expect(entries[0]).toMatchObject({
      name: 'moved.txt',
      metadata: { owner: 'alice', build: '42' },
    });
    // Metadata written inside the sandbox under user.e2b. shows as well.
    await sh(
      `python3 -c 'import os,sys; os.setxattr(sys.argv[1], "user.e2b.stage", b"inside")' "$1"`,
      `${dir}/moved.txt`,
    );
    expect((await ok('Stat', { path: `${dir}/moved.txt` })).entry.metadata).toEqual({
      owner: 'alice',
      build: '42',
      stage: 'inside',
    });
    // An upload without metadata replaces the file and its metadata.
    await uploadRaw({ path: `${dir}/moved.txt` }, 'plain');
    expect((await ok('Stat', { path: `${dir}/moved.txt` })).entry.metadata).toBeUndefined();
  });

  it('refuses metadata that is not printable ASCII or over its bounds', async () => {
    const dir = await scratch('metabad');
    for (const headers of [
      { 'X-Metadata-Key': 'v\u0001' } as Record<string, string>,
      { [`X-Metadata-${'k'.repeat(247)}`]: 'v' },
      { 'X-Metadata-A': 'x'.repeat(2100), 'X-Metadata-B': 'y'.repeat(2100) },
    ]) {
      const response = await fetch(filesUrl({ path: `${dir}/m.txt` }), {
        method: 'POST',
        headers: { 'Content-Type': 'application/octet-stream', ...headers, ...headersFor({}) },
        body: 'x',
      }).catch(() => undefined);
      // fetch itself refuses control characters in headers; the server refuses the rest.
      if (response !== undefined) expect(response.status).toBe(400);
    }
    expect(await names(dir)).toEqual([]);
  });
});

// --- Signed URLs ------------------------------------------------------------------------------

describe('signed /files URLs (secure sandbox)', () => {
  const sign = (p: string, op: 'read' | 'write', user: string, expiration?: number) =>
    'v1_' +
    createHash('sha256')
      .update(`${p}:${op}:${user}:${TOKEN}${expiration === undefined ? '' : `:${expiration}`}`)
      .digest('base64')
      .replace(/=+$/, '');
  /** A request that names the sandbox but carries no X-Access-Token. */
  const bare = { 'E2b-Sandbox-Id': SECURE, 'E2b-Sandbox-Port': '49983' };
  const get = (query: Record<string, string>) =>
    fetch(filesUrl(query), { headers: bare }).then(async (r) => ({
      status: r.status,
      text: await r.text(),
    }));

  beforeAll(async () => {
    await shell(
      runtimeOf(SECURE),
      'printf "signed content" > /home/user/s.txt && chmod 644 /home/user/s.txt',
    );
  });

  it('needs X-Access-Token without a signature', async () => {
    expect((await get({ path: 's.txt' })).status).toBe(401);
    expect((await download({ path: 's.txt' }, { sandbox: SECURE })).bytes.toString()).toBe(
      'signed content',
    );
  });

  it('serves a valid read signature, with or without an expiration in the future', async () => {
    expect(await get({ path: 's.txt', signature: sign('s.txt', 'read', '') })).toEqual({
      status: 200,
      text: 'signed content',
    });
    const later = Math.floor(Date.now() / 1000) + 600;
    const withExpiry = await get({
      path: 's.txt',
      signature: sign('s.txt', 'read', '', later),
      signature_expiration: String(later),
    });
    expect(withExpiry.status).toBe(200);
    const asRoot = await get({
      path: '/home/user/s.txt',
      username: 'root',
      signature: sign('/home/user/s.txt', 'read', 'root'),
    });
    expect(asRoot.status).toBe(200);
  });

  it('refuses wrong, mismatched and expired signatures with 401 and envd’s {code, message}', async () => {
    const cases: Array<[Record<string, string>, string]> = [
      [{ path: 's.txt', signature: 'v1_AAAA' }, 'invalid signature'],
      [{ path: 's.txt', signature: sign('s.txt', 'write', '') }, 'invalid signature'],
      [{ path: 's.txt', signature: sign('other.txt', 'read', '') }, 'invalid signature'],
      [
        { path: 's.txt', username: 'root', signature: sign('s.txt', 'read', '') },
        'invalid signature',
      ],
    ];
    const past = Math.floor(Date.now() / 1000) - 60;
    cases.push([
      {
        path: 's.txt',
        signature: sign('s.txt', 'read', '', past),
        signature_expiration: String(past),
      },
      'signature is already expired',
    ]);
    cases.push([
      { path: 's.txt', signature: sign('s.txt', 'read', ''), signature_expiration: String(past) },
      'invalid signature',
    ]);
    for (const [query, message] of cases) {
      const reply = await get(query);
      expect(reply.status, JSON.stringify(query)).toBe(401);
      expect(JSON.parse(reply.text)).toEqual({ code: 401, message });
    }
  });

  it('accepts a write signature for uploads (uploadUrl without a path signs "")', async () => {
    const form = new FormData();
    form.append('file', new Blob(['via signed url']), 'signed-upload.txt');
    const response = await fetch(filesUrl({ signature: sign('', 'write', '') }), {
      method: 'POST',
      headers: bare,
      body: form,
    });
    expect(response.status).toBe(200);
    expect(await shell(runtimeOf(SECURE), 'cat /home/user/signed-upload.txt')).toBe(
      'via signed url',
    );
    const refused = await fetch(filesUrl({ signature: sign('', 'read', '') }), {
      method: 'POST',
      headers: bare,
      body: form,
    });
    expect(refused.status).toBe(401);
  });
});

// --- POST /files/compose ------------------------------------------------------------------------

describe('POST /files/compose', () => {
  it('concatenates the sources in order and then deletes them', async () => {
    const dir = await scratch('compose');
    const parts = [Buffer.alloc(2 << 20, 'a'), Buffer.from('middle'), Buffer.alloc(1500_000, 'z')];
    for (const [i, data] of parts.entries()) await put(`${dir}/part${i}`, data);
    const reply = await compose({
      source_paths: parts.map((_, i) => `${dir}/part${i}`),
      destination: `${dir}/out/whole.bin`,
    });
    expect(reply).toEqual({
      status: 200,
      body: { path: `${dir}/out/whole.bin`, name: 'whole.bin', type: 'file' },
    });
    expect((await sh('sha256sum -- "$1"', `${dir}/out/whole.bin`)).split(' ')[0]).toBe(
      sha256(Buffer.concat(parts)),
    );
    expect(await names(dir)).toEqual(['out']);
  });

  it('may write over one of its sources', async () => {
    const dir = await scratch('composeself');
    await sh('printf A > "$1/a" && printf B > "$1/b"', dir);
    const reply = await compose({
      source_paths: [`${dir}/a`, `${dir}/b`],
      destination: `${dir}/a`,
    });
    expect(reply.status).toBe(200);
    expect(await cat(`${dir}/a`)).toBe('AB');
    expect(await names(dir)).toEqual(['a']);
  });

  it('leaves every source intact when it fails, naming the source at fault', async () => {
    const dir = await scratch('composefail');
    await sh('printf A > "$1/a"', dir);
    const missing = await compose({
      source_paths: [`${dir}/a`, `${dir}/missing`],
      destination: `${dir}/out`,
    });
    expect(missing.status).toBe(404);
    expect(missing.body).toMatchObject({ code: 404, sandboxID: OPEN });
    expect(missing.body.message).toContain(`${dir}/missing`);
    await sh('mkdir -- "$1/folder"', dir);
    const folder = await compose({ source_paths: [`${dir}/a`], destination: `${dir}/folder` });
    expect(folder.status).toBe(400);
    expect((await names(dir)).sort()).toEqual(['a', 'folder']);
    expect(await names(`${dir}/folder`)).toEqual([]);
  });

  it('resolves relative paths against the home of `username`', async () => {
    await shAs('root', 'printf r1- > /root/r1 && printf r2 > /root/r2');
    const reply = await compose({ source_paths: ['r1', 'r2'], destination: 'r', username: 'root' });
    expect(reply.body).toEqual({ path: '/root/r', name: 'r', type: 'file' });
    expect(await shAs('root', 'cat /root/r')).toBe('r1-r2');
    const unknown = await compose({ source_paths: ['r'], destination: 'x', username: 'mallory' });
    expect(unknown.status).toBe(401);
  });

  it('is strict about its body', async () => {
    const good = { source_paths: ['/home/user/a'], destination: '/home/user/b' };
    for (const body of [
      { ...good, extra: 1 },
      { ...good, source_paths: [] },
      { ...good, source_paths: Array.from({ length: 1001 }, (_, i) => `/tmp/${i}`) },
      { ...good, source_paths: [''] },
      { ...good, source_paths: '/home/user/a' },
      { source_paths: good.source_paths },
      { ...good, destination: 7 },
      { ...good, username: 0 },
      [good],
      'text',
    ]) {
      const reply = await compose(body);
      expect(reply.status, JSON.stringify(body).slice(0, 80)).toBe(400);
      expect(reply.body).toMatchObject({ code: 400, sandboxID: OPEN });
    }
  });
});

// --- Confinement --------------------------------------------------------------------------------

describe('confinement: no path reaches anything of the host', () => {
  let before: string[];

  beforeAll(async () => {
    await plantLinks();
    before = readdirSync(outside).sort();
  });

  /**
   * Fresh symlinks inside the sandbox naming host paths (that exist on the host: the folder
   * outside, its secret, /etc), and nothing at the paths they name inside the sandbox.
   */
  async function plantLinks(): Promise<void> {
    await sh(
      [
        'rm -rf /home/user/links && mkdir /home/user/links && cd /home/user/links',
        'ln -s /etc etc',
        'ln -s "$1" secret',
        'ln -s "$2" outdir',
        'ln -s "$2/missing.txt" dangling',
        'ln -s ../../../.. up',
        'echo v > victim',
      ].join(' && '),
      outsideFile(),
      outside,
    );
  }

  /** The host side is untouched: same names, same secret, no files created. */
  const outsideUntouched = () => {
    expect(readdirSync(outside).sort()).toEqual(before);
    expect(readFileSync(outsideFile(), 'utf8')).toBe(SECRET);
  };

  it('maps `..` and absolute paths into the sandbox’s own /', async () => {
    const passwd = await cat('/etc/passwd');
    expect(passwd).toContain('user:x:1000:1000');
    for (const given of [
      '/etc/passwd',
      '../../../../../etc/passwd',
      '/../../etc/passwd',
      '/home/../etc/./passwd',
    ]) {
      const reply = await download({ path: given });
      expect(reply.status, given).toBe(200);
      expect(reply.bytes.toString()).toBe(passwd);
      expect((await ok('Stat', { path: given })).entry.path).toBe('/etc/passwd');
    }
    const { entries } = await ok('ListDir', { path: '../../..' });
    expect(entries.map((e) => e.name)).toContain('home');
  });

  /** Paths that lead outside through a symlink, for operations that follow or go through it. */
  const THROUGH = [
    '/home/user/links/etc/passwd',
    'links/etc/hostname',
    'links/secret',
    'links/outdir/secret.txt',
    'links/outdir/new.txt',
    'links/dangling',
    'links/up/tmp/x',
  ];

  it.each([
    ['Stat', (p: string) => ({ path: `${p}/child` })],
    ['MakeDir', (p: string) => ({ path: p })],
    ['MakeDir', (p: string) => ({ path: `${p}/sub` })],
    ['ListDir', (p: string) => ({ path: p })],
    ['Remove', (p: string) => ({ path: `${p}/child` })],
    ['Move', (p: string) => ({ source: p, destination: `/home/user/moved-${path.basename(p)}` })],
    ['Move', (p: string) => ({ source: `${p}/child`, destination: '/home/user/moved-child' })],
    ['Move', (p: string) => ({ source: '/home/user/links/victim', destination: `${p}/child` })],
    ['CreateWatcher', (p: string) => ({ path: p })],
  ] as const)('%s never reaches the host through symlinks (%#)', async (method, body) => {
    // A symlink's target is read as the sandbox reads it: `/etc` is the sandbox's /etc, a host
    // path names nothing there. So these calls may succeed or fail, but never touch the host.
    for (const given of THROUGH) {
      await plantLinks();
      await rpc(method, body(given));
      outsideUntouched();
    }
    await plantLinks();
  });

  it('reads symlink targets in the sandbox’s view: an absolute target starts at its /', async () => {
    await plantLinks();
    await sh(
      'echo inside > /home/user/real.txt && ln -sf /home/user/real.txt /home/user/links/absolute',
    );
    expect((await download({ path: 'links/absolute' })).bytes.toString()).toBe('inside\n');
    expect((await ok('Stat', { path: 'links/up/home/user/real.txt' })).entry.path).toBe(
      '/home/user/real.txt',
    );
    // A target naming a host path names nothing inside the sandbox.
    expect((await download({ path: 'links/secret' })).status).toBe(404);
    await fails('Stat', { path: 'links/outdir/secret.txt' }, 'not_found');
  });

  it('acts on a symlink itself (Stat, Move, Remove) without touching its target', async () => {
    await plantLinks();
    const stat = await ok('Stat', { path: 'links/secret' });
    expect(stat.entry).toMatchObject({ type: 'FILE_TYPE_SYMLINK', symlinkTarget: outsideFile() });
    expect(stat.entry.size).not.toBe(String(SECRET.length));
    const listed = await ok('ListDir', { path: 'links', depth: 3 });
    expect(listed.entries.every((e) => path.posix.dirname(e.path) === '/home/user/links')).toBe(
      true,
    );
    await sh('ln -s "$1" /home/user/links/secret-copy', outsideFile());
    await ok('Move', { source: 'links/secret-copy', destination: 'links/secret-moved' });
    expect((await sh('stat -c %F /home/user/links/secret-moved')).trim()).toBe('symbolic link');
    await ok('Remove', { path: 'links/secret-moved' });
    await ok('Remove', { path: 'links/outdir' });
    outsideUntouched();
  });

  it('WatchDir follows symlinks only in the sandbox’s view', async () => {
    await plantLinks();
    const outcomes: Record<string, unknown> = {};
    for (const given of ['links/etc', 'links/outdir', 'links/up', 'links/dangling']) {
      const watch = streamCall('WatchDir', { path: given });
      await watch.ready;
      const first = await watch.next();
      outcomes[given] = first?.flags === 2 ? first.message : 'watching';
      watch.close();
    }
    expect(outcomes).toEqual({
      'links/etc': 'watching',
      'links/outdir': { error: { code: 'not_found', message: expect.any(String) } },
      'links/up': 'watching',
      'links/dangling': { error: { code: 'not_found', message: expect.any(String) } },
    });
  });

  it('GET /files never returns anything of the host', async () => {
    for (const given of [...THROUGH, 'links/etc', 'links/outdir', outsideFile()]) {
      const reply = await download({ path: given });
      expect(reply.bytes.toString(), given).not.toContain(SECRET);
      expect([200, 400, 403, 404], given).toContain(reply.status);
    }
  });

  it('POST /files writes through symlinks only in the sandbox’s view', async () => {
    for (const given of THROUGH) {
      await uploadRaw({ path: given }, 'pwned');
      await uploadForm({ path: given }, [{ filename: given, data: 'pwned' }]);
      await uploadForm({}, [{ filename: given, data: 'pwned' }]);
      outsideUntouched();
    }
  });

  it('compose reads and writes through symlinks only in the sandbox’s view', async () => {
    for (const given of THROUGH) {
      await sh('echo S > /home/user/links/src');
      await compose({ source_paths: ['links/src', given], destination: 'links/dst' });
      await sh('echo S > /home/user/links/src');
      await compose({ source_paths: ['links/src'], destination: given });
      outsideUntouched();
    }
  });
});
