/**
 * `POST /files`: files written into the sandbox by the file agent of the user asking (runtime
 * SandboxFiles), as multipart/form-data or one application/octet-stream body (gzip allowed),
 * with `X-Metadata-*` headers; what a request may carry is bounded here.
 *
 * An upload lands completely or not at all: each file is written under a temporary name beside
 * its target and every file of the request is renamed into place only once all have arrived.
 */
import path from 'node:path';
import { Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import busboy from 'busboy';
import type { CallContext } from '../context.js';
import { fileError, invalid, tooLarge } from '../file-errors.js';
import { sendJson } from '../../e2b-wire/index.js';

/** Largest upload (all parts together, after gzip decoding). */
const MAX_UPLOAD_BYTES = 1 << 30;
/** Most file parts in one multipart upload. */
const MAX_UPLOAD_FILES = 1000;
/** File metadata, as envd bounds it: a key fits an xattr name after `user.e2b.`. */
const MAX_METADATA_KEY = 246;
const MAX_METADATA_BYTES = 4096;
const METADATA_PREFIX = 'user.e2b.';

type Metadata = Record<string, string>;

const PRINTABLE = /^[\x20-\x7e]*$/;

/**
 * `X-Metadata-<key>: <value>` request headers (keys lower case, the first of repeated ones):
 * printable ASCII, each key at most 246 bytes, all together at most 4096 bytes with the xattr
 * prefix counted per key. Every upload replaces a file's metadata (none clears it).
 */
function metadataOf(rawHeaders: readonly string[]): Metadata {
  const metadata: Metadata = {};
  let bytes = 0;
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (!name.startsWith('x-metadata-')) continue;
    const key = name.slice('x-metadata-'.length);
    const value = rawHeaders[i + 1]!;
    if (key === '' || key in metadata) continue;
    if (!PRINTABLE.test(key) || !PRINTABLE.test(value)) {
      throw invalid(`metadata ${key || name} must be printable US-ASCII (bytes 0x20 to 0x7e)`);
    }
    if (key.length > MAX_METADATA_KEY) {
      throw invalid(`metadata key ${key.slice(0, 40)}... is over ${MAX_METADATA_KEY} bytes`);
    }
    bytes += METADATA_PREFIX.length + key.length + value.length;
    if (bytes > MAX_METADATA_BYTES) {
      throw invalid(
        `metadata is over ${MAX_METADATA_BYTES} bytes in all (keys with user.e2b., values)`,
      );
    }
    metadata[key] = value;
  }
  return metadata;
}

type Staging = Awaited<ReturnType<CallContext['sandbox']['runtime']['files']['upload']>>;

/** Counts the bytes of one upload across its parts. */
class ByteBudget {
  private used = 0;

  take(bytes: number): void {
    this.used += bytes;
    if (this.used > MAX_UPLOAD_BYTES) throw tooLarge(`upload is over ${MAX_UPLOAD_BYTES} bytes`);
  }
}

async function stageFile(
  staging: Staging,
  given: string,
  source: Readable,
  metadata: Metadata,
  budget: ByteBudget,
): Promise<string> {
  let staged;
  try {
    staged = await staging.stage(given, metadata);
  } catch (error) {
    source.resume();
    throw fileError(error, given, 'write');
  }
  try {
    for await (const chunk of source) {
      budget.take((chunk as Buffer).length);
      await staged.write(chunk as Buffer);
    }
    await staged.end();
  } catch (error) {
    source.destroy();
    const code = (error as NodeJS.ErrnoException).code;
    if (typeof code === 'string' && code.startsWith('Z_')) {
      throw invalid(`the upload to '${given}' is not valid gzip`);
    }
    if (code === 'ERR_STREAM_PREMATURE_CLOSE' || code === 'ECONNRESET') {
      throw invalid(`the upload to '${given}' ended early`);
    }
    throw fileError(error, given, 'write');
  }
  return staged.path;
}

