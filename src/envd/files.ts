/**
 * REST `/files` (download, upload, signed URLs) and `/files/compose`, and what the filesystem
 * service shares with them: sandbox paths mapped inside the root, filesystem errors as Connect
 * codes, EntryInfo, and file metadata.
 *
 * Writes go to a temporary file in the target's folder that is renamed over the target once
 * complete, so a failed upload or compose never leaves a partial file. Opened files are checked
 * once more through /proc/self/fd, which closes the window in which a folder checked by
 * resolveInSandbox could be swapped for a symlink before the open.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { type BigIntStats, constants } from 'node:fs';
import {
  copyFile,
  type FileHandle,
  lstat,
  mkdir,
  open,
  readFile,
  readdir,
  readlink,
  realpath,
  rename,
  rm,
  stat,
  writeFile,
} from 'node:fs/promises';
import type { ServerResponse } from 'node:http';
import path from 'node:path';
import { type Readable, Transform, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import busboy from 'busboy';
import { resolveInSandbox, type SandboxUser, SandboxPathError, USERS } from '../runtime/index.js';
import { type ConnectCode, ConnectError, readBody } from './connect.js';
import type { CallContext } from './context.js';

/** Largest upload (all parts together, after gzip decoding). */
export const MAX_UPLOAD_BYTES = 1 << 30;
/** Most file parts in one multipart upload. */
export const MAX_UPLOAD_FILES = 1000;
/** Most files one compose may concatenate. */
export const MAX_COMPOSE_SOURCES = 1000;
const MAX_PATH_LENGTH = 4096;
const MAX_METADATA_KEYS = 64;
const MAX_METADATA_KEY = 256;
const MAX_METADATA_VALUE = 4096;
const MAX_COMPOSE_BODY = 8 << 20;
const COPY_CHUNK = 1 << 20;

// --- Errors -----------------------------------------------------------------------------------

/** A Connect error that also knows its /files HTTP status (the REST routes need both). */
export class FileError extends ConnectError {
  constructor(
    code: ConnectCode,
    message: string,
    readonly status: number,
  ) {
    super(code, message);
  }
}

export const invalid = (message: string) => new FileError('invalid_argument', message, 400);
export const notFound = (message: string) => new FileError('not_found', message, 404);
const unauthenticated = (message: string) => new FileError('unauthenticated', message, 401);
const tooLarge = (message: string) => new FileError('resource_exhausted', message, 413);

/** A failed filesystem call as the client should see it: its sandbox path, never a host path. */
export function fileSystemError(error: unknown, view: string, action: string): ConnectError {
  if (error instanceof ConnectError) return error;
  const code = (error as NodeJS.ErrnoException).code;
  const about = `cannot ${action} '${view}'`;
  switch (code) {
    case 'ENOENT':
      return notFound(`${about}: no such file or directory`);
    case 'ENOTDIR':
      return invalid(`${about}: a part of the path is not a directory`);
    case 'EEXIST':
      return new FileError('already_exists', `${about}: it already exists`, 409);
    case 'EISDIR':
      return invalid(`${about}: it is a directory`);
    case 'ENOTEMPTY':
      return new FileError('failed_precondition', `${about}: the directory is not empty`, 400);
    case 'EINVAL':
      return invalid(`${about}: invalid argument (e.g. a directory moved into itself)`);
    case 'ELOOP':
      return invalid(`${about}: a symlink is in the way`);
    case 'ENAMETOOLONG':
      return invalid(`${about}: a name is too long`);
    case 'EACCES':
    case 'EPERM':
    case 'EROFS':
      return new FileError('permission_denied', `${about}: permission denied`, 403);
    case 'ENOSPC':
    case 'EDQUOT':
      // 507 is what the SDK turns into NotEnoughSpaceError.
      return new FileError('resource_exhausted', `${about}: no space left`, 507);
    case 'EMFILE':
    case 'ENFILE':
      return new FileError('unavailable', `${about}: too many open files, retry later`, 503);
    default:
      return new FileError('internal', `${about} (${code ?? 'unexpected error'})`, 500);
  }
}

// --- Paths ------------------------------------------------------------------------------------

/** A sandbox path: how the sandbox names it, where it is on the host, and the sandbox root. */
export interface SandboxFile {
  readonly view: string;
  /** The host path (its final component not followed). */
  readonly host: string;
  /** realpath of the sandbox root. */
  readonly realRoot: string;
}

