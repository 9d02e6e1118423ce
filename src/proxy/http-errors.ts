import type { ServerResponse } from 'node:http';
import { STATUS_CODES } from 'node:http';
import type net from 'node:net';
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

/** Writes an error on a raw socket (CONNECT, before any tunnel) and closes it. */
export function writeRawError(
  socket: net.Socket,
  status: number,
  message: string,
  decision?: Decision,
  extra?: Record<string, string>,
): void {
  if (socket.destroyed) return;
  const { headers, body } = errorResponse(status, message, decision, {
    Connection: 'close',
    ...extra,
  });
  const head = Object.entries(headers)
    .map(([name, value]) => `${name}: ${value}\r\n`)
    .join('');
  socket.end(`HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\n${head}\r\n${body}`);
}

export function sendError(
  res: ServerResponse,
  status: number,
  message: string,
  decision?: Decision,
  extra?: Record<string, string>,
): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const { headers, body } = errorResponse(status, message, decision, extra);
  res.writeHead(status, headers).end(body);
}