export async function upload(context: CallContext, url: URL): Promise<void> {
  const { request } = context;
  // Refused before reading when the announced body is already too large (multipart framing
  // adds a little; gzip only ever grows on decoding, which the byte count checks).
  const announced = Number(request.headers['content-length'] ?? 0);
  if (announced > MAX_UPLOAD_BYTES + (1 << 20)) {
    throw tooLarge(`upload is over ${MAX_UPLOAD_BYTES} bytes`);
  }
  const type = String(request.headers['content-type'] ?? '');
  const target = url.searchParams.get('path') || null;
  const metadata = metadataOf(request.rawHeaders);
  const staging = await context.sandbox.runtime.files.upload(context.user.name);
  const budget = new ByteBudget();
  const written: string[] = [];
  try {
    if (/^multipart\/form-data\b/i.test(type)) {
      await receiveMultipart(context, target, async (given, stream) => {
        written.push(await stageFile(staging, given, stream, metadata, budget));
      });
    } else if (/^application\/octet-stream\b/i.test(type)) {
      if (target === null) throw invalid('an application/octet-stream upload needs ?path=');
      const encoding = String(request.headers['content-encoding'] ?? 'identity')
        .trim()
        .toLowerCase();
      let source: Readable = request;
      if (encoding === 'gzip' || encoding === 'x-gzip') {
        const gunzip = createGunzip();
        // Bad gzip can fail while the file is still being staged, before anything reads it: the
        // error stays on the stream (the read reports it), it must not be an uncaught exception.
        gunzip.on('error', () => undefined);
        request.on('error', (error) => gunzip.destroy(error));
        source = request.pipe(gunzip);
      } else if (encoding !== 'identity' && encoding !== '') {
        throw invalid(`Content-Encoding ${encoding} is not supported (gzip is)`);
      }
      written.push(await stageFile(staging, target, source, metadata, budget));
    } else {
      throw invalid(
        `uploads are multipart/form-data or application/octet-stream, not ${type || 'untyped'}`,
      );
    }
    await staging.commit().catch((error: unknown) => {
      throw fileError(error, target ?? written[0] ?? '', 'write');
    });
  } catch (error) {
    await staging.abort();
    throw error;
  }
  const values = Object.keys(metadata).length > 0 ? { metadata } : {};
  sendJson(
    context.response,
    200,
    written.map((view) => ({
      name: path.posix.basename(view),
      type: 'file',
      path: view,
      ...values,
    })),
  );
}

/** Largest form field taken: fields are held in memory, so bigger content must be a file part. */
const FIELD_BYTES = 64 << 10;

/**
 * multipart/form-data: parts named `file`; with ?path= exactly one, which goes there; without,
 * each part's filename is its target (relative ones against the user's home). Parts are written
 * one after another as they arrive. A `file` part without a filename (a plain form field) is
 * content too, for ?path=.
 */
function receiveMultipart(
  context: CallContext,
  target: string | null,
  write: (given: string, stream: Readable) => Promise<void>,
): Promise<void> {
  const { request } = context;
  return new Promise<void>((resolve, reject) => {
    let parser: busboy.Busboy;
    try {
      parser = busboy({
        headers: request.headers,
        preservePath: true,
        defParamCharset: 'utf8',
        limits: { files: MAX_UPLOAD_FILES, fields: 100, fieldSize: FIELD_BYTES, headerPairs: 100 },
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
    /** One part named `file`, in turn; `filename` is undefined for a plain form field. */
    const part = (stream: Readable, filename: string | undefined) => {
      count += 1;
      const given = target ?? filename;
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
          await write(given, stream);
        } catch (error) {
          fail(error);
        } finally {
          current = undefined;
        }
      });
    };
    parser.on('file', (name, stream, info) => {
      // Errors reach the loop that reads the part; one not yet read must not go unhandled.
      stream.on('error', () => undefined);
      if (failed || name !== 'file') {
        stream.resume();
        return;
      }
      part(stream, info.filename);
    });
    // `form.append('file', 'text')` (no Blob) sends the content as a field: it is the file too.
    parser.on('field', (name, value, info) => {
      if (failed || name !== 'file') return;
      if (info.valueTruncated) {
        fail(tooLarge(`a form field named file is over ${FIELD_BYTES} bytes; send it as a file`));
        return;
      }
      part(Readable.from([Buffer.from(value, 'utf8')]), undefined);
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
