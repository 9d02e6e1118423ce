/** What `moat observe` and `moat check --replay-api` share: the API key and a checked GET. */
import { readFile } from 'node:fs/promises';
import { apiKeyFile } from '../config.js';
import { type CliIO, UsageError } from './io.js';

export const API_OPTIONS = {
  api: { type: 'string' },
  key: { type: 'string' },
  'key-file': { type: 'string' },
} as const;

export const API_HELP = `  --api URL            the platform API (default http://127.0.0.1:3000)
  --key KEY            its API key
  --key-file FILE      read the API key from FILE (default: the file moat serve writes,
                       <data-dir>/api-key: data/api-key here, or under MOAT_DATA_DIR)`;

/**
 * The API's base URL and key from --api, --key and --key-file; with neither key flag, the key
 * file `moat serve` writes into `dataDir()` (read only then: the configuration may be unused).
 */
export async function apiFrom(
  values: { api?: string; key?: string; 'key-file'?: string },
  dataDir: () => string,
): Promise<{ readonly api: string; readonly key: string }> {
  const api = (values.api ?? 'http://127.0.0.1:3000').replace(/\/+$/, '');
  if (!/^https?:\/\//.test(api)) throw new UsageError(`--api ${api} must be an http(s) URL`);
  if (values.key !== undefined && values['key-file'] !== undefined)
    throw new UsageError('give --key or --key-file, not both');
  if (values.key !== undefined) return { api, key: values.key };
  const given = values['key-file'];
  const file = given ?? apiKeyFile(dataDir());
  const text = await readFile(file, 'utf8').catch((error: NodeJS.ErrnoException) => {
    if (given !== undefined) throw new UsageError(`--key-file ${file}: ${error.message}`);
    const why = error.code === 'ENOENT' ? 'does not exist' : `cannot be read (${error.message})`;
    throw new UsageError(
      `no API key: ${file}, where moat serve writes it (--data-dir, MOAT_DATA_DIR), ${why}; give --key KEY or --key-file FILE`,
    );
  });
  return { api, key: text.trim() };
}

/** A GET of the API, or undefined after saying (as `command`) why it failed. */
export async function apiGet(
  url: string,
  key: string,
  io: CliIO,
  command: string,
): Promise<Response | undefined> {
  let response: Response;
  try {
    response = await fetch(url, { headers: { 'X-API-Key': key } });
  } catch (error) {
    const cause = (error as { cause?: Error }).cause?.message ?? (error as Error).message;
    io.stderr.write(`${command}: cannot reach ${new URL(url).origin}: ${cause}\n`);
    return undefined;
  }
  if (response.ok) return response;
  const body = (await response.json().catch(() => ({}))) as { message?: string };
  io.stderr.write(
    `${command}: ${new URL(url).origin} answered ${response.status}: ${body.message ?? response.statusText}\n`,
  );
  return undefined;
}
