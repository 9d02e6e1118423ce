/**
 * The live console at `/ui/`: a few static files from the package's `console/` folder. They hold
 * no data, so they need no API key; the page asks for one and reads everything from the
 * authenticated API. Only the files named here are served, read once when the API is made, so no
 * request path can reach any other file.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { FastifyInstance, FastifyReply } from 'fastify';
import { packageRoot } from '../process/index.js';
import { errorBody } from '../e2b-wire/index.js';

export const CONSOLE_PATH = '/ui/';

/** Every file of the console and its content type; nothing else is served under /ui/. */
export const CONSOLE_FILES: Readonly<Record<string, string>> = {
  'index.html': 'text/html; charset=utf-8',
  'console.css': 'text/css; charset=utf-8',
  'main.js': 'text/javascript; charset=utf-8',
  'api.js': 'text/javascript; charset=utf-8',
  'dom.js': 'text/javascript; charset=utf-8',
  'flows.js': 'text/javascript; charset=utf-8',
  'sandboxes.js': 'text/javascript; charset=utf-8',
};

/**
 * Scripts, styles and API calls from this origin only; no inline script or style, no plugins,
 * no framing, no form posted elsewhere.
 */
export const CONSOLE_CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self'",
  "connect-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

interface ConsoleFile {
  readonly body: Buffer;
  readonly type: string;
  readonly etag: string;
}

/** The console's files from `folder`, and the names of any that could not be read. */
export function loadConsoleFiles(folder: string): {
  files: Map<string, ConsoleFile>;
  missing: string[];
} {
  const files = new Map<string, ConsoleFile>();
  const missing: string[] = [];
  for (const [name, type] of Object.entries(CONSOLE_FILES)) {
    try {
      const body = readFileSync(path.join(folder, name));
      const etag = `"${createHash('sha256').update(body).digest('base64url').slice(0, 22)}"`;
      files.set(name, { body, type, etag });
    } catch {
      missing.push(name);
    }
  }
  return { files, missing };
}

/**
 * Adds GET /ui (a redirect, so the page's relative links resolve under /ui/), /ui/ (the page)
 * and /ui/<file>. The router ignores trailing slashes, so /ui and /ui/ reach one handler.
 */
export function registerConsole(
  app: FastifyInstance,
  folder = path.join(packageRoot() ?? '.', 'console'),
): void {
  const { files, missing } = loadConsoleFiles(folder);
  if (missing.length > 0)
    app.log.warn({ folder, missing }, 'console files missing: /ui/ answers 404 for them');

  const send = (reply: FastifyReply, name: string, ifNoneMatch: string | undefined) => {
    const file = files.get(name);
    if (file === undefined) {
      const why = name in CONSOLE_FILES ? `is missing from ${folder}` : 'is not a console file';
      return reply.code(404).send(errorBody(404, `${CONSOLE_PATH}${name} ${why}`));
    }
    reply
      .header('content-type', file.type)
      .header('content-security-policy', CONSOLE_CSP)
      .header('x-content-type-options', 'nosniff')
      .header('referrer-policy', 'no-referrer')
      .header('x-frame-options', 'DENY')
      // Revalidated on every load: a new Moat's files are never hidden behind an old copy.
      .header('cache-control', 'no-cache')
      .header('etag', file.etag);
    if (ifNoneMatch === file.etag) return reply.code(304).send();
    return reply.send(file.body);
  };

  app.get('/ui/', async (request, reply) => {
    if (!request.url.split('?')[0]!.endsWith('/')) return reply.redirect(CONSOLE_PATH, 301);
    return send(reply, 'index.html', request.headers['if-none-match']);
  });
  app.get<{ Params: { file: string } }>('/ui/:file', async (request, reply) =>
    send(reply, request.params.file, request.headers['if-none-match']),
  );
}
