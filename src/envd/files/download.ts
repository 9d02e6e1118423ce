/**
 * `GET /files`: a file of the sandbox, read by the file agent of the user asking, streamed as
 * it is (no encoding).
 */
import { pipeline } from 'node:stream/promises';
import type { CallContext } from '../context.js';
import { fileError, invalid } from '../file-errors.js';

export async function download(context: CallContext, url: URL): Promise<void> {
  const given = url.searchParams.get('path');
  if (given === null || given === '') throw invalid('query parameter path is required');
  const { files } = context.sandbox.runtime;
  const file = await files.read(context.user.name, given).catch((error: unknown) => {
    throw fileError(error, given, 'read');
  });
  context.response.writeHead(200, {
    'Content-Type': 'application/octet-stream',
    'Content-Length': file.size,
  });
  // Exactly the announced length: a file that shrinks meanwhile ends the connection instead.
  await pipeline(file.body, context.response);
}