/** Moat's own files in every root (identity files, metadata); the sandbox never sees them. */
const RESERVED = '/.moat';
export const isReserved = (view: string) => view === RESERVED || view.startsWith(`${RESERVED}/`);

const inside = (root: string, candidate: string) =>
  candidate === root || candidate.startsWith(`${root}/`);

/** The sandbox path of a host path inside the root. */
export const viewOf = (realRoot: string, host: string) =>
  host === realRoot ? '/' : host.slice(realRoot.length);

/**
 * `given` (absolute in the sandbox's view, or relative to the user's home) inside the sandbox
 * root; anything that escapes it is invalid_argument, Moat's own folder permission_denied.
 */
export async function resolvePath(
  root: string,
  user: SandboxUser,
  given: string,
  followFinal: boolean,
): Promise<SandboxFile> {
  if (given.length > MAX_PATH_LENGTH) throw invalid(`path is over ${MAX_PATH_LENGTH} characters`);
  let resolved;
  try {
    resolved = await resolveInSandbox(root, given, user, { followFinal });
  } catch (error) {
    if (error instanceof SandboxPathError) throw invalid(error.message);
    throw error;
  }
  const realRoot = await realpath(root);
  const file = { view: resolved.view, host: resolved.host, realRoot };
  // The lexical view and, through symlinks inside the root, the real location.
  if (isReserved(file.view) || isReserved(viewOf(realRoot, await realDeepest(file, followFinal)))) {
    throw new FileError('permission_denied', `path '${given}' is reserved for Moat`, 403);
  }
  return file;
}

/** realpath of the deepest existing part of the path (resolveInSandbox kept it inside). */
async function realDeepest(file: SandboxFile, followFinal: boolean): Promise<string> {
  let probe = followFinal ? file.host : path.dirname(file.host);
  for (;;) {
    try {
      return await realpath(probe);
    } catch {
      if (!inside(file.realRoot, probe) || probe === file.realRoot) return file.realRoot;
      probe = path.dirname(probe);
    }
  }
}

/** On Linux an open file's real location reads back from /proc (skipped where it is absent). */
const procFd = (fd: number) => `/proc/self/fd/${fd}`;

/** Opens a file and checks that what the kernel opened is inside the root. */
export async function openInside(
  file: SandboxFile,
  flags: number,
  action: string,
  mode?: number,
): Promise<FileHandle> {
  let handle: FileHandle;
  try {
    handle = await open(file.host, flags, mode);
  } catch (error) {
    throw fileSystemError(error, file.view, action);
  }
  const real = await realpath(procFd(handle.fd)).catch(() => undefined);
  if (
    real !== undefined &&
    (!inside(file.realRoot, real) || isReserved(viewOf(file.realRoot, real)))
  ) {
    await handle.close();
    throw invalid(`path '${file.view}' leads outside the sandbox`);
  }
  return handle;
}

/** The path that opens exactly this handle's file again (for copyFile), else its host path. */
async function reopenPath(handle: FileHandle, file: SandboxFile): Promise<string> {
  const magic = procFd(handle.fd);
  return (await realpath(magic).catch(() => undefined)) === undefined ? file.host : magic;
}

// --- Metadata ---------------------------------------------------------------------------------

/*
 * Node has no extended-attribute API, so X-Metadata-* values live in sidecar files under
 * <root>/.moat/metadata, keyed by device and inode: a rename (Move, or `mv` inside the sandbox)
 * keeps them, and the recorded birth time tells a reused inode apart from the original file.
 * Snapshots do not copy .moat, so they drop metadata.
 */
const metadataDir = (realRoot: string) => path.join(realRoot, '.moat', 'metadata');
const metadataName = (stats: BigIntStats) => `${stats.dev}-${stats.ino}.json`;

export type Metadata = Record<string, string>;

const isStringMap = (value: unknown): value is Metadata =>
  typeof value === 'object' &&
  value !== null &&
  !Array.isArray(value) &&
  Object.values(value).every((v) => typeof v === 'string');

/** Reads metadata for many entries of one root (one directory listing instead of many opens). */
export class MetadataReader {
  private names: Promise<Set<string>> | undefined;

  constructor(private readonly realRoot: string) {}

  async of(stats: BigIntStats): Promise<Metadata | undefined> {
    if (!stats.isFile()) return undefined;
    this.names ??= readdir(metadataDir(this.realRoot)).then(
      (names) => new Set(names),
      () => new Set<string>(),
    );
    const name = metadataName(stats);
    if (!(await this.names).has(name)) return undefined;
    try {
      const record = JSON.parse(
        await readFile(path.join(metadataDir(this.realRoot), name), 'utf8'),
      );
      if (record.born === String(stats.birthtimeNs) && isStringMap(record.metadata)) {
        return record.metadata;
      }
    } catch {
      // A sidecar being replaced or damaged reads as no metadata.
    }
    return undefined;
  }
}

