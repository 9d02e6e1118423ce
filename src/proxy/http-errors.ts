import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Decision } from '../policy/index.js';

/** The headers and JSON body of every proxy error: `{"code": <status>, "message": ...}`. */
export function errorResponse(
  status: number,
  message: string,
  decision?: Decision,
  extra: Record<string, string> = {},
) {
  const body = JSON.stringify({ code: status, message });
  const headers: Record<string, string> = {
    'Content-Type': 'application/json',
    'Content-Length': String(Buffer.byteLength(body)),
    ...extra,
  };
  if (decision !== undefined) {
    headers['X-Moat-Decision'] =
      `${decision.verdict}; list=${decision.list}${decision.rule === null ? '' : `; rule=${JSON.stringify(decision.rule)}`}`;
  }
  return { headers, body };
}

/** A whole error response as text; `close` adds `Connection: close`. */
export function errorResponseText(
  status: number,
  message: string,
  decision: Decision | undefined,
  extra: Record<string, string>,
  close: boolean,
): string {
  const { headers, body } = errorResponse(
    status,
    message,
    decision,
    close ? { Connection: 'close', ...extra } : extra,
  );
  let head = '';
  for (const [name, value] of Object.entries(headers)) head += `${name}: ${value}\r\n`;
  return `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\n${head}\r\n${body}`;
}

/**
 * Ends a raw socket after `text`, reading on (and dropping what comes) so the client's FIN can
 * arrive and the socket be freed; destroyed after `lingerMs` if the client never closes.
 */
export function endAndLinger(socket: Duplex, text: string | undefined, lingerMs: number): void {
  if (socket.destroyed) return;
  socket.removeAllListeners('data');
  socket.resume();
  if (text === undefined) socket.end();
  else socket.end(text);
  const timer = setTimeout(() => socket.destroy(), lingerMs);
  timer.unref();
  socket.once('close', () => clearTimeout(timer));
}

/** How long a refused client may take to read its answer and close. */
const REFUSED_LINGER_MS = 10_000;

/** Writes an error on a raw socket and closes it. */
export function writeRawError(
  socket: Duplex,
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
