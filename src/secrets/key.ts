/**
 * The key that seals secret values at rest (AES-256-GCM): 32 bytes from the operator's key file
 * or, by default, generated on first start into the data folder with mode 0600. It protects a
 * copy of the store (the file store's folder, a Redis dump or replica) taken without the key.
 */
import { createHash, randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';

export const KEY_BYTES = 32;
export const DEFAULT_KEY_FILE = 'secrets-key';

export interface SecretsKey {
  readonly key: Buffer;
  /** Names the key without revealing it (a prefix of its SHA-256), stored with each value. */
  readonly id: string;
  /** Where it came from, for start-up output. */
  readonly source: string;
  readonly generated: boolean;
}

const keyID = (key: Buffer) => createHash('sha256').update(key).digest('hex').slice(0, 16);

/**
 * Reads the key from `configured`, or from `<dataDir>/secrets-key`, which the first start
 * writes. The file holds the key as 64 hex digits (a trailing newline is allowed).
 */
export async function loadSecretsKey(
  configured: string | undefined,
  dataDir: string,
): Promise<SecretsKey> {
  const file = path.resolve(configured ?? path.join(dataDir, DEFAULT_KEY_FILE));
  let text: string | undefined;
  try {
    text = await readFile(file, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT' || configured !== undefined) {
      throw new Error(`cannot read the secrets key file ${file}: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }
  if (text === undefined) {
    const key = randomBytes(KEY_BYTES);
    // wx: two starts racing on one data folder never overwrite each other's key.
    await writeFile(file, `${key.toString('hex')}\n`, { mode: 0o600, flag: 'wx' });
    return { key, id: keyID(key), source: file, generated: true };
  }
  const hex = text.trim();
  if (!/^[0-9a-fA-F]{64}$/.test(hex)) {
    throw new Error(
      `the secrets key file ${file} must hold ${KEY_BYTES} bytes as 64 hex digits (make one with: openssl rand -hex 32)`,
    );
  }
  const key = Buffer.from(hex, 'hex');
  return { key, id: keyID(key), source: file, generated: false };
}