async function writeMetadata(realRoot: string, stats: BigIntStats, metadata: Metadata) {
  const folder = metadataDir(realRoot);
  await mkdir(folder, { recursive: true });
  const target = path.join(folder, metadataName(stats));
  const temporary = `${target}.${randomBytes(6).toString('hex')}`;
  await writeFile(temporary, JSON.stringify({ born: String(stats.birthtimeNs), metadata }));
  await rename(temporary, target);
}

export async function removeMetadata(realRoot: string, stats: BigIntStats): Promise<void> {
  if (stats.isFile())
    await rm(path.join(metadataDir(realRoot), metadataName(stats)), { force: true });
}

/** `X-Metadata-<key>: <value>` request headers (Node lowercases the keys, as envd does). */
function metadataOf(headers: NodeJS.Dict<string | string[]>): Metadata | undefined {
  const metadata: Metadata = {};
  let count = 0;
  for (const [name, value] of Object.entries(headers)) {
    if (!name.startsWith('x-metadata-')) continue;
    const key = name.slice('x-metadata-'.length);
    const text = Array.isArray(value) ? value.join(', ') : (value ?? '');
    if (key === '' || key.length > MAX_METADATA_KEY) {
      throw invalid(`metadata header ${name} needs a key of 1 to ${MAX_METADATA_KEY} characters`);
    }
    if (text.length > MAX_METADATA_VALUE) {
      throw invalid(`metadata ${key} is over ${MAX_METADATA_VALUE} characters`);
    }
    if (++count > MAX_METADATA_KEYS) throw invalid(`more than ${MAX_METADATA_KEYS} metadata keys`);
    metadata[key] = text;
  }
  return count > 0 ? metadata : undefined;
}

// --- EntryInfo --------------------------------------------------------------------------------

export type FileType = 'FILE_TYPE_FILE' | 'FILE_TYPE_DIRECTORY' | 'FILE_TYPE_SYMLINK';

export interface EntryInfo {
  name: string;
  /** Absent (FILE_TYPE_UNSPECIFIED, proto3's zero) for sockets, pipes and devices. */
  type?: FileType;
  path: string;
  /** int64: a string in proto3 JSON; zero values are omitted. */
  size?: string;
  mode?: number;
  permissions: string;
  owner: string;
  group: string;
  modifiedTime: string;
  symlinkTarget?: string;
  metadata?: Metadata;
}

const typeOf = (stats: BigIntStats): FileType | undefined =>
  stats.isFile()
    ? 'FILE_TYPE_FILE'
    : stats.isDirectory()
      ? 'FILE_TYPE_DIRECTORY'
      : stats.isSymbolicLink()
        ? 'FILE_TYPE_SYMLINK'
        : undefined;

/** Go's os.FileMode.String() (what envd reports): type letters, then rwxrwxrwx. */
function permissionsOf(stats: BigIntStats): string {
  const mode = Number(stats.mode);
  const letters = [
    [stats.isDirectory(), 'd'],
    [stats.isSymbolicLink(), 'L'],
    [stats.isBlockDevice() || stats.isCharacterDevice(), 'D'],
    [stats.isFIFO(), 'p'],
    [stats.isSocket(), 'S'],
    [(mode & 0o4000) !== 0, 'u'],
    [(mode & 0o2000) !== 0, 'g'],
    [stats.isCharacterDevice(), 'c'],
    [(mode & 0o1000) !== 0, 't'],
  ] as const;
  const kind = letters.flatMap(([set, letter]) => (set ? [letter] : [])).join('') || '-';
  const rwx = [...'rwxrwxrwx'].map((c, i) => (mode & (0o400 >> i) ? c : '-')).join('');
  return kind + rwx;
}

/** RFC 3339 with the file system's nanoseconds (protobuf Timestamp JSON). */
function timestampOf(ns: bigint): string {
  const seconds = ns / 1_000_000_000n;
  const fraction = ns % 1_000_000_000n;
  const base = new Date(Number(seconds) * 1000).toISOString().slice(0, 19);
  if (fraction <= 0n) return `${base}Z`;
  return `${base}.${fraction
    .toString()
    .padStart(9, '0')
    .replace(/(000)+$/, '')}Z`;
}

