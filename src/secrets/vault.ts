/**
 * Secrets behind the store: the E2B secrets API's records, each value sealed with AES-256-GCM.
 * Values go in through `create` and `update` and come out only through `value` and `values`,
 * which the egress gateway calls when it sends a request; nothing that describes a secret
 * (its info, an error) carries its value.
 *
 * `value` reads the store each time, so with Redis a value another node updated is the one the
 * next injected request gets. `values`, which the leak guard asks for on every request Moat
 * reads, is kept decrypted until a change: this node's own changes drop it at once, another
 * node's when the cluster channel says so (`invalidate`), within milliseconds, as network
 * changes propagate.
 */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { type JsonValue, type Store, StoreUnavailableError } from '../store/index.js';
import type { SecretsKey } from './key.js';

const SECRETS = 'secrets';
/** secretID -> name, committed with the record it points at. */
const SECRET_IDS = 'secret-ids';

export const SECRET_ID_PREFIX = 'sec_';
export const MAX_SECRETS = 1000;
export const MAX_NAME_LENGTH = 128;
/** Bytes of one value (it is sent in HTTP headers, so it is kept to what a header holds). */
export const MAX_VALUE_BYTES = 16_384;
/** E2B's SecretMetadata limits. */
export const MAX_METADATA_ENTRIES = 32;
export const MAX_METADATA_KEY_BYTES = 128;
export const MAX_METADATA_VALUE_BYTES = 1024;
export const MAX_METADATA_BYTES = 8192;

const NAME = /^[a-zA-Z0-9_-]+$/;
/** Control characters but horizontal tab: a value is sent in a header, where they may not be. */
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u0008\u000a-\u001f\u007f]/;
const IV_BYTES = 12;

/** What the API shows of a secret: never its value. */
export interface SecretInfo {
  readonly secretID: string;
  readonly name: string;
  readonly currentVersion: number;
  readonly metadata: Readonly<Record<string, string>>;
  /** Milliseconds since the epoch. */
  readonly createdAt: number;
  readonly updatedAt: number;
}

interface Sealed {
  /** The id of the key that sealed it (see SecretsKey.id). */
  readonly key: string;
  readonly iv: string;
  readonly tag: string;
  readonly data: string;
}

interface SecretRecord extends SecretInfo {
  readonly sealed: Sealed;
}

/** A refusal of the secrets API, with the status it answers; messages never carry a value. */
export class SecretsError extends Error {
  override readonly name = 'SecretsError';
  constructor(
    readonly status: 400 | 404 | 409 | 500 | 503,
    message: string,
  ) {
    super(message);
  }
}

const notFound = (secret: string) =>
  new SecretsError(404, `secret ${JSON.stringify(secret)} does not exist`);

export interface VaultOptions {
  readonly store: Store;
  readonly key: SecretsKey;
  /** Clock in milliseconds (tests pass a controllable one). */
  readonly now?: () => number;
  /** Called after this node changed a secret (the composition root tells the other nodes). */
  readonly onChange?: () => void;
}

/** The decrypted values as of one generation of the secrets collection. */
interface ValuesSnapshot {
  readonly generation: number;
  readonly values: Promise<ReadonlyMap<string, string>>;
}

export class SecretVault {
  private readonly store: Store;
  private readonly key: SecretsKey;
  private readonly now: () => number;
  /** Changes run one at a time on this node, so two creates of one name cannot both succeed. */
  private changes: Promise<unknown> = Promise.resolve();
  private readonly onChange: () => void;
  /** Bumped by every change seen; a snapshot of an older generation is never served. */
  private generation = 0;
  private snapshot: ValuesSnapshot | undefined;

  constructor(options: VaultOptions) {
    this.store = options.store;
    this.key = options.key;
    this.now = options.now ?? Date.now;
    this.onChange = options.onChange ?? (() => undefined);
  }

  /** Forgets the decrypted values: the secrets collection changed elsewhere. */
  invalidate(): void {
    this.generation++;
    this.snapshot = undefined;
  }

  async create(
    name: string,
    value: string,
    metadata: Readonly<Record<string, string>> = {},
  ): Promise<SecretInfo> {
    const canonical = checkName(name);
    checkValue(value);
    checkMetadata(metadata);
    return this.serially(async () => {
      if ((await this.read(canonical)) !== undefined) {
        throw new SecretsError(409, `a secret named ${JSON.stringify(canonical)} already exists`);
      }
      if ((await this.records()).length >= MAX_SECRETS) {
        throw new SecretsError(400, `Moat holds at most ${MAX_SECRETS} secrets; delete one first`);
      }
      const now = this.now();
      const info: SecretInfo = {
        secretID: `${SECRET_ID_PREFIX}${randomBytes(12).toString('hex')}`,
        name: canonical,
        currentVersion: 1,
        metadata: { ...metadata },
        createdAt: now,
        updatedAt: now,
      };
      await this.write(info, value);
      return info;
    });
  }

