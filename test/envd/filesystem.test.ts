/**
 * The sandbox API's filesystem: `filesystem.Filesystem` over Connect JSON, REST /files and
 * /files/compose, through real HTTP on loopback against SandboxApi with a real ProcessRuntime
 * sandbox root. The confinement table checks that no path (`..`, absolute, symlinks pointing
 * out, dangling symlinks) reads or writes anything outside the sandbox root.
 */
import { createHash } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  unlinkSync,
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
import { ProcessRuntime } from '../../src/runtime/index.js';
import { envelope, type Frame as ConnectFrame, StreamCall } from '../support/connect-client.js';

const OPEN = 'ifsopen000000000000001';
const SECURE = 'ifssecure00000000000001';
const TOKEN = 'envd-token-fs-1';

let dataDir: string;
let outside: string;
let runtime: ProcessRuntime;
let server: http.Server;
let base: string;
let root: string;
let secureRoot: string;
const sandboxes = new Map<string, EnvdSandbox>();

/** Host path of a sandbox path in the open sandbox. */
const host = (view: string) => path.join(root, view);
const home = (name: string) => host(`/home/user/${name}`);
const outsideFile = () => path.join(outside, 'secret.txt');
const SECRET = 'host secret, never served';

beforeAll(async () => {
  dataDir = mkdtempSync(path.join(os.tmpdir(), 'moat-fs-'));
  outside = mkdtempSync(path.join(os.tmpdir(), 'moat-fs-outside-'));
  writeFileSync(outsideFile(), SECRET);
  runtime = new ProcessRuntime(dataDir);
  for (const [id, token] of [
    [OPEN, null],
    [SECURE, TOKEN],
  ] as const) {
    await runtime.create(id, 'base', {}, '127.0.0.1');
    sandboxes.set(id, {
      sandboxID: id,
      accessToken: token,
      envVars: {},
      runtime: runtime.sandbox(id)!,
    });
  }
  root = runtime.sandbox(OPEN)!.root;
  secureRoot = runtime.sandbox(SECURE)!.root;
  const api = new SandboxApi(pino({ level: 'silent' }));
  server = http.createServer((request, response) => {
    const sandbox = sandboxes.get(String(request.headers['e2b-sandbox-id']));
    if (!sandbox) response.writeHead(502).end();
    else void api.handle(request, response, sandbox);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  await runtime.destroy(OPEN);
  await runtime.destroy(SECURE);
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

/** A fresh folder in the user's home for one test (view path and host path). */
let serial = 0;
function scratch(label: string): { view: string; host: string } {
  const name = `${label}-${++serial}`;
  mkdirSync(home(name), { recursive: true });
  return { view: `/home/user/${name}`, host: home(name) };
}

/** No temporary upload/compose files left in a folder. */
const leftovers = (folder: string) => readdirSync(folder).filter((n) => n.startsWith('.moat-'));

/** inotify watches this process holds (every fs.watch is one). */
function inotifyWatches(): number {
  let count = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    const link = (() => {
      try {
        return readlinkSync(`/proc/self/fd/${fd}`);
      } catch {
        return '';
      }
    })();
    if (link !== 'anon_inode:inotify') continue;
    const info = readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8');
    count += info.split('\n').filter((line) => line.startsWith('inotify wd:')).length;
  }
  return count;
}

const RFC3339 = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/;

// --- Stat ---------------------------------------------------------------------------------------

describe('Stat', () => {
  it('describes a file with the proto3 JSON EntryInfo the SDK parses', async () => {
    const dir = scratch('stat');
    writeFileSync(path.join(dir.host, 'a.txt'), 'hello world');
    chmodSync(path.join(dir.host, 'a.txt'), 0o644);
    const { entry } = await ok('Stat', { path: `${dir.view}/a.txt` });
    expect(entry).toMatchObject({
      name: 'a.txt',
      type: 'FILE_TYPE_FILE',
      path: `${dir.view}/a.txt`,
      size: '11',
      mode: 0o644,
      permissions: '-rw-r--r--',
      owner: 'user',
      group: 'user',
    });
    expect(entry.modifiedTime).toMatch(RFC3339);
    const mtime = statSync(path.join(dir.host, 'a.txt')).mtimeMs;
    expect(Math.abs(Date.parse(entry.modifiedTime) - mtime)).toBeLessThan(2);
    expect(entry.symlinkTarget).toBeUndefined();
    expect(entry.metadata).toBeUndefined();
  });

  it('resolves relative paths against the user home, and root against /root', async () => {
    const dir = scratch('rel');
    writeFileSync(path.join(dir.host, 'r.txt'), 'x');
    const { entry } = await ok('Stat', { path: `${path.basename(dir.view)}/r.txt` });
    expect(entry.path).toBe(`${dir.view}/r.txt`);
    writeFileSync(host('/root/mine.txt'), 'root file');
    const asRoot = await ok('Stat', { path: 'mine.txt' }, { headers: basicUser('root') });
    expect(asRoot.entry).toMatchObject({ path: '/root/mine.txt', owner: 'root', group: 'root' });
  });

  it('describes folders and symlinks (never following the symlink)', async () => {
    const dir = scratch('statdir');
    writeFileSync(path.join(dir.host, 'target.txt'), '12345');
    symlinkSync('target.txt', path.join(dir.host, 'link'));
    const folder = await ok('Stat', { path: dir.view });
    expect(folder.entry).toMatchObject({
      type: 'FILE_TYPE_DIRECTORY',
      name: path.basename(dir.view),
    });
    expect(folder.entry.permissions).toMatch(/^drwx/);
    const link = await ok('Stat', { path: `${dir.view}/link` });
    expect(link.entry).toMatchObject({
      type: 'FILE_TYPE_SYMLINK',
      symlinkTarget: `${dir.view}/target.txt`,
      permissions: 'Lrwxrwxrwx',
    });
  });

  it('answers not_found for a missing path and invalid_argument for an empty one', async () => {
    const body = await fails('Stat', { path: '/home/user/nope.txt' }, 'not_found');
    expect(body.message).toContain('/home/user/nope.txt');
    expect(body.message).not.toContain(root);
    await fails('Stat', {}, 'invalid_argument');
    await fails('Stat', { path: 42 }, 'invalid_argument');
  });
});

// --- MakeDir ------------------------------------------------------------------------------------

describe('MakeDir', () => {
  it('creates the folder with its parents and returns its entry', async () => {
    const dir = scratch('mk');
    const { entry } = await ok('MakeDir', { path: `${dir.view}/a/b/c` });
    expect(entry).toMatchObject({
      name: 'c',
      type: 'FILE_TYPE_DIRECTORY',
      path: `${dir.view}/a/b/c`,
    });
    expect(statSync(path.join(dir.host, 'a/b/c')).isDirectory()).toBe(true);
  });

  it('answers already_exists for an existing folder, invalid_argument for a file', async () => {
    const dir = scratch('mkexists');
    await fails('MakeDir', { path: dir.view }, 'already_exists');
    writeFileSync(path.join(dir.host, 'f'), 'x');
    await fails('MakeDir', { path: `${dir.view}/f` }, 'invalid_argument');
    await fails('MakeDir', { path: `${dir.view}/f/sub` }, 'invalid_argument');
  });
});

// --- Move ---------------------------------------------------------------------------------------

describe('Move', () => {
  it('renames, creating the destination parents, and returns the new entry', async () => {
    const dir = scratch('mv');
    writeFileSync(path.join(dir.host, 'a.txt'), 'moved');
    const { entry } = await ok('Move', {
      source: `${dir.view}/a.txt`,
      destination: `${dir.view}/new/place/b.txt`,
    });
    expect(entry).toMatchObject({ name: 'b.txt', path: `${dir.view}/new/place/b.txt`, size: '5' });
    expect(existsSync(path.join(dir.host, 'a.txt'))).toBe(false);
    expect(readFileSync(path.join(dir.host, 'new/place/b.txt'), 'utf8')).toBe('moved');
  });

  it('answers not_found for a missing source and refuses to move the root', async () => {
    const dir = scratch('mvmissing');
    await fails('Move', { source: `${dir.view}/x`, destination: `${dir.view}/y` }, 'not_found');
    await fails('Move', { source: '/', destination: `${dir.view}/root` }, 'invalid_argument');
    await fails('Move', { source: dir.view, destination: '/' }, 'invalid_argument');
    await fails('Move', { source: dir.view }, 'invalid_argument');
  });

  it('refuses to move a folder into itself', async () => {
    const dir = scratch('mvself');
    mkdirSync(path.join(dir.host, 'a'));
    await fails(
      'Move',
      { source: `${dir.view}/a`, destination: `${dir.view}/a/b` },
      'invalid_argument',
    );
  });
});

// --- ListDir ------------------------------------------------------------------------------------

describe('ListDir', () => {
  it('lists one level for depth 0 or 1, deeper levels depth-first in name order', async () => {
    const dir = scratch('ls');
    mkdirSync(path.join(dir.host, 'b/c/d'), { recursive: true });
    writeFileSync(path.join(dir.host, 'a.txt'), 'a');
    writeFileSync(path.join(dir.host, 'b/inner.txt'), 'i');
    writeFileSync(path.join(dir.host, 'b/c/deep.txt'), 'd');
    const names = (entries: Entry[]) => entries.map((e) => e.path.slice(dir.view.length + 1));
    for (const depth of [undefined, 0, 1]) {
      const { entries } = await ok('ListDir', {
        path: dir.view,
        ...(depth === undefined ? {} : { depth }),
      });
      expect(names(entries)).toEqual(['a.txt', 'b']);
    }
    const two = await ok('ListDir', { path: dir.view, depth: 2 });
    expect(names(two.entries)).toEqual(['a.txt', 'b', 'b/c', 'b/inner.txt']);
    const all = await ok('ListDir', { path: dir.view, depth: '10' });
    expect(names(all.entries)).toEqual([
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
    const dir = scratch('lslink');
    mkdirSync(path.join(dir.host, 'real'));
    writeFileSync(path.join(dir.host, 'real/x.txt'), 'x');
    // Targets are written as the sandbox sees them: absolute from the sandbox's `/`.
    symlinkSync(`${dir.view}/real`, path.join(dir.host, 'alias'));
    const { entries } = await ok('ListDir', { path: dir.view, depth: 5 });
    expect(entries.map((e) => [e.name, e.type])).toEqual([
      ['alias', 'FILE_TYPE_SYMLINK'],
      ['real', 'FILE_TYPE_DIRECTORY'],
      ['x.txt', 'FILE_TYPE_FILE'],
    ]);
    expect(entries[0]?.symlinkTarget).toBe(`${dir.view}/real`);
    // Listing through a symlinked folder inside the root lists the real folder.
    const through = await ok('ListDir', { path: `${dir.view}/alias` });
    expect(through.entries.map((e) => e.path)).toEqual([`${dir.view}/real/x.txt`]);
  });

  it('hides Moat’s own folder at the root and answers errors with Connect codes', async () => {
    const { entries } = await ok('ListDir', { path: '/' });
    const names = entries.map((e) => e.name);
    expect(names).toEqual(expect.arrayContaining(['home', 'tmp']));
    expect(names).not.toContain('.moat');
    await fails('ListDir', { path: '/home/user/none' }, 'not_found');
    const dir = scratch('lsfile');
    writeFileSync(path.join(dir.host, 'f'), 'x');
    await fails('ListDir', { path: `${dir.view}/f` }, 'invalid_argument');
    await fails('ListDir', { path: dir.view, depth: -1 }, 'invalid_argument');
  });
});

// --- Remove -------------------------------------------------------------------------------------

describe('Remove', () => {
  it('removes files and whole folders; a missing path is not an error', async () => {
    const dir = scratch('rm');
    writeFileSync(path.join(dir.host, 'f'), 'x');
    mkdirSync(path.join(dir.host, 'd/e'), { recursive: true });
    writeFileSync(path.join(dir.host, 'd/e/g'), 'x');
    expect(await ok('Remove', { path: `${dir.view}/f` })).toEqual({});
    expect(await ok('Remove', { path: `${dir.view}/d` })).toEqual({});
    expect(readdirSync(dir.host)).toEqual([]);
    expect(await ok('Remove', { path: `${dir.view}/never-existed` })).toEqual({});
  });

  it('removes a symlink, not what it points to, and never the root or Moat’s folder', async () => {
    const dir = scratch('rmlink');
    writeFileSync(path.join(dir.host, 'target'), 'kept');
    symlinkSync(path.join(dir.host, 'target'), path.join(dir.host, 'link'));
    await ok('Remove', { path: `${dir.view}/link` });
    expect(readFileSync(path.join(dir.host, 'target'), 'utf8')).toBe('kept');
    expect(existsSync(path.join(dir.host, 'link'))).toBe(false);
    await fails('Remove', { path: '/' }, 'invalid_argument');
    await fails('Remove', { path: '/.moat' }, 'permission_denied');
    await fails('Remove', { path: '/.moat/passwd' }, 'permission_denied');
    expect(existsSync(host('/.moat/passwd'))).toBe(true);
  });
});

// --- WatchDir -----------------------------------------------------------------------------------

describe('WatchDir', () => {
  it('starts with {start:{}} and reports create, write, chmod, rename and remove', async () => {
    const dir = scratch('watch');
    writeFileSync(path.join(dir.host, 'old.txt'), 'o');
    const call = await watchDir({ path: dir.view });
    try {
      writeFileSync(path.join(dir.host, 'new.txt'), 'first');
      await call.until(has('new.txt', 'WRITE'));
      writeFileSync(path.join(dir.host, 'old.txt'), 'changed');
      await call.until(has('old.txt', 'WRITE'));
      chmodSync(path.join(dir.host, 'old.txt'), 0o600);
      await call.until(has('old.txt', 'CHMOD'));
      renameSync(path.join(dir.host, 'old.txt'), path.join(dir.host, 'renamed.txt'));
      const renamed = await call.until(has('renamed.txt', 'CREATE'));
      expect(eventsOf(renamed)).toContainEqual({ name: 'old.txt', type: 'EVENT_TYPE_RENAME' });
      unlinkSync(path.join(dir.host, 'new.txt'));
      const removed = eventsOf(await call.until(has('new.txt', 'REMOVE')));
      expect(removed.at(-1)).toEqual({ name: 'new.txt', type: 'EVENT_TYPE_REMOVE' });
    } finally {
      call.close();
    }
  });

  it('with recursive reports names relative to the watched folder, with includeEntry entries', async () => {
    const dir = scratch('watchrec');
    mkdirSync(path.join(dir.host, 'sub'));
    const call = await watchDir({ path: dir.view, recursive: true, includeEntry: true });
    try {
      writeFileSync(path.join(dir.host, 'sub/new.txt'), 'abc');
      const frames = await call.until(has('sub/new.txt', 'WRITE'));
      const event = eventsOf(frames).find((e) => e.name === 'sub/new.txt')!;
      expect(event.entry).toMatchObject({
        name: 'new.txt',
        path: `${dir.view}/sub/new.txt`,
        type: 'FILE_TYPE_FILE',
      });
      // A folder made after the watch started is watched too.
      mkdirSync(path.join(dir.host, 'later'));
      await call.until(has('later', 'CREATE'));
      writeFileSync(path.join(dir.host, 'later/deep.txt'), 'x');
      await call.until(has('later/deep.txt', 'CREATE'));
    } finally {
      call.close();
    }
  });

  it('without recursive ignores changes in subfolders', async () => {
    const dir = scratch('watchflat');
    mkdirSync(path.join(dir.host, 'sub'));
    const call = await watchDir({ path: dir.view });
    try {
      writeFileSync(path.join(dir.host, 'sub/hidden.txt'), 'x');
      writeFileSync(path.join(dir.host, 'top.txt'), 'x');
      const frames = await call.until(has('top.txt', 'CREATE'));
      expect(eventsOf(frames).map((e) => e.name)).not.toContain('sub/hidden.txt');
    } finally {
      call.close();
    }
  });

  it('shows an upload as a create and write of its target, never the temporary file', async () => {
    const dir = scratch('watchupload');
    const call = await watchDir({ path: dir.view, recursive: true });
    try {
      expect((await uploadRaw({ path: `${dir.view}/up.txt` }, 'uploaded')).status).toBe(200);
      const frames = await call.until(has('up.txt', 'WRITE'));
      expect(has('up.txt', 'CREATE')(frames)).toBe(true);
      expect((await uploadRaw({ path: `${dir.view}/up.txt` }, 'again')).status).toBe(200);
      frames.push(...(await call.until(has('up.txt', 'WRITE'))));
      // Into a folder the upload itself creates.
      expect((await uploadRaw({ path: `${dir.view}/new/in.txt` }, 'deep')).status).toBe(200);
      frames.push(...(await call.until(has('new/in.txt', 'CREATE'))));
      const names = new Set(eventsOf(frames).map((e) => e.name));
      expect([...names].sort()).toEqual(['new', 'new/in.txt', 'up.txt']);
    } finally {
      call.close();
    }
  });

  it('sends keepalives and ends cleanly at Connect-Timeout-Ms', async () => {
    const dir = scratch('watchdeadline');
    const started = Date.now();
    const call = await watchDir(
      { path: dir.view },
      { headers: { 'Connect-Timeout-Ms': '1500', 'Keepalive-Ping-Interval': '1' } },
    );
    const frames = await call.until(() => false, 5000);
    expect(frames.filter((f) => f.message.keepalive).length).toBeGreaterThanOrEqual(1);
    expect(frames.at(-1)).toEqual({ flags: 2, message: {} });
    expect(Date.now() - started).toBeGreaterThanOrEqual(1400);
  });

  it('ends with an error frame (HTTP 200) when the folder is missing, a file, or removed', async () => {
    for (const [body, code] of [
      [{ path: '/home/user/no-such-folder' }, 'not_found'],
      [{ path: '/.moat' }, 'permission_denied'],
      [{}, 'invalid_argument'],
    ] as const) {
      const call = streamCall('WatchDir', body);
      await call.ready;
      expect(call.status).toBe(200);
      const frame = await call.next();
      expect(frame).toMatchObject({ flags: 2, message: { error: { code } } });
    }
    const dir = scratch('watchgone');
    const call = await watchDir({ path: dir.view });
    rmSync(dir.host, { recursive: true });
    const frames = await call.until((f) => f.some((x) => x.flags === 2));
    expect(frames.at(-1)).toMatchObject({ flags: 2, message: { error: { code: 'not_found' } } });
  });

  it('drops its inotify watches when the client goes away', async () => {
    const dir = scratch('watchleave');
    mkdirSync(path.join(dir.host, 'a/b'), { recursive: true });
    const idle = inotifyWatches();
    const call = await watchDir({ path: dir.view, recursive: true });
    expect(inotifyWatches()).toBe(idle + 3);
    call.close();
    for (let i = 0; i < 50 && inotifyWatches() !== idle; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(inotifyWatches()).toBe(idle);
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
    const dir = scratch('poll');
    const { watcherId } = await ok('CreateWatcher', { path: dir.view, recursive: true });
    expect(typeof watcherId).toBe('string');
    expect((await ok('GetWatcherEvents', { watcherId })).events).toEqual([]);
    mkdirSync(path.join(dir.host, 'd'));
    writeFileSync(path.join(dir.host, 'd/f.txt'), 'x');
    const events = await poll(watcherId, (seen) =>
      seen.some((e) => e.name === 'd/f.txt' && e.type === 'EVENT_TYPE_CREATE'),
    );
    expect(events).toContainEqual({ name: 'd', type: 'EVENT_TYPE_CREATE' });
    // The snake_case proto name is accepted too.
    expect(await ok('RemoveWatcher', { watcher_id: watcherId })).toEqual({});
    await fails('GetWatcherEvents', { watcherId }, 'not_found');
    await fails('RemoveWatcher', { watcherId }, 'not_found');
    await fails('CreateWatcher', { path: `${dir.view}/none` }, 'not_found');
  });

  it('bounds the number of watchers per sandbox', async () => {
    const dir = scratch('pollcap');
    const ids: string[] = [];
    try {
      for (let i = 0; i < 32; i++)
        ids.push((await ok('CreateWatcher', { path: dir.view })).watcherId);
      await fails('CreateWatcher', { path: dir.view }, 'resource_exhausted');
      // Another sandbox has its own table.
      const other = await ok('CreateWatcher', { path: '/tmp' }, { sandbox: SECURE });
      await ok('RemoveWatcher', { watcherId: other.watcherId }, { sandbox: SECURE });
      await fails('GetWatcherEvents', { watcherId: ids[0] }, 'not_found', { sandbox: SECURE });
    } finally {
      for (const watcherId of ids) await ok('RemoveWatcher', { watcherId });
    }
  });
});

// --- GET /files ---------------------------------------------------------------------------------

describe('GET /files', () => {
  it('streams the exact bytes with an accurate Content-Length', async () => {
    const dir = scratch('get');
    const binary = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    writeFileSync(path.join(dir.host, 'bin'), binary);
    const small = await download({ path: `${dir.view}/bin` });
    expect(small.status).toBe(200);
    expect(small.headers.get('content-type')).toBe('application/octet-stream');
    expect(small.headers.get('content-length')).toBe('256');
    expect(small.bytes.equals(binary)).toBe(true);
    const big = Buffer.alloc(6 << 20, 'moat');
    writeFileSync(path.join(dir.host, 'big'), big);
    const large = await download({ path: `${dir.view}/big` });
    expect(large.headers.get('content-length')).toBe(String(big.length));
    expect(createHash('sha256').update(large.bytes).digest('hex')).toBe(
      createHash('sha256').update(big).digest('hex'),
    );
  });

  it('sends an empty file with Content-Length 0', async () => {
    const dir = scratch('getempty');
    writeFileSync(path.join(dir.host, 'empty'), '');
    const empty = await download({ path: `${dir.view}/empty` });
    expect(empty.status).toBe(200);
    expect(empty.headers.get('content-length')).toBe('0');
    expect(empty.bytes.length).toBe(0);
  });

  it('answers 404 missing and 400 folder with the sandbox error body', async () => {
    const dir = scratch('geterr');
    const missing = await download({ path: `${dir.view}/none` });
    expect(missing.status).toBe(404);
    expect(JSON.parse(missing.bytes.toString())).toMatchObject({ code: 404, sandboxID: OPEN });
    const folder = await download({ path: dir.view });
    expect(folder.status).toBe(400);
    expect(JSON.parse(folder.bytes.toString())).toMatchObject({ code: 400, sandboxID: OPEN });
    expect((await download({})).status).toBe(400);
  });

  it('reads as the user of `username=` (relative to that home)', async () => {
    writeFileSync(host('/root/for-root.txt'), 'root data');
    const asRoot = await download({ path: 'for-root.txt', username: 'root' });
    expect(asRoot.bytes.toString()).toBe('root data');
    expect((await download({ path: 'x', username: 'mallory' })).status).toBe(401);
  });
});

// --- POST /files --------------------------------------------------------------------------------

describe('POST /files', () => {
  it('writes one multipart file to ?path=, creating parents and overwriting', async () => {
    const dir = scratch('post');
    const target = `${dir.view}/a/b/file.txt`;
    const first = await uploadForm({ path: target }, [{ filename: target, data: 'one' }]);
    expect(first).toEqual({
      status: 200,
      body: [{ name: 'file.txt', type: 'file', path: target }],
    });
    expect(readFileSync(path.join(dir.host, 'a/b/file.txt'), 'utf8')).toBe('one');
    chmodSync(path.join(dir.host, 'a/b/file.txt'), 0o755);
    await uploadForm({ path: target }, [{ filename: target, data: 'two, longer' }]);
    expect(readFileSync(path.join(dir.host, 'a/b/file.txt'), 'utf8')).toBe('two, longer');
    // An overwrite keeps the file's permissions.
    expect(statSync(path.join(dir.host, 'a/b/file.txt')).mode & 0o777).toBe(0o755);
    expect(leftovers(path.join(dir.host, 'a/b'))).toEqual([]);
  });

  it('without ?path= writes each part to its filename (relative ones in the home)', async () => {
    const dir = scratch('postmany');
    const name = path.basename(dir.view);
    const reply = await uploadForm({}, [
      { filename: `${name}/x/1.txt`, data: 'one' },
      { filename: `${dir.view}/2.txt`, data: 'two' },
      { filename: `${name}/ünï cödé.txt`, data: 'utf8' },
    ]);
    expect(reply.status).toBe(200);
    expect(reply.body.map((f) => f.path)).toEqual([
      `${dir.view}/x/1.txt`,
      `${dir.view}/2.txt`,
      `${dir.view}/ünï cödé.txt`,
    ]);
    expect(readFileSync(path.join(dir.host, 'x/1.txt'), 'utf8')).toBe('one');
    expect(readFileSync(path.join(dir.host, '2.txt'), 'utf8')).toBe('two');
    expect(readFileSync(path.join(dir.host, 'ünï cödé.txt'), 'utf8')).toBe('utf8');
  });

  it('takes application/octet-stream, plain or gzip', async () => {
    const dir = scratch('postraw');
    const data = Buffer.alloc(3 << 20, 'raw-bytes');
    expect((await uploadRaw({ path: `${dir.view}/raw.bin` }, data)).status).toBe(200);
    expect(readFileSync(path.join(dir.host, 'raw.bin')).equals(data)).toBe(true);
    const response = await fetch(filesUrl({ path: `${dir.view}/zipped.txt` }), {
      method: 'POST',
      headers: {
        'Content-Type': 'application/octet-stream',
        'Content-Encoding': 'gzip',
        ...headersFor({}),
      },
      body: gzipSync('decoded on arrival'),
    });
    expect(response.status).toBe(200);
    expect(readFileSync(path.join(dir.host, 'zipped.txt'), 'utf8')).toBe('decoded on arrival');
  });

  it('refuses bad uploads without leaving a file or a temporary behind', async () => {
    const dir = scratch('postbad');
    const target = `${dir.view}/bad.txt`;
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
    // Two parts with ?path=, or a second part that cannot be written: nothing lands.
    const two = await uploadForm({ path: target }, [
      { filename: target, data: 'a' },
      { filename: target, data: 'b' },
    ]);
    expect(two.status).toBe(400);
    const partial = await uploadForm({}, [
      { filename: `${dir.view}/good.txt`, data: 'good' },
      { filename: '/.moat/evil', data: 'bad' },
    ]);
    expect(partial.status).toBe(403);
    const folder = await uploadRaw({ path: dir.view }, 'x');
    expect(folder.status).toBe(400);
    expect(readdirSync(dir.host)).toEqual([]);
  });

  it('stores X-Metadata-* headers and returns them from Stat, ListDir and Move', async () => {
    const dir = scratch('meta');
    const response = await fetch(filesUrl({ path: `${dir.view}/m.txt` }), {
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
        path: `${dir.view}/m.txt`,
        metadata: { owner: 'alice', build: '42' },
      },
    ]);
    const stat = await ok('Stat', { path: `${dir.view}/m.txt` });
    expect(stat.entry.metadata).toEqual({ owner: 'alice', build: '42' });
    await ok('Move', { source: `${dir.view}/m.txt`, destination: `${dir.view}/moved.txt` });
    const { entries } = await ok('ListDir', { path: dir.view });
    expect(entries).toHaveLength(1);
    expect(entries[0]).toMatchObject({
      name: 'moved.txt',
      metadata: { owner: 'alice', build: '42' },
    });
    // An upload without metadata replaces the file and its metadata.
    await uploadRaw({ path: `${dir.view}/moved.txt` }, 'plain');
    expect((await ok('Stat', { path: `${dir.view}/moved.txt` })).entry.metadata).toBeUndefined();
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

  beforeAll(() => writeFileSync(path.join(secureRoot, 'home/user/s.txt'), 'signed content'));

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

  it('refuses wrong, mismatched and expired signatures with 401', async () => {
    const cases: Array<[Record<string, string>, RegExp]> = [
      [{ path: 's.txt', signature: 'v1_AAAA' }, /invalid signature/],
      [{ path: 's.txt', signature: sign('s.txt', 'write', '') }, /invalid signature/],
      [{ path: 's.txt', signature: sign('other.txt', 'read', '') }, /invalid signature/],
      [{ path: 's.txt', username: 'root', signature: sign('s.txt', 'read', '') }, /invalid/],
    ];
    const past = Math.floor(Date.now() / 1000) - 60;
    cases.push([
      {
        path: 's.txt',
        signature: sign('s.txt', 'read', '', past),
        signature_expiration: String(past),
      },
      /expired at/,
    ]);
    cases.push([
      { path: 's.txt', signature: sign('s.txt', 'read', ''), signature_expiration: String(past) },
      /invalid signature/,
    ]);
    for (const [query, message] of cases) {
      const reply = await get(query);
      expect(reply.status, JSON.stringify(query)).toBe(401);
      expect(JSON.parse(reply.text)).toMatchObject({ code: 401, sandboxID: SECURE });
      expect(JSON.parse(reply.text).message).toMatch(message);
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
    expect(readFileSync(path.join(secureRoot, 'home/user/signed-upload.txt'), 'utf8')).toBe(
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
    const dir = scratch('compose');
    const parts = [Buffer.alloc(2 << 20, 'a'), Buffer.from('middle'), Buffer.alloc(1500_000, 'z')];
    parts.forEach((data, i) => writeFileSync(path.join(dir.host, `part${i}`), data));
    const reply = await compose({
      source_paths: parts.map((_, i) => `${dir.view}/part${i}`),
      destination: `${dir.view}/out/whole.bin`,
    });
    expect(reply).toEqual({
      status: 200,
      body: { path: `${dir.view}/out/whole.bin`, name: 'whole.bin', type: 'file' },
    });
    expect(readFileSync(path.join(dir.host, 'out/whole.bin')).equals(Buffer.concat(parts))).toBe(
      true,
    );
    expect(readdirSync(dir.host)).toEqual(['out']);
  });

  it('may write over one of its sources', async () => {
    const dir = scratch('composeself');
    writeFileSync(path.join(dir.host, 'a'), 'A');
    writeFileSync(path.join(dir.host, 'b'), 'B');
    const reply = await compose({
      source_paths: [`${dir.view}/a`, `${dir.view}/b`],
      destination: `${dir.view}/a`,
    });
    expect(reply.status).toBe(200);
    expect(readFileSync(path.join(dir.host, 'a'), 'utf8')).toBe('AB');
    expect(readdirSync(dir.host)).toEqual(['a']);
  });

  it('leaves every source intact when it fails', async () => {
    const dir = scratch('composefail');
    writeFileSync(path.join(dir.host, 'a'), 'A');
    const missing = await compose({
      source_paths: [`${dir.view}/a`, `${dir.view}/missing`],
      destination: `${dir.view}/out`,
    });
    expect(missing.status).toBe(404);
    expect(missing.body).toMatchObject({ code: 404, sandboxID: OPEN });
    mkdirSync(path.join(dir.host, 'folder'));
    const folder = await compose({
      source_paths: [`${dir.view}/a`],
      destination: `${dir.view}/folder`,
    });
    expect(folder.status).toBe(400);
    expect(readdirSync(dir.host).sort()).toEqual(['a', 'folder']);
    expect(readdirSync(path.join(dir.host, 'folder'))).toEqual([]);
  });

  it('resolves relative paths against the home of `username`', async () => {
    writeFileSync(host('/root/r1'), 'r1-');
    writeFileSync(host('/root/r2'), 'r2');
    const reply = await compose({ source_paths: ['r1', 'r2'], destination: 'r', username: 'root' });
    expect(reply.body).toEqual({ path: '/root/r', name: 'r', type: 'file' });
    expect(readFileSync(host('/root/r'), 'utf8')).toBe('r1-r2');
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

describe('confinement: nothing outside the sandbox root is read or written', () => {
  const SANDBOX_PASSWD = 'sandbox-passwd-file\n';
  let before: string[];

  beforeAll(() => {
    mkdirSync(host('/etc'), { recursive: true });
    writeFileSync(host('/etc/passwd'), SANDBOX_PASSWD);
    plantLinks();
    before = readdirSync(outside).sort();
  });

  /**
   * Fresh outward-looking symlinks, and nothing at the in-root paths they name (an earlier call
   * may have created those, inside the root, which is allowed).
   */
  function plantLinks(): void {
    const links = home('links');
    rmSync(links, { recursive: true, force: true });
    rmSync(host(outside), { recursive: true, force: true });
    mkdirSync(links, { recursive: true });
    symlinkSync('/etc', path.join(links, 'etc'));
    symlinkSync(outsideFile(), path.join(links, 'secret'));
    symlinkSync(outside, path.join(links, 'outdir'));
    symlinkSync(path.join(outside, 'missing.txt'), path.join(links, 'dangling'));
    symlinkSync('../../../..', path.join(links, 'up'));
  }

  /** The host side is untouched: same names, same secret, no files created. */
  const outsideUntouched = () => {
    expect(readdirSync(outside).sort()).toEqual(before);
    expect(readFileSync(outsideFile(), 'utf8')).toBe(SECRET);
    expect(existsSync(path.join(outside, 'missing.txt'))).toBe(false);
  };

  it('maps `..` and absolute paths into the sandbox root', async () => {
    for (const given of [
      '/etc/passwd',
      '../../../../../etc/passwd',
      '/../../etc/passwd',
      '/home/../etc/./passwd',
    ]) {
      const reply = await download({ path: given });
      expect(reply.status, given).toBe(200);
      expect(reply.bytes.toString()).toBe(SANDBOX_PASSWD);
      expect((await ok('Stat', { path: given })).entry.path).toBe('/etc/passwd');
    }
    const { entries } = await ok('ListDir', { path: '../../..' });
    expect(entries.map((e) => e.name)).toContain('home');
    expect(entries.map((e) => e.name)).not.toContain('usr');
  });

  /** Paths that reach outside through a symlink, for operations that follow or go through it. */
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
  ] as const)('%s never reaches outside through symlinks (%#)', async (method, body) => {
    // A symlink's target is read as the sandbox reads it: `/etc` is the sandbox's /etc. So these
    // calls may succeed or fail, but only ever inside the root.
    for (const given of THROUGH) {
      plantLinks();
      writeFileSync(home('links/victim'), 'v');
      await rpc(method, body(given));
      outsideUntouched();
    }
    plantLinks();
  });

  it('reads symlink targets in the sandbox’s view: an absolute target starts at its /', async () => {
    plantLinks();
    writeFileSync(home('real.txt'), 'inside');
    symlinkSync('/home/user/real.txt', home('links/absolute'));
    expect((await download({ path: 'links/absolute' })).bytes.toString()).toBe('inside');
    expect((await ok('Stat', { path: 'links/up/home/user/real.txt' })).entry.path).toBe(
      '/home/user/real.txt',
    );
    // An outward-looking target names a path inside the root, which does not exist there.
    expect((await download({ path: 'links/secret' })).status).toBe(404);
    await fails('Stat', { path: 'links/outdir/secret.txt' }, 'not_found');
  });

  it('acts on a symlink itself (Stat, Move, Remove) without touching its target', async () => {
    plantLinks();
    const stat = await ok('Stat', { path: 'links/secret' });
    expect(stat.entry).toMatchObject({ type: 'FILE_TYPE_SYMLINK', symlinkTarget: outsideFile() });
    expect(stat.entry.size).not.toBe(String(SECRET.length));
    // Symlinked folders are listed, never entered.
    const listed = await ok('ListDir', { path: 'links', depth: 3 });
    expect(listed.entries.every((e) => path.posix.dirname(e.path) === '/home/user/links')).toBe(
      true,
    );
    symlinkSync(outsideFile(), home('links/secret-copy'));
    await ok('Move', { source: 'links/secret-copy', destination: 'links/secret-moved' });
    expect(lstatSync(home('links/secret-moved')).isSymbolicLink()).toBe(true);
    await ok('Remove', { path: 'links/secret-moved' });
    symlinkSync(outside, home('links/outdir-copy'));
    await ok('Remove', { path: 'links/outdir-copy' });
    outsideUntouched();
  });

  it('WatchDir follows symlinks only inside the root', async () => {
    plantLinks();
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

  it('GET /files never returns anything from outside', async () => {
    for (const given of [...THROUGH, 'links/etc', 'links/outdir']) {
      const reply = await download({ path: given });
      expect(reply.bytes.toString(), given).not.toContain(SECRET);
      expect([200, 400, 404], given).toContain(reply.status);
    }
  });

  it('POST /files writes through symlinks only inside the root', async () => {
    for (const given of THROUGH) {
      await uploadRaw({ path: given }, 'pwned');
      await uploadForm({ path: given }, [{ filename: given, data: 'pwned' }]);
      await uploadForm({}, [{ filename: given, data: 'pwned' }]);
      outsideUntouched();
    }
  });

  it('compose reads and writes through symlinks only inside the root', async () => {
    writeFileSync(home('links/src'), 'S');
    for (const given of THROUGH) {
      await compose({ source_paths: ['links/src', given], destination: 'links/dst' });
      writeFileSync(home('links/src'), 'S');
      await compose({ source_paths: ['links/src'], destination: given });
      writeFileSync(home('links/src'), 'S');
      outsideUntouched();
    }
  });

  it('keeps Moat’s own folder out of reach, also through symlinks inside the root', async () => {
    symlinkSync('../../../.moat', home('links/moat'));
    await fails('Stat', { path: '/.moat/passwd' }, 'permission_denied');
    await fails('Stat', { path: 'links/moat/passwd' }, 'permission_denied');
    await fails('ListDir', { path: 'links/moat' }, 'permission_denied');
    await fails('MakeDir', { path: '/.moat/x' }, 'permission_denied');
    expect((await download({ path: 'links/moat/passwd' })).status).toBe(403);
    expect((await uploadRaw({ path: 'links/moat/passwd' }, 'x')).status).toBe(403);
    expect(
      (await compose({ source_paths: ['/.moat/passwd'], destination: '/home/user/p' })).status,
    ).toBe(403);
    expect(readFileSync(host('/.moat/passwd'), 'utf8')).toContain('user:x:1000');
  });
});
