/**
 * The JSON answers Moat's own HTTP servers write outside Fastify (the sandbox API, ingress, the
 * sandbox listener's router): one way to write a JSON body, and the sandbox error body
 * `{message, code, sandboxID}` that the SDK reads, for a ServerResponse or a raw socket; and the
 * platform's error body, which the API's Fastify routes and the egress proxy send (and envd sends
 * for a refused signed URL).
 */
import type { ServerResponse } from 'node:http';

/** A JSON body with its headers; `close` asks the client to close (an unread request body). */
export function jsonAnswer(
  value: unknown,
  close = false,
): { readonly body: string; readonly headers: Record<string, string> } {
  const body = JSON.stringify(value);
  return {
    body,
    headers: {
      'Content-Type': 'application/json',
      'Content-Length': String(Buffer.byteLength(body)),
      ...(close ? { Connection: 'close' } : {}),
    },
  };
}

/** The platform's error body (`{code, message}`, as E2B's API answers errors). */
export const errorBody = (code: number, message: string) => ({ code, message });

/** The sandbox error body as Moat and the SDK know it. */
export const sandboxErrorBody = (status: number, message: string, sandboxID: string) => ({
  message,
  code: status,
  sandboxID,
});

/**
 * A signed `/files` URL refused: 401 with the body E2B's envd answers, `{code, message}` and no
 * sandboxID, in its words (`invalid signature`, `signature is already expired`), which E2B's own
 * tests compare whole.
 */
export function sendSignatureRefused(
  response: ServerResponse,
  message = 'invalid signature',
  close = false,
): void {
  sendJson(response, 401, errorBody(401, message), close);
}

/** Answers with `value` as JSON; a response already begun is cut (its status is gone). */
export function sendJson(
  response: ServerResponse,
  status: number,
  value: unknown,
  close = false,
): void {
  if (response.headersSent) {
    response.destroy();
    return;
  }
  const { body, headers } = jsonAnswer(value, close);
  response.writeHead(status, headers).end(body);
}

/** The sandbox error body `{message, code, sandboxID}` with `status` as code. */
export function sendSandboxError(
  response: ServerResponse,
  status: number,
  message: string,
  sandboxID: string,
  close = false,
): void {
  sendJson(response, status, sandboxErrorBody(status, message, sandboxID), close);
}
