/**
 * The per-sandbox API (what the reference service's in-sandbox daemon serves on port 49983):
 * Connect services `process.Process` and `filesystem.Filesystem`, and REST `/health`, `/envs`,
 * `/files`, `/files/compose`. Routing to a sandbox happens before (the sandbox listener's
 * router); this answers one request for one known sandbox.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { DEFAULT_USER, type SandboxUser, USERS } from '../runtime/index.js';
import {
  ConnectError,
  deadlineOf,
  parseMessage,
  parseStreamRequest,
  readBody,
  sendUnaryError,
  ServerStream,
} from './connect.js';
import type { CallContext, EnvdSandbox, Method } from './context.js';
import { FileError, sendFileFailure } from './file-errors.js';
import { compose } from './files/compose.js';
import { download } from './files/download.js';
import { upload } from './files/upload.js';
import { sendJson, sendSandboxError, sendSignatureRefused } from '../e2b-wire/index.js';
import { sameSecret } from '../secret-compare/index.js';
import { FILESYSTEM_METHODS } from './filesystem-service.js';
import { PROCESS_METHODS } from './process-service.js';
import { signatureRefusal } from './signed-urls.js';

const SERVICES: Readonly<Record<string, Readonly<Record<string, Method>>>> = {
  'process.Process': PROCESS_METHODS,
  'filesystem.Filesystem': FILESYSTEM_METHODS,
};

/** Requests larger than this are refused (uploads go through /files, which streams). */
const MAX_RPC_BODY = 4 << 20;

/** `Authorization: Basic base64("<user>:")` on RPCs, `username=` on /files; default `user`. */
function userOf(request: IncomingMessage, url: URL): SandboxUser | undefined {
  const auth = request.headers.authorization;
  let name = url.searchParams.get('username') ?? undefined;
  if (typeof auth === 'string' && auth.startsWith('Basic ')) {
    const decoded = Buffer.from(auth.slice(6), 'base64').toString('utf8');
    name = decoded.split(':')[0];
  }
  if (name === undefined || name === '') return DEFAULT_USER;
  return USERS.get(name);
}

export class SandboxApi {
  constructor(private readonly logger: Logger) {}

  async handle(
    request: IncomingMessage,
    response: ServerResponse,
    sandbox: EnvdSandbox,
  ): Promise<void> {
    const url = new URL(request.url ?? '/', 'http://sandbox');
    const { sandboxID } = sandbox;
    if (request.method === 'GET' && url.pathname === '/health') {
      response.writeHead(204).end();
      return;
    }
    if (sandbox.accessToken !== null && !this.authorized(request, url, sandbox.accessToken)) {
      sendSandboxError(response, 401, 'missing or invalid X-Access-Token', sandboxID);
      return;
    }
    const user = userOf(request, url);
    if (user === undefined) {
      sendSandboxError(
        response,
        401,
        `unknown user; this sandbox has ${[...USERS.keys()].join(', ')}`,
        sandboxID,
      );
      return;
    }
    const context: CallContext = {
      sandbox,
      user,
      request,
      response,
      deadlineMs: deadlineOf(request),
      keepaliveMs: keepaliveOf(request),
      log: this.logger,
    };
    try {
      if (url.pathname === '/envs' && request.method === 'GET') {
        sendJson(response, 200, sandbox.envVars);
      } else if (
        url.pathname === '/files' ||
        (url.pathname === '/files/compose' && request.method === 'POST')
      ) {
        await this.files(context, url);
      } else {
        await this.rpc(context, url.pathname);
      }
    } catch (error) {
      this.fail(context, error);
    }
  }

  /** X-Access-Token; `/files` may instead carry a signature (checked in `files`). */
  private authorized(request: IncomingMessage, url: URL, token: string): boolean {
    const given = request.headers['x-access-token'];
    if (typeof given === 'string' && sameSecret(given, token)) return true;
    return url.pathname === '/files' && url.searchParams.has('signature');
  }

