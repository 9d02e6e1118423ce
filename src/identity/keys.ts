/**
 * The signing keys of workload identity tokens: ECDSA P-256 keys in `<data-dir>/identity-keys/`
 * (folder 0700, each key a file 0600), generated on first need. A new key is published (in the
 * JWKS) at once but signs only once every verifier's cached copy of the JWKS has it
 * (PUBLISH_AHEAD_MS); the key it replaces signs until then, and stays published until every
 * token it signed has expired. `rotateKey` (`moat identity rotate-key`) removes it after that.
 */
import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  type KeyObject,
} from 'node:crypto';
import { mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';

export const KEY_FOLDER = 'identity-keys';
/** Every token a key signs expires this long after it is made (at most 5 minutes). */
export const TOKEN_LIFETIME_S = 300;
/** How often a running Moat looks for keys another process (the rotate command) wrote. */
export const KEY_RECHECK_MS = 1000;
/** How long verifiers may keep the JWKS (its Cache-Control max-age). */
export const JWKS_MAX_AGE_S = 60;
/**
 * How long a new key is published before it signs: a verifier that fetched the JWKS just
 * before the rotation keeps it JWKS_MAX_AGE_S, and Moat sees the key within KEY_RECHECK_MS; the
 * rest is margin for clocks.
 */
export const PUBLISH_AHEAD_MS = JWKS_MAX_AGE_S * 1000 + KEY_RECHECK_MS + 5000;
/**
 * How long a replaced key stays published after its successor was made: it signs until the
 * successor does (PUBLISH_AHEAD_MS), its last tokens live TOKEN_LIFETIME_S; margin for clocks.
 */
export const RETIRED_KEY_KEPT_MS = PUBLISH_AHEAD_MS + TOKEN_LIFETIME_S * 1000 + 60_000;

/** A public key as the JWKS publishes it (RFC 7517, RFC 7518 section 6.2). */
export interface PublicJwk {
  readonly kty: 'EC';
  readonly crv: 'P-256';
  readonly x: string;
  readonly y: string;
  readonly kid: string;
  readonly use: 'sig';
  readonly alg: 'ES256';
}

export interface SigningKey {
  /** The key's RFC 7638 thumbprint: names it in each token's header and in the JWKS. */
  readonly kid: string;
  /** When it was made, milliseconds since the epoch (the newest is the current key). */
  readonly created: number;
  readonly privateKey: KeyObject;
  readonly jwk: PublicJwk;
}

/** What a key file holds (JSON): its private key as PKCS #8 PEM, with when it was made. */
interface KeyFile {
  readonly created: number;
  readonly privateKey: string;
}

const FILE_SUFFIX = '.json';

function signingKey(privateKey: KeyObject, created: number): SigningKey {
  const { x, y, crv, kty } = createPublicKey(privateKey).export({ format: 'jwk' });
  if (kty !== 'EC' || crv !== 'P-256' || x === undefined || y === undefined)
    throw new Error('the key is not an ECDSA P-256 key');
  // RFC 7638: the required members in lexicographic order, no white space.
  const kid = createHash('sha256').update(JSON.stringify({ crv, kty, x, y })).digest('base64url');
  return { kid, created, privateKey, jwk: { kty, crv, x, y, kid, use: 'sig', alg: 'ES256' } };
}

function readKeyFile(file: string, text: string): SigningKey {
  let parsed: Partial<KeyFile>;
  try {
    parsed = JSON.parse(text) as Partial<KeyFile>;
  } catch {
    throw new Error(`the identity key file ${file} is not JSON`);
  }
  if (typeof parsed.created !== 'number' || typeof parsed.privateKey !== 'string')
    throw new Error(`the identity key file ${file} lacks "created" or "privateKey"`);
  try {
    return signingKey(createPrivateKey(parsed.privateKey), parsed.created);
  } catch (error) {
    throw new Error(`the identity key file ${file}: ${(error as Error).message}`, {
      cause: error,
    });
  }
}

/** Writes a new key into `folder` (made 0700 if absent); the file appears whole or not at all. */
async function writeKey(folder: string, created: number): Promise<SigningKey> {
  await mkdir(folder, { recursive: true, mode: 0o700 });
  const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const key = signingKey(privateKey, created);
  const body: KeyFile = {
    created,
    privateKey: privateKey.export({ format: 'pem', type: 'pkcs8' }) as string,
  };
  const file = path.join(folder, `${key.kid}${FILE_SUFFIX}`);
  const temporary = `${file}.tmp`;
  await writeFile(temporary, JSON.stringify(body), { mode: 0o600, flag: 'wx' });
  await rename(temporary, file);
  return key;
}

/** Every key of `folder`, newest first (none when the folder does not exist). */
async function readKeys(folder: string): Promise<SigningKey[]> {
  let names: string[];
  try {
    names = await readdir(folder);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw error;
  }
  const keys = await Promise.all(
    names
      .filter((name) => name.endsWith(FILE_SUFFIX))
      .map(async (name) => {
        const file = path.join(folder, name);
        return readKeyFile(file, await readFile(file, 'utf8'));
      }),
  );
  return keys.sort((a, b) => b.created - a.created || a.kid.localeCompare(b.kid));
}

/** The keys still published: the newest, and each replaced one until its tokens expired. */
function publishedOf(keys: readonly SigningKey[], now: number): SigningKey[] {
  return keys.filter((key, i) => i === 0 || now < keys[i - 1]!.created + RETIRED_KEY_KEPT_MS);
}

/**
 * The key that signs now (keys newest first): the newest published for PUBLISH_AHEAD_MS, or,
 * while none is, the oldest (the first key of all signs at once: no verifier has seen another).
 */
export function signingKeyOf(keys: readonly SigningKey[], now: number): SigningKey {
  return keys.find((key) => key.created + PUBLISH_AHEAD_MS <= now) ?? keys.at(-1)!;
}

/**
 * Makes a new key in `<dataDir>/identity-keys/` and removes keys no longer published. A running
 * Moat publishes it within KEY_RECHECK_MS and signs with it from `signsFrom`.
 */
export async function rotateKey(
  dataDir: string,
  now: number = Date.now(),
): Promise<{
  readonly kid: string;
  readonly signsFrom: number;
  readonly published: number;
  readonly removed: number;
}> {
  const folder = path.join(dataDir, KEY_FOLDER);
  const before = await readKeys(folder);
  // Strictly newer than every key there, whatever the clock says.
  const created = Math.max(now, (before[0]?.created ?? 0) + 1);
  const key = await writeKey(folder, created);
  const keys = [key, ...before];
  const kept = new Set(publishedOf(keys, now).map((k) => k.kid));
  const gone = keys.filter((k) => !kept.has(k.kid));
  await Promise.all(gone.map((k) => rm(path.join(folder, `${k.kid}${FILE_SUFFIX}`))));
  return {
    kid: key.kid,
    signsFrom: created + PUBLISH_AHEAD_MS,
    published: kept.size,
    removed: gone.length,
  };
}

/**
 * The keys of one data folder as a running Moat reads them: the folder is read again at most
 * every KEY_RECHECK_MS, so a key the rotate command wrote is used within that time.
 */
export class IdentityKeys {
  private readonly folder: string;
  private keys: readonly SigningKey[] = [];
  private readAt = -Infinity;
  private reading: Promise<readonly SigningKey[]> | undefined;

  constructor(
    dataDir: string,
    private readonly now: () => number = Date.now,
  ) {
    this.folder = path.join(dataDir, KEY_FOLDER);
  }

  /** The key new tokens are signed with; the first is generated when there is none. */
  async current(): Promise<SigningKey> {
    return signingKeyOf(await this.all(), this.now());
  }

  /** The public keys a verifier may meet: the current one and those replaced recently. */
  async published(): Promise<readonly PublicJwk[]> {
    return publishedOf(await this.all(), this.now()).map((key) => key.jwk);
  }

  private all(): Promise<readonly SigningKey[]> {
    if (this.now() - this.readAt < KEY_RECHECK_MS && this.keys.length > 0)
      return Promise.resolve(this.keys);
    // One read at a time: concurrent first requests never generate two keys.
    this.reading ??= this.read().finally(() => (this.reading = undefined));
    return this.reading;
  }

  private async read(): Promise<readonly SigningKey[]> {
    let keys = await readKeys(this.folder);
    if (keys.length === 0) keys = [await writeKey(this.folder, this.now())];
    this.keys = keys;
    this.readAt = this.now();
    return keys;
  }
}