  /** Stores `value` as the secret's next version; metadata, when given, replaces the old. */
  async update(
    secret: string,
    value: string,
    metadata?: Readonly<Record<string, string>>,
  ): Promise<SecretInfo> {
    checkValue(value);
    if (metadata !== undefined) checkMetadata(metadata);
    return this.serially(async () => {
      const record = await this.find(secret);
      const info: SecretInfo = {
        ...infoOf(record),
        currentVersion: record.currentVersion + 1,
        metadata: metadata === undefined ? record.metadata : { ...metadata },
        updatedAt: Math.max(this.now(), record.updatedAt),
      };
      await this.write(info, value);
      return info;
    });
  }

  delete(secret: string): Promise<void> {
    return this.serially(async () => {
      const record = await this.find(secret);
      await this.commit([
        { collection: SECRETS, key: record.name, value: null },
        { collection: SECRET_IDS, key: record.secretID, value: null },
      ]);
    });
  }

  /** A secret by ID (`sec_...`) or name; 404 when there is none. */
  async info(secret: string): Promise<SecretInfo> {
    return infoOf(await this.find(secret));
  }

  /** Every secret, in no particular order (at most MAX_SECRETS). */
  async list(): Promise<SecretInfo[]> {
    return (await this.records()).map(infoOf);
  }

  /** The current value of the secret named `name`, read from the store now. */
  async value(name: string): Promise<string | undefined> {
    const record = await this.read(name.toLowerCase());
    return record === undefined ? undefined : this.open(record);
  }

  async exists(name: string): Promise<boolean> {
    return (await this.read(name.toLowerCase())) !== undefined;
  }

  /**
   * Every secret's current value by name (at most MAX_SECRETS), for the leak guard: read and
   * decrypted once, then served from memory until a change (see the file comment).
   */
  values(): Promise<ReadonlyMap<string, string>> {
    const { generation } = this;
    if (this.snapshot?.generation === generation) return this.snapshot.values;
    const values = this.records().then(
      (records) => new Map(records.map((record) => [record.name, this.open(record)])),
    );
    this.snapshot = { generation, values };
    // A failed read is not kept: the next request asks the store again.
    values.catch(() => {
      if (this.snapshot?.values === values) this.snapshot = undefined;
    });
    return values;
  }

  private serially<T>(change: () => Promise<T>): Promise<T> {
    const result = this.changes.then(change);
    this.changes = result.catch(() => undefined);
    return result;
  }

  private async find(secret: string): Promise<SecretRecord> {
    const name = secret.startsWith(SECRET_ID_PREFIX)
      ? await this.get(SECRET_IDS, secret)
      : secret.toLowerCase();
    const record = typeof name === 'string' ? await this.read(name) : undefined;
    if (record === undefined) throw notFound(secret);
    return record;
  }

  private async read(name: string): Promise<SecretRecord | undefined> {
    const value = await this.get(SECRETS, name);
    return value === undefined ? undefined : readRecord(value, name);
  }

  private async records(): Promise<SecretRecord[]> {
    let entries: Array<[string, JsonValue]>;
    try {
      entries = await this.store.list(SECRETS);
    } catch (error) {
      throw unavailable(error);
    }
    return entries.map(([name, value]) => readRecord(value, name));
  }

  private async get(collection: string, key: string): Promise<JsonValue | undefined> {
    try {
      return await this.store.get(collection, key);
    } catch (error) {
      throw unavailable(error);
    }
  }

  private async write(info: SecretInfo, value: string): Promise<void> {
    const record: SecretRecord = { ...info, sealed: this.seal(info, value) };
    await this.commit([
      { collection: SECRETS, key: info.name, value: record as unknown as JsonValue },
      { collection: SECRET_IDS, key: info.secretID, value: info.name },
    ]);
  }

  private async commit(changes: Parameters<Store['commit']>[0]): Promise<void> {
    try {
      await this.store.commit(changes);
    } catch (error) {
      throw unavailable(error);
    } finally {
      // Even a failed commit may have been applied (a lost reply): read afresh either way.
      this.invalidate();
    }
    this.onChange();
  }

  private seal(info: SecretInfo, value: string): Sealed {
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv('aes-256-gcm', this.key.key, iv);
    cipher.setAAD(associatedData(info));
    const data = Buffer.concat([cipher.update(value, 'utf8'), cipher.final()]);
    return {
      key: this.key.id,
      iv: iv.toString('base64'),
      tag: cipher.getAuthTag().toString('base64'),
      data: data.toString('base64'),
    };
  }

