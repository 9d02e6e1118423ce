/**
 * Persistence behind one interface. Records are JSON values filed by collection and key; the
 * store knows nothing of what they mean. A Redis store implements the same interface (the
 * multi-node issue), so callers never rely on anything an in-process map would give for free:
 * every read and write is asynchronous, and a multi-key change is one atomic `commit`.
 */
export type JsonValue =
  null | boolean | number | string | readonly JsonValue[] | { readonly [key: string]: JsonValue };

/** Put `value` under `collection`/`key`, or delete the key when `value` is null. */
export interface StoreChange {
  readonly collection: string;
  readonly key: string;
  readonly value: JsonValue;
}

export interface Store {
  /** Where the state lives, for start-up output (`/var/lib/moat/store`, `redis://...`). */
  readonly location: string;
  get(collection: string, key: string): Promise<JsonValue | undefined>;
  /** Every record of a collection, in no particular order. */
  list(collection: string): Promise<Array<[key: string, value: JsonValue]>>;
  /**
   * Applies all changes or none. When the promise resolves the changes are durable: they survive
   * a crash of this process or of the machine. Reads return what was stored (as JSON carries
   * it), never the caller's own objects.
   */
  commit(changes: readonly StoreChange[]): Promise<void>;
  /** Why the store cannot take writes now (for readiness checks); undefined when it can. */
  notReady(): Promise<string | undefined>;
  close(): Promise<void>;
}

/** A store that cannot take writes (disk failure, lost connection); the API answers 503. */
export class StoreUnavailableError extends Error {
  override readonly name = 'StoreUnavailableError';
}
