import { STATUS_CODES } from 'node:http';
import type net from 'node:net';
import type { Decision } from '../policy/index.js';
import { errorBody, jsonAnswer } from '../e2b-wire/index.js';

/** The headers and JSON body of every proxy error: the platform's `{code, message}`. */
export function errorResponse(
  status: number,
  message: string,
  decision?: Decision,
  extra: Record<string, string> = {},
) {
  const answer = jsonAnswer(errorBody(status, message));
  const headers: Record<string, string> = { ...answer.headers, ...extra };
  if (decision !== undefined) {
    headers['X-Moat-Decision'] =
      `${decision.verdict}; list=${decision.list}${decision.rule === null ? '' : `; rule=${JSON.stringify(decision.rule)}`}`;
  }
  return { headers, body: answer.body };
}

/**
 * A whole error response as text; `close` adds `Connection: close`. An answer to HEAD
 * (`toHead`) has the same header fields and no body (RFC 9110 9.3.2): a client keeping the
 * connection would read a body as the start of its next response.
 */
export function errorResponseText(
  status: number,
  message: string,
  decision: Decision | undefined,
  extra: Record<string, string>,
  close: boolean,
  toHead = false,
): string {
  const { headers, body } = errorResponse(
    status,
    message,
    decision,
    close ? { Connection: 'close', ...extra } : extra,
  );
  let head = '';
  for (const [name, value] of Object.entries(headers)) head += `${name}: ${value}\r\n`;
  return `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\n${head}\r\n${toHead ? '' : body}`;
}

/**
 * However a client behaves, a socket Moat has ended goes at the latest this many lingers after
 * the end (one that never reads but keeps sending resets the idle timer).
 */
const LINGER_LIMIT = 6;

/**
 * Ends a raw socket after `text`, reading on (and dropping what comes) so the client's FIN can
 * arrive and the socket be freed. Destroyed once nothing moved either way for `lingerMs` (a
 * client still reading a long answer keeps it: Node counts a write's partial progress), one
 * `lingerMs` after the last byte was written, and at the latest `LINGER_LIMIT` lingers after the
 * end.
 */
export function endAndLinger(socket: net.Socket, text: string | undefined, lingerMs: number): void {
  if (socket.destroyed) return;
  socket.removeAllListeners('data');
  socket.resume();
  if (text === undefined) socket.end();
  else socket.end(text);
  socket.setTimeout(lingerMs, () => socket.destroy());
  const limit = setTimeout(() => socket.destroy(), LINGER_LIMIT * lingerMs).unref();
  const written = () => {
    clearTimeout(limit);
    const deadline = setTimeout(() => socket.destroy(), lingerMs).unref();
    socket.once('close', () => clearTimeout(deadline));
  };
  socket.once('close', () => clearTimeout(limit));
  if (socket.writableFinished) written();
  else socket.once('finish', written);
}

/** How long a refused client may take to read its answer and close. */
const REFUSED_LINGER_MS = 10_000;

/** Writes an error on a raw socket and closes it. */
export function writeRawError(
  socket: net.Socket,
  status: number,
  message: string,
  decision?: Decision,
  extra: Record<string, string> = {},
): void {
  endAndLinger(
    socket,
    errorResponseText(status, message, decision, extra, true),
    REFUSED_LINGER_MS,
  );
}