/**
 * Files on the host belong to Moat's own uid, which the sandbox's user namespace shows as the
 * user who looks: report that user. Other ids by the sandbox's user table, else the number.
 */
function ownerName(id: bigint, own: number | undefined, user: SandboxUser): string {
  if (own !== undefined && Number(id) === own) return user.name;
  for (const candidate of USERS.values()) if (candidate.uid === Number(id)) return candidate.name;
  return String(id);
}

/**
 * Where a symlink points, in the sandbox's view: a relative target from the link's folder, an
 * absolute one as written (the sandbox reads it from its own `/`, see runtime/paths.ts).
 */
async function symlinkTargetOf(file: SandboxFile): Promise<string | undefined> {
  const target = await readlink(file.host).catch(() => undefined);
  if (target === undefined) return undefined;
  return path.isAbsolute(target)
    ? path.posix.normalize(target)
    : path.posix.resolve(path.posix.dirname(file.view), target);
}

export async function entryInfo(
  file: SandboxFile,
  stats: BigIntStats,
  user: SandboxUser,
  metadata: MetadataReader,
): Promise<EntryInfo> {
  const type = typeOf(stats);
  const mode = Number(stats.mode) & 0o777;
  const symlinkTarget = stats.isSymbolicLink() ? await symlinkTargetOf(file) : undefined;
  const values = await metadata.of(stats);
  return {
    name: path.posix.basename(file.view) || '/',
    ...(type ? { type } : {}),
    path: file.view,
    ...(stats.size !== 0n ? { size: stats.size.toString() } : {}),
    ...(mode !== 0 ? { mode } : {}),
    permissions: permissionsOf(stats),
    owner: ownerName(stats.uid, process.getuid?.(), user),
    group: ownerName(stats.gid, process.getgid?.(), user),
    modifiedTime: timestampOf(stats.mtimeNs),
    ...(symlinkTarget !== undefined ? { symlinkTarget } : {}),
    ...(values && Object.keys(values).length > 0 ? { metadata: values } : {}),
  };
}

/** lstat with the error as the client should see it. */
export async function lstatOf(file: SandboxFile, action: string): Promise<BigIntStats> {
  try {
    return await lstat(file.host, { bigint: true });
  } catch (error) {
    throw fileSystemError(error, file.view, action);
  }
}

// --- Writing whole files ----------------------------------------------------------------------

/** Temporary names; the watchers hide them (a write shows as a write of the target). */
export const TEMPORARY_NAME = /^\.moat-(upload|compose)-[0-9a-f]{16}$/;
const temporaryIn = (folder: string, kind: 'upload' | 'compose') =>
  path.join(folder, `.moat-${kind}-${randomBytes(8).toString('hex')}`);

/**
 * Where a whole-file write of `file` lands: the file itself, or what a final symlink inside the
 * root points to. Refuses folders and special files; creates the parent folders.
 */
async function writeTarget(
  file: SandboxFile,
  action: string,
): Promise<{ host: string; mode: number | undefined }> {
  const current = await stat(file.host).catch(() => undefined);
  if (current?.isDirectory()) throw invalid(`cannot ${action} '${file.view}': it is a directory`);
  if (current && !current.isFile()) {
    throw invalid(`cannot ${action} '${file.view}': it is not a regular file`);
  }
  const host = current ? await realpath(file.host) : file.host;
  try {
    await mkdir(path.dirname(host), { recursive: true });
  } catch (error) {
    throw fileSystemError(error, path.posix.dirname(file.view), 'create the parent folders of');
  }
  return { host, mode: current ? current.mode & 0o7777 : undefined };
}

/** Creates a fresh temporary file next to `host` (never through a symlink). */
async function createTemporary(
  realRoot: string,
  host: string,
  kind: 'upload' | 'compose',
  view: string,
  mode: number | undefined,
): Promise<{ path: string; handle: FileHandle }> {
  const temporary = temporaryIn(path.dirname(host), kind);
  const handle = await openInside(
    { view, host: temporary, realRoot },
    constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
    'write',
    0o644,
  );
  // An overwrite keeps the old file's permissions (envd writes in place).
  if (mode !== undefined) await handle.chmod(mode);
  return { path: temporary, handle };
}

// --- REST helpers -----------------------------------------------------------------------------

function sendJson(response: ServerResponse, status: number, value: unknown, close = false): void {
  const body = JSON.stringify(value);
  response.writeHead(status, {
    'Content-Type': 'application/json',
    'Content-Length': Buffer.byteLength(body),
    ...(close ? { Connection: 'close' } : {}),
  });
  response.end(body);
}

