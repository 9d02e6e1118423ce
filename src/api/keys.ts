import { randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { apiKeyFile } from '../config.js';
import { sameSecret } from '../secret-compare/index.js';

/** Where the platform API's keys come from, for start-up output (never the keys themselves). */
export interface ApiKeys {
  readonly keys: readonly string[];
  readonly source: string;
  /** This start generated the key into `source`: it is never printed or logged, only named. */
  readonly generated: boolean;
}

/**
 * Keys from configuration (MOAT_API_KEYS), or else the one in `<dataDir>/api-key`, generated
 * on first start with mode 0600.
 */
export async function loadApiKeys(
  configured: readonly string[],
  dataDir: string,
): Promise<ApiKeys> {
  if (configured.length > 0) {
    return { keys: configured, source: 'configuration (MOAT_API_KEYS)', generated: false };
  }
  const file = apiKeyFile(dataDir);
  try {
    const key = (await readFile(file, 'utf8')).trim();
    if (key === '') throw new Error(`${file} is empty; delete it to generate a new key`);
    return { keys: [key], source: file, generated: false };
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
  }
  const key = `moat_${randomBytes(24).toString('hex')}`;
  await writeFile(file, `${key}\n`, { mode: 0o600, flag: 'wx' });
  return { keys: [key], source: file, generated: true };
}

/**
 * Compares against every key without stopping at a match, so the time taken says nothing about
 * which key matched.
 */
export function keyMatcher(keys: readonly string[]): (given: string) => boolean {
  return (given) => {
    let matched = false;
    for (const key of keys) matched = sameSecret(given, key) || matched;
    return matched;
  };
}
