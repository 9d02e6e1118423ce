/**
 * `POST /files/compose`: sources concatenated in order into the destination by the file agent,
 * sources deleted only after success.
 */
import path from 'node:path';
import { USERS } from '../../runtime/index.js';
import { readBody } from '../connect.js';
import type { CallContext } from '../context.js';
import { fileError, invalid, unauthenticated } from '../file-errors.js';
import { sendJson } from '../../e2b-wire/index.js';

/** Most files one compose may concatenate. */
const MAX_COMPOSE_SOURCES = 1000;
const MAX_COMPOSE_BODY = 8 << 20;

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

/** The compose a request asks for, answered with the destination written. */
export async function compose(context: CallContext): Promise<void> {
  const body = composeRequest(await readBody(context.request, MAX_COMPOSE_BODY));
  const user = body.username === undefined ? context.user : USERS.get(body.username);
  if (user === undefined) {
    throw unauthenticated(
      `unknown user ${JSON.stringify(body.username)}; this sandbox has ${[...USERS.keys()].join(', ')}`,
    );
  }
  const composed = await context.sandbox.runtime.files
    .compose(user.name, body.sources, body.destination)
    .catch((error: unknown) => {
      throw fileError(error, body.destination, 'compose into');
    });
  sendJson(context.response, 200, {
    path: composed,
    name: path.posix.basename(composed),
    type: 'file',
  });
}