const REST_STATUS: Partial<Record<ConnectCode, number>> = {
  invalid_argument: 400,
  failed_precondition: 400,
  unauthenticated: 401,
  permission_denied: 403,
  not_found: 404,
  already_exists: 409,
  resource_exhausted: 413,
  unavailable: 503,
};

/** The seed's sandbox error body `{message, code, sandboxID}` with the status as `code`. */
function sendFailure(context: CallContext, error: unknown): void {
  const { response, request, sandbox } = context;
  if (response.headersSent) {
    response.destroy();
    return;
  }
  let status = 500;
  let message = 'internal error';
  if (error instanceof FileError) [status, message] = [error.status, error.message];
  else if (error instanceof ConnectError) {
    [status, message] = [REST_STATUS[error.code] ?? 500, error.message];
  }
  if (status >= 500) {
    context.log.error({ sandboxID: sandbox.sandboxID, err: error }, 'sandbox file request failed');
  }
  // An unread request body is not drained (it may be a gigabyte): the connection closes instead.
  sendJson(
    response,
    status,
    { message, code: status, sandboxID: sandbox.sandboxID },
    !request.complete,
  );
}

const digest = (text: string) => createHash('sha256').update(text).digest();

/**
 * Signed URLs (`downloadUrl`/`uploadUrl` of secure sandboxes): `v1_` + unpadded base64 of
 * SHA-256 over `<path>:<read|write>:<user>:<token>[:<expiration>]`.
 */
function signatureValid(url: URL, token: string, operation: 'read' | 'write'): boolean {
  const given = url.searchParams.get('signature');
  if (given === null) return false;
  const expiration = url.searchParams.get('signature_expiration');
  const signed = [
    url.searchParams.get('path') ?? '',
    operation,
    url.searchParams.get('username') ?? '',
    token,
    ...(expiration !== null ? [expiration] : []),
  ].join(':');
  const expected = `v1_${digest(signed).toString('base64').replace(/=+$/, '')}`;
  // Digests of both make the comparison constant-time whatever the given length.
  return timingSafeEqual(digest(given), digest(expected));
}

/**
 * Whether `token` signed this /files URL (for either operation, expired or not): how the
 * gateway finds the sandbox of a signed URL that names none. handleFiles checks the rest.
 */
export function signatureMatches(url: URL, token: string): boolean {
  return signatureValid(url, token, 'read') || signatureValid(url, token, 'write');
}

function checkSignature(context: CallContext, url: URL, operation: 'read' | 'write'): void {
  const token = context.sandbox.accessToken;
  if (token === null || !url.searchParams.has('signature')) return;
  const expiration = url.searchParams.get('signature_expiration');
  if (expiration !== null && !/^[0-9]{1,12}$/.test(expiration)) {
    throw unauthenticated('signature_expiration must be a time in unix seconds');
  }
  if (!signatureValid(url, token, operation)) {
    throw unauthenticated(`invalid signature for ${operation} access`);
  }
  if (expiration !== null && Number(expiration) < Math.floor(Date.now() / 1000)) {
    throw unauthenticated(
      `signature expired at ${new Date(Number(expiration) * 1000).toISOString()}`,
    );
  }
}

export async function handleFiles(context: CallContext, url: URL): Promise<void> {
  try {
    const method = context.request.method;
    if (method === 'GET') {
      checkSignature(context, url, 'read');
      await download(context, url);
    } else if (method === 'POST') {
      checkSignature(context, url, 'write');
      await upload(context, url);
    } else {
      throw new FileError(
        'unimplemented',
        `${method} /files is not supported; use GET or POST`,
        405,
      );
    }
  } catch (error) {
    sendFailure(context, error);
  }
}

// --- Download ---------------------------------------------------------------------------------

async function download(context: CallContext, url: URL): Promise<void> {
  const given = url.searchParams.get('path');
  if (given === null || given === '') throw invalid('query parameter path is required');
  const file = await resolvePath(context.sandbox.runtime.root, context.user, given, true);
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  const handle = await openInside(file, constants.O_RDONLY | constants.O_NONBLOCK, 'read');
  try {
    const stats = await handle.stat();
    if (stats.isDirectory()) throw invalid(`cannot read '${file.view}': it is a directory`);
    if (!stats.isFile()) throw invalid(`cannot read '${file.view}': it is not a regular file`);
    context.response.writeHead(200, {
      'Content-Type': 'application/octet-stream',
      'Content-Length': stats.size,
    });
    if (stats.size === 0) {
      context.response.end();
      return;
    }
    // Exactly the announced length, even if the file grows meanwhile.
    await pipeline(
      handle.createReadStream({ start: 0, end: stats.size - 1, autoClose: false }),
      context.response,
    );
  } finally {
    await handle.close();
  }
}