  /**
   * The REST file routes: a failure is a status with the sandbox error body, not a Connect one;
   * a refused signature is answered as envd answers it.
   */
  private async files(context: CallContext, url: URL): Promise<void> {
    const { method } = context.request;
    if (url.pathname === '/files' && (method === 'GET' || method === 'POST')) {
      const operation = method === 'GET' ? 'read' : 'write';
      const refusal = signatureRefusal(context.sandbox.accessToken, url, operation);
      if (refusal !== undefined) {
        sendSignatureRefused(context.response, refusal, !context.request.complete);
        return;
      }
    }
    try {
      if (url.pathname === '/files/compose') {
        await compose(context);
      } else if (method === 'GET') {
        await download(context, url);
      } else if (method === 'POST') {
        await upload(context, url);
      } else {
        throw new FileError(
          'unimplemented',
          `${method} /files is not supported; use GET or POST`,
          405,
        );
      }
    } catch (error) {
      sendFileFailure(context, error);
    }
  }

  private async rpc(context: CallContext, pathname: string): Promise<void> {
    const { request } = context;
    const [, service, name] = pathname.split('/');
    const method = service && name ? SERVICES[service]?.[name] : undefined;
    if (request.method !== 'POST' || method === undefined) {
      throw new ConnectError('unimplemented', `no such operation: ${request.method} ${pathname}`);
    }
    // A request that does not speak the method's protocol gets a plain (unary) error.
    if (request.headers['connect-protocol-version'] !== '1') {
      throw new ConnectError('invalid_argument', 'header Connect-Protocol-Version: 1 is required');
    }
    const contentType = String(request.headers['content-type'] ?? '');
    const expected = method.kind === 'unary' ? 'application/json' : 'application/connect+json';
    if (contentType.split(';')[0]!.trim().toLowerCase() !== expected) {
      throw new ConnectError(
        'invalid_argument',
        `${name} takes ${expected}, not ${contentType || 'no content type'}`,
      );
    }
    try {
      await this.call(context, method);
    } catch (error) {
      // A unary call's errors are a status and a JSON body; a stream's travel in its end frame
      // with HTTP 200 (see connect.ts).
      if (method.kind === 'unary') throw error;
      this.endStream(context, error);
    }
  }

  private async call(context: CallContext, method: Method): Promise<void> {
    const { request, response } = context;
    if (method.kind === 'unary') {
      const message = parseMessage(await readBody(request, MAX_RPC_BODY));
      sendJson(response, 200, await method.run(message, context));
      return;
    }
    if (method.kind === 'client-stream') {
      const reply = await method.run(context);
      const stream = new ServerStream(response);
      stream.send(reply);
      stream.end();
      return;
    }
    const message = parseStreamRequest(await readBody(request, MAX_RPC_BODY), MAX_RPC_BODY);
    const stream = new ServerStream(response);
    try {
      await method.run(message, context, stream);
    } catch (error) {
      stream.end(asConnectError(error, context));
    }
  }

  private endStream(context: CallContext, error: unknown): void {
    if (context.response.headersSent) {
      context.response.destroy();
      return;
    }
    new ServerStream(context.response).end(asConnectError(error, context));
  }

  private fail(context: CallContext, error: unknown): void {
    const { response, sandbox } = context;
    if (response.headersSent) {
      response.destroy();
      return;
    }
    sendUnaryError(response, asConnectError(error, context), sandbox.sandboxID);
  }
}

function asConnectError(error: unknown, context: CallContext): ConnectError {
  if (error instanceof ConnectError) return error;
  context.log.error(
    { sandboxID: context.sandbox.sandboxID, err: error },
    'sandbox API operation failed',
  );
  return new ConnectError('internal', (error as Error).message);
}

function keepaliveOf(request: IncomingMessage): number | undefined {
  const header = request.headers['keepalive-ping-interval'];
  if (typeof header !== 'string' || !/^[0-9]{1,6}$/.test(header) || header === '0')
    return undefined;
  return Number(header) * 1000;
}
