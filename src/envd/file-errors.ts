/**
 * Errors of the sandbox API's file operations: one Connect code and one /files HTTP status
 * each, and the file agent's answers (an errno name, or invalid/exists/exhausted) turned into
 * them with the path as the sandbox names it. A host path never appears in a message.
 */
import { FileAgentError, RoleStalled } from '../runtime/index.js';
import { type ConnectCode, ConnectError } from './connect.js';
import type { CallContext } from './context.js';
import { sendSandboxError } from '../e2b-wire/index.js';

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
export const unauthenticated = (message: string) => new FileError('unauthenticated', message, 401);
export const tooLarge = (message: string) => new FileError('resource_exhausted', message, 413);

const BY_ERRNO: Readonly<Record<string, [ConnectCode, number, string]>> = {
  ENOENT: ['not_found', 404, 'no such file or directory'],
  ENOTDIR: ['invalid_argument', 400, 'a part of the path is not a directory'],
  EEXIST: ['already_exists', 409, 'it already exists'],
  EISDIR: ['invalid_argument', 400, 'it is a directory'],
  ENOTEMPTY: ['failed_precondition', 400, 'the directory is not empty'],
  EINVAL: ['invalid_argument', 400, 'invalid argument (e.g. a directory moved into itself)'],
  ELOOP: ['invalid_argument', 400, 'too many symlinks in the path'],
  ENAMETOOLONG: ['invalid_argument', 400, 'a name is too long'],
  EXDEV: ['invalid_argument', 400, 'source and destination are on different file systems'],
  EACCES: ['permission_denied', 403, 'permission denied'],
  EPERM: ['permission_denied', 403, 'permission denied'],
  EROFS: ['permission_denied', 403, 'the file system is read-only there'],
  EBUSY: ['failed_precondition', 400, 'it is in use (a mount point)'],
  // 507 is what the SDK turns into NotEnoughSpaceError.
  ENOSPC: ['resource_exhausted', 507, 'no space left'],
  EDQUOT: ['resource_exhausted', 507, 'no space left'],
  EMFILE: ['unavailable', 503, 'too many open files, retry later'],
  ENFILE: ['unavailable', 503, 'too many open files, retry later'],
};

/** A failed file operation as the client should see it, naming the path it gave. */
export function fileError(error: unknown, path: string, action: string): ConnectError {
  if (error instanceof ConnectError) return error;
  if (error instanceof RoleStalled) {
    // The agent was stopped or stuck: the call fails now, the next one gets a new agent.
    return new FileError('deadline_exceeded', `cannot ${action} '${path}': ${error.message}`, 504);
  }
  if (!(error instanceof FileAgentError)) {
    return new FileError(
      'internal',
      `cannot ${action} '${path}': ${(error as Error).message}`,
      500,
    );
  }
  const about =
    error.path === undefined
      ? `cannot ${action} '${path}'`
      : `cannot ${action} '${path}' from '${error.path}'`;
  switch (error.code) {
    case 'invalid':
      return invalid(`${about}: ${error.message}`);
    case 'exists':
      return new FileError('already_exists', error.message, 409);
    case 'exhausted':
      return new FileError('resource_exhausted', error.message, 413);
  }
  const known = BY_ERRNO[error.code];
  if (known === undefined) {
    return new FileError('internal', `${about} (${error.code})`, 500);
  }
  const [code, status, reason] = known;
  return new FileError(code, `${about}: ${reason}`, status);
}

const REST_STATUS: Partial<Record<ConnectCode, number>> = {
  invalid_argument: 400,
  failed_precondition: 400,
  unauthenticated: 401,
  permission_denied: 403,
  not_found: 404,
  already_exists: 409,
  resource_exhausted: 413,
  unimplemented: 405,
  unavailable: 503,
};

/** A /files failure as a REST reply (or a cut connection, when the reply had begun). */
export function sendFileFailure(context: CallContext, error: unknown): void {
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
  if (status >= 500 && status !== 507 && status !== 503) {
    context.log.error({ sandboxID: sandbox.sandboxID, err: error }, 'sandbox file request failed');
  }
  // An unread request body is not drained (it may be a gigabyte): the connection closes instead.
  sendSandboxError(response, status, message, sandbox.sandboxID, !request.complete);
}