// --- Upload -----------------------------------------------------------------------------------

interface Staged {
  readonly temporary: string;
  readonly target: string;
  readonly view: string;
  readonly realRoot: string;
  readonly stats: BigIntStats;
}

/**
 * The files of one upload, written to temporary files first and renamed into place only when
 * the whole request has arrived: an upload lands completely or not at all.
 */
class Upload {
  private readonly staged: Staged[] = [];
  private bytes = 0;

  constructor(
    private readonly context: CallContext,
    private readonly metadata: Metadata | undefined,
  ) {}

  /** Counts bytes across all parts and stops the upload past the cap. */
  private counter(): Transform {
    return new Transform({
      transform: (chunk: Buffer, _encoding, done) => {
        this.bytes += chunk.length;
        if (this.bytes > MAX_UPLOAD_BYTES) {
          done(tooLarge(`upload is over ${MAX_UPLOAD_BYTES} bytes`));
        } else done(null, chunk);
      },
    });
  }

  async add(given: string, sources: readonly Readable[]): Promise<void> {
    const file = await resolvePath(
      this.context.sandbox.runtime.root,
      this.context.user,
      given,
      true,
    );
    const target = await writeTarget(file, 'write');
    const temporary = await createTemporary(
      file.realRoot,
      target.host,
      'upload',
      file.view,
      target.mode,
    );
    let stats: BigIntStats;
    try {
      await pipeline([...sources, this.counter(), writerTo(temporary.handle)]);
      stats = await temporary.handle.stat({ bigint: true });
    } catch (error) {
      await rm(temporary.path, { force: true });
      throw uploadError(error, file.view);
    } finally {
      await temporary.handle.close();
    }
    this.staged.push({
      temporary: temporary.path,
      target: target.host,
      view: file.view,
      realRoot: file.realRoot,
      stats,
    });
    if (this.metadata) await writeMetadata(file.realRoot, stats, this.metadata);
  }

  async commit(): Promise<
    Array<{ name: string; type: 'file'; path: string; metadata?: Metadata }>
  > {
    for (const file of this.staged) {
      try {
        await rename(file.temporary, file.target);
      } catch (error) {
        throw fileSystemError(error, file.view, 'write');
      }
    }
    return this.staged.map((file) => ({
      name: path.posix.basename(file.view),
      type: 'file' as const,
      path: file.view,
      ...(this.metadata ? { metadata: this.metadata } : {}),
    }));
  }

  async discard(): Promise<void> {
    for (const file of this.staged) {
      await rm(file.temporary, { force: true });
      await removeMetadata(file.realRoot, file.stats).catch(() => undefined);
    }
  }
}

/** Writes into an open handle that stays open (fs write streams with autoClose off never close). */
function writerTo(handle: FileHandle): Writable {
  return new Writable({
    write(chunk: Buffer, _encoding, done) {
      handle.write(chunk).then(() => done(), done);
    },
  });
}

function uploadError(error: unknown, view: string): ConnectError {
  const code = (error as NodeJS.ErrnoException).code;
  if (typeof code === 'string' && code.startsWith('Z_')) {
    return invalid(`the upload to '${view}' is not valid gzip`);
  }
  if (code === 'ERR_STREAM_PREMATURE_CLOSE' || code === 'ECONNRESET') {
    return invalid(`the upload to '${view}' ended early`);
  }
  return fileSystemError(error, view, 'write');
}