  private open(record: SecretRecord): string {
    const { sealed } = record;
    if (sealed.key !== this.key.id) {
      throw new SecretsError(
        500,
        `secret ${JSON.stringify(record.name)} was sealed with key ${sealed.key}, but this Moat's secrets key is ${this.key.id} (${this.key.source}); every node sharing a store needs the same --secrets-key-file`,
      );
    }
    try {
      const decipher = createDecipheriv(
        'aes-256-gcm',
        this.key.key,
        Buffer.from(sealed.iv, 'base64'),
      );
      decipher.setAAD(associatedData(record));
      decipher.setAuthTag(Buffer.from(sealed.tag, 'base64'));
      const data = Buffer.from(sealed.data, 'base64');
      return Buffer.concat([decipher.update(data), decipher.final()]).toString('utf8');
    } catch {
      throw new SecretsError(
        500,
        `secret ${JSON.stringify(record.name)} does not open with this Moat's secrets key: its stored record was changed`,
      );
    }
  }
}

/** Binds a sealed value to its secret and version: a value moved to another record fails. */
const associatedData = (info: SecretInfo) =>
  Buffer.from(`moat-secret\0${info.secretID}\0${info.name}\0${info.currentVersion}`);

const infoOf = (record: SecretRecord): SecretInfo => ({
  secretID: record.secretID,
  name: record.name,
  currentVersion: record.currentVersion,
  metadata: record.metadata,
  createdAt: record.createdAt,
  updatedAt: record.updatedAt,
});

function unavailable(error: unknown): Error {
  return error instanceof StoreUnavailableError
    ? new SecretsError(503, error.message)
    : (error as Error);
}

function checkName(name: string): string {
  if (!NAME.test(name) || name.length > MAX_NAME_LENGTH) {
    throw new SecretsError(
      400,
      `secret name ${JSON.stringify(name.slice(0, MAX_NAME_LENGTH))} must be 1 to ${MAX_NAME_LENGTH} of letters, digits, "_" and "-"`,
    );
  }
  const canonical = name.toLowerCase();
  if (canonical.startsWith(SECRET_ID_PREFIX)) {
    throw new SecretsError(
      400,
      `secret name ${JSON.stringify(name)} begins with "${SECRET_ID_PREFIX}", which is reserved for secret IDs`,
    );
  }
  return canonical;
}

function checkValue(value: string): void {
  const bytes = Buffer.byteLength(value);
  if (bytes === 0 || bytes > MAX_VALUE_BYTES) {
    throw new SecretsError(
      400,
      `a secret value must be 1 to ${MAX_VALUE_BYTES} bytes (it is ${bytes})`,
    );
  }
  if (CONTROL.test(value)) {
    throw new SecretsError(
      400,
      'a secret value may not hold control characters (CR, LF, NUL or another): it is sent in HTTP headers',
    );
  }
}

function checkMetadata(metadata: Readonly<Record<string, string>>): void {
  const entries = Object.entries(metadata);
  if (entries.length > MAX_METADATA_ENTRIES) {
    throw new SecretsError(
      400,
      `metadata has ${entries.length} entries; the limit is ${MAX_METADATA_ENTRIES}`,
    );
  }
  let total = 0;
  for (const [key, value] of entries) {
    const [keyBytes, valueBytes] = [Buffer.byteLength(key), Buffer.byteLength(value)];
    if (keyBytes > MAX_METADATA_KEY_BYTES) {
      throw new SecretsError(
        400,
        `metadata key of ${keyBytes} bytes; the limit is ${MAX_METADATA_KEY_BYTES}`,
      );
    }
    if (valueBytes > MAX_METADATA_VALUE_BYTES) {
      throw new SecretsError(
        400,
        `metadata[${JSON.stringify(key)}] is ${valueBytes} bytes; the limit is ${MAX_METADATA_VALUE_BYTES}`,
      );
    }
    total += keyBytes + valueBytes;
  }
  if (total > MAX_METADATA_BYTES) {
    throw new SecretsError(400, `metadata is ${total} bytes; the limit is ${MAX_METADATA_BYTES}`);
  }
}

const isString = (v: unknown): v is string => typeof v === 'string';

function readRecord(value: JsonValue, name: string): SecretRecord {
  const record = value as Partial<Record<keyof SecretRecord, unknown>>;
  const sealed = record.sealed as Partial<Record<keyof Sealed, unknown>> | undefined;
  const fits =
    typeof value === 'object' &&
    value !== null &&
    record.name === name &&
    isString(record.secretID) &&
    Number.isSafeInteger(record.currentVersion) &&
    Number.isSafeInteger(record.createdAt) &&
    Number.isSafeInteger(record.updatedAt) &&
    typeof record.metadata === 'object' &&
    record.metadata !== null &&
    Object.values(record.metadata).every(isString) &&
    typeof sealed === 'object' &&
    sealed !== null &&
    isString(sealed.key) &&
    isString(sealed.iv) &&
    isString(sealed.tag) &&
    isString(sealed.data);
  if (!fits) {
    throw new Error(
      `the store holds a secret record ${JSON.stringify(name)} that this version of Moat does not understand`,
    );
  }
  return value as unknown as SecretRecord;
}