async function upload(context: CallContext, url: URL): Promise<void> {
  const { request } = context;
  // Refused before reading when the announced body is already too large (multipart framing
  // adds a little; gzip only ever grows on decoding, which the byte count checks).
  const announced = Number(request.headers['content-length'] ?? 0);
  if (announced > MAX_UPLOAD_BYTES + (1 << 20)) {
    throw tooLarge(`upload is over ${MAX_UPLOAD_BYTES} bytes`);
  }
  const type = String(request.headers['content-type'] ?? '');
  const target = url.searchParams.get('path') || null;
  const files = new Upload(context, metadataOf(request.headers));
  try {
    if (/^multipart\/form-data\b/i.test(type)) {
      await receiveMultipart(context, target, files);
    } else if (/^application\/octet-stream\b/i.test(type)) {
      if (target === null) throw invalid('an application/octet-stream upload needs ?path=');
      const encoding = String(request.headers['content-encoding'] ?? 'identity')
        .trim()
        .toLowerCase();
      if (encoding === 'gzip' || encoding === 'x-gzip') {
        await files.add(target, [request, createGunzip()]);
      } else if (encoding === 'identity' || encoding === '') {
        await files.add(target, [request]);
      } else {
        throw invalid(`Content-Encoding ${encoding} is not supported (gzip is)`);
      }
    } else {
      throw invalid(
        `uploads are multipart/form-data or application/octet-stream, not ${type || 'untyped'}`,
      );
    }
    sendJson(context.response, 200, await files.commit());
  } catch (error) {
    await files.discard();
    throw error;
  }
}

/**
 * multipart/form-data: parts named `file`; with ?path= exactly one, which goes there; without,
 * each part's filename is its target (relative ones against the user's home). Parts are written
 * one after another as they arrive.
 */
function receiveMultipart(context: CallContext, target: string | null, files: Upload) {
  const { request } = context;
  return new Promise<void>((resolve, reject) => {
    let parser: busboy.Busboy;
    try {
      parser = busboy({
        headers: request.headers,
        preservePath: true,
        defParamCharset: 'utf8',
        limits: { files: MAX_UPLOAD_FILES, fields: 100, fieldSize: 64 << 10, headerPairs: 100 },
      });
    } catch (error) {
      reject(invalid(`bad multipart request: ${(error as Error).message}`));
      return;
    }
    let count = 0;
    let failed = false;
    let current: Readable | undefined;
    let chain: Promise<void> = Promise.resolve();
    const fail = (error: unknown) => {
      if (failed) return;
      failed = true;
      request.unpipe(parser);
      current?.destroy();
      // Settle only once the part being written has cleaned up after itself.
      void chain.then(() => reject(error));
    };
    parser.on('file', (name, stream, info) => {
      // Errors reach the pipeline that reads the part; one not yet read must not go unhandled.
      stream.on('error', () => undefined);
      if (failed || name !== 'file') {
        stream.resume();
        return;
      }
      count += 1;
      const given = target ?? info.filename;
      if (target !== null && count > 1) {
        stream.resume();
        fail(invalid('an upload with ?path= carries exactly one file part'));
        return;
      }
      if (!given) {
        stream.resume();
        fail(invalid('without ?path= every file part needs its target path as filename'));
        return;
      }
      chain = chain.then(async () => {
        if (failed) {
          stream.resume();
          return;
        }
        current = stream;
        try {
          await files.add(given, [stream]);
        } catch (error) {
          fail(error);
        } finally {
          current = undefined;
        }
      });
    });
    parser.on('filesLimit', () => fail(tooLarge(`more than ${MAX_UPLOAD_FILES} files`)));
    parser.on('fieldsLimit', () => fail(tooLarge('too many form fields')));
    parser.on('error', (error: Error) => fail(invalid(`bad multipart body: ${error.message}`)));
    parser.on('close', () => {
      void chain.then(() => {
        if (failed) return;
        if (count === 0) reject(invalid('the upload has no part named "file"'));
        else resolve();
      });
    });
    request.on('error', fail);
    request.pipe(parser);
  });
}

// --- Compose ----------------------------------------------------------------------------------

interface ComposeRequest {
  readonly sources: string[];
  readonly destination: string;
  readonly username: string | undefined;
}

const COMPOSE_FIELDS = ['source_paths', 'destination', 'username'];

function composeRequest(bytes: Buffer): ComposeRequest {
  let body: unknown;
  try {
    body = JSON.parse(bytes.toString());
  } catch (error) {
    throw invalid(`body is not valid JSON: ${(error as Error).message}`);
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw invalid('body must be a JSON object');
  }
  const fields = body as Record<string, unknown>;
  const unknown = Object.keys(fields).find((key) => !COMPOSE_FIELDS.includes(key));
  if (unknown !== undefined) {
    throw invalid(
      `unknown field ${JSON.stringify(unknown)}; allowed: ${COMPOSE_FIELDS.join(', ')}`,
    );
  }
  const sources = fields.source_paths;
  if (
    !Array.isArray(sources) ||
    sources.length < 1 ||
    sources.length > MAX_COMPOSE_SOURCES ||
    !sources.every((s) => typeof s === 'string' && s !== '')
  ) {
    throw invalid(`source_paths must be 1 to ${MAX_COMPOSE_SOURCES} non-empty path strings`);
  }
  if (typeof fields.destination !== 'string' || fields.destination === '') {
    throw invalid('destination must be a non-empty path string');
  }
  if (fields.username !== undefined && typeof fields.username !== 'string') {
    throw invalid('username must be a string');
  }
  return {
    sources: sources as string[],
    destination: fields.destination,
    username: fields.username,
  };
}

export async function handleCompose(context: CallContext): Promise<void> {
  try {
    await compose(context);
  } catch (error) {
    sendFailure(context, error);
  }
}

/** Sources concatenated in order into the destination; sources deleted only after success. */
async function compose(context: CallContext): Promise<void> {
  const body = composeRequest(await readBody(context.request, MAX_COMPOSE_BODY));
  const user = body.username === undefined ? context.user : USERS.get(body.username);
  if (user === undefined) {
    throw unauthenticated(
      `unknown user ${JSON.stringify(body.username)}; this sandbox has ${[...USERS.keys()].join(', ')}`,
    );
  }
  const root = context.sandbox.runtime.root;
  // Every source is checked before anything is written; each is opened only while copied.
  const sources: SandboxFile[] = [];
  for (const given of body.sources) {
    const file = await resolvePath(root, user, given, true);
    let stats;
    try {
      stats = await stat(file.host);
    } catch (error) {
      throw fileSystemError(error, file.view, 'compose from');
    }
    if (!stats.isFile()) throw invalid(`cannot compose from '${file.view}': not a regular file`);
    sources.push(file);
  }
  const destination = await resolvePath(root, user, body.destination, true);
  const target = await writeTarget(destination, 'compose into');
  const temporary = temporaryIn(path.dirname(target.host), 'compose');
  try {
    await concatenate(sources, { ...destination, host: temporary }, target.mode);
    try {
      await rename(temporary, target.host);
    } catch (error) {
      throw fileSystemError(error, destination.view, 'compose into');
    }
  } catch (error) {
    await rm(temporary, { force: true });
    throw error;
  }
  const result = await realpath(target.host).catch(() => target.host);
  for (const source of sources) {
    // A source that is (or leads to) the destination is now the result: keep it.
    const real = await realpath(source.host).catch(() => undefined);
    if (real === result) continue;
    await rm(source.host, { force: true }).catch((error: unknown) =>
      context.log.warn(
        { sandboxID: context.sandbox.sandboxID, path: source.view, err: error },
        'compose could not remove a source',
      ),
    );
  }
  sendJson(context.response, 200, {
    path: destination.view,
    name: path.posix.basename(destination.view),
    type: 'file',
  });
}

/**
 * The first source is copied by the kernel (copy_file_range, or a reflink where the file
 * system has them); the rest are appended in bounded chunks, never read whole into memory.
 */
async function concatenate(
  sources: readonly SandboxFile[],
  temporary: SandboxFile,
  mode: number | undefined,
): Promise<void> {
  const [first, ...rest] = sources as [SandboxFile, ...SandboxFile[]];
  const source = await openSource(first);
  try {
    await copyFile(
      await reopenPath(source, first),
      temporary.host,
      constants.COPYFILE_EXCL | constants.COPYFILE_FICLONE,
    );
  } catch (error) {
    throw fileSystemError(error, temporary.view, 'compose into');
  } finally {
    await source.close();
  }
  const output = await openInside(
    temporary,
    constants.O_WRONLY | constants.O_APPEND | constants.O_NOFOLLOW,
    'compose into',
  );
  try {
    await output.chmod(mode ?? 0o644);
    const buffer = Buffer.allocUnsafe(COPY_CHUNK);
    for (const file of rest) {
      const input = await openSource(file);
      try {
        for (;;) {
          const { bytesRead } = await input.read(buffer, 0, buffer.length, null);
          if (bytesRead === 0) break;
          await output.write(buffer, 0, bytesRead);
        }
      } catch (error) {
        throw fileSystemError(error, file.view, 'compose from');
      } finally {
        await input.close();
      }
    }
  } finally {
    await output.close();
  }
}

async function openSource(file: SandboxFile): Promise<FileHandle> {
  const handle = await openInside(file, constants.O_RDONLY | constants.O_NONBLOCK, 'compose from');
  if (!(await handle.stat()).isFile()) {
    await handle.close();
    throw invalid(`cannot compose from '${file.view}': not a regular file`);
  }
  return handle;
}
