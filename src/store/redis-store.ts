/**
 * The store for many hosts: every Moat node reads and writes the same Redis.
 *
 * Layout: one hash per collection, key `<prefix><collection>`, field = record key, value = the
 * record's JSON text. A commit is one MULTI/EXEC, so other clients see all of its changes or
 * none. (Redis does not roll back a command that fails inside one; here that only happens when
 * something other than Moat wrote a key under the prefix, and commit then says so.)
 *
 * Durability: a commit resolves once EXEC has answered, that is once the changes are in Redis;
 * they then survive a crash of this process or of this machine. Whether they survive a restart
 * of Redis itself depends on Redis's persistence (AOF and its fsync policy, or replicas), which
 * is the operator's business, not Moat's.
 *
 * Availability: nothing waits for a lost connection. Operations fail at once with
 * StoreUnavailableError (the API answers 503) while the client reconnects in the background,
 * so the store recovers by itself when Redis answers again.
 */
import { Redis } from 'ioredis';
import { type JsonValue, type Store, type StoreChange, StoreUnavailableError } from './store.js';

export interface RedisStoreOptions {
  /** Prepended to every Redis key, so several deployments can share one Redis (`moat:`). */
  readonly prefix?: string;
  /**
   * Connection problems after open, for the log: reported when they start or change, not at
   * every reconnection attempt. Operations report their own failures; this says why.
   */
  readonly onError?: (error: Error) => void;
  /**
   * How long open() waits for Redis, and how long a connection attempt or a command may go
   * unanswered before the connection counts as lost (milliseconds, default 3000).
   */
  readonly connectTimeoutMs?: number;
}

/** The longest pause between reconnection attempts (milliseconds). */
const MAX_RECONNECT_DELAY_MS = 2000;

export class RedisStore implements Store {
  private closing: Promise<void> | undefined;
  /** Why the connection is down, while it is. */
  private lastError: Error | undefined;

  private constructor(
    readonly location: string,
    /** The connection, for the node registry and pub/sub of the multi-node layer. */
    readonly client: Redis,
    private readonly prefix: string,
  ) {}

  /** Connects to the Redis at `url` (`redis://[[user]:password@]host[:port][/db]`). */
  static async open(url: string, options: RedisStoreOptions = {}): Promise<RedisStore> {
    const location = maskedLocation(url);
    const timeoutMs = options.connectTimeoutMs ?? 3000;
    const client = new Redis(url, {
      // A command issued while disconnected fails at once instead of waiting in a queue.
      enableOfflineQueue: false,
      connectTimeout: timeoutMs,
      // A connection that stops answering (a silent network partition) is dropped, not waited on.
      socketTimeout: timeoutMs,
      // Commands in flight when the connection drops fail instead of being resent: a commit
      // Redis may already have applied must not be applied again after later ones.
      maxRetriesPerRequest: 0,
      retryStrategy: (attempt) => Math.min(attempt * 100, MAX_RECONNECT_DELAY_MS),
    });
    const store = new RedisStore(location, client, options.prefix ?? 'moat:');
    let opened = false;
    client.on('error', (error: Error) => {
      const repeated = store.lastError?.message === error.message;
      store.lastError = error;
      if (opened && !repeated) {
        options.onError?.(
          new StoreUnavailableError(`Redis at ${location}: ${error.message}`, { cause: error }),
        );
      }
    });
    client.on('ready', () => (store.lastError = undefined));
    if (!(await readyWithin(client, timeoutMs))) {
      client.disconnect();
      throw new StoreUnavailableError(
        `could not connect to Redis at ${location} within ${timeoutMs} ms (${store.lastError?.message ?? 'no answer'}); check that Redis runs there and the URL is right`,
      );
    }
    opened = true;
    return store;
  }

  async get(collection: string, key: string): Promise<JsonValue | undefined> {
    const text = await this.run(`read ${collection}/${key} from`, () =>
      this.client.hget(this.prefix + collection, key),
    );
    return text === null ? undefined : this.parse(collection, key, text);
  }

  async list(collection: string): Promise<Array<[string, JsonValue]>> {
    const fields = await this.run(`list ${collection} from`, () =>
      this.client.hgetall(this.prefix + collection),
    );
    return Object.entries(fields).map(([key, text]) => [key, this.parse(collection, key, text)]);
  }

  /**
   * Resolves once EXEC has answered. When it rejects because the connection dropped, Redis may
   * or may not have applied the commit, but whole or not at all.
   */
  async commit(changes: readonly StoreChange[]): Promise<void> {
    // Serialised before anything is sent: a value JSON cannot carry fails the whole commit.
    const texts = changes.map(({ value }) => (value === null ? null : JSON.stringify(value)));
    const results = await this.run('commit to', () => {
      if (changes.length === 0) return Promise.resolve([]);
      const transaction = this.client.multi();
      changes.forEach(({ collection, key }, i) => {
        const text = texts[i]!;
        if (text === null) transaction.hdel(this.prefix + collection, key);
        else transaction.hset(this.prefix + collection, key, text);
      });
      return transaction.exec();
    });
    // EXEC answers null only after a WATCH, which this store never sends.
    for (const [i, [error]] of (results ?? []).entries()) {
      if (error === null) continue;
      // Redis does not roll back: the other changes of this commit were applied.
      throw new StoreUnavailableError(
        `Redis at ${this.location} applied only part of a commit: ${this.prefix}${changes[i]!.collection} refused it (${error.message}); something other than Moat wrote that key. Remove it or choose another key prefix`,
      );
    }
  }

  /** A PING answered: the connection carries commands now. */
  async notReady(): Promise<string | undefined> {
    return this.run('ping', () => this.client.ping()).then(
      () => undefined,
      (error: Error) => error.message,
    );
  }

  close(): Promise<void> {
    // A connection that is down cannot carry QUIT: then just stop reconnecting.
    this.closing ??= this.client.quit().then(
      () => undefined,
      () => this.client.disconnect(),
    );
    return this.closing;
  }

  /** Runs a Redis operation, turning every failure into a StoreUnavailableError. */
  private async run<T>(action: string, operation: () => Promise<T>): Promise<T> {
    if (this.closing !== undefined) {
      throw new StoreUnavailableError(`the Redis store at ${this.location} is closed`);
    }
    try {
      return await operation();
    } catch (error) {
      const what = `could not ${action} Redis at ${this.location}`;
      if (this.client.status === 'ready') {
        throw new StoreUnavailableError(`${what}: ${(error as Error).message}`, { cause: error });
      }
      // ioredis's own message here ("Stream isn't writeable...") says nothing to an operator.
      const why = this.lastError?.message ?? 'connection lost';
      throw new StoreUnavailableError(
        `${what}: it is unreachable (${why}); Moat reconnects by itself once Redis answers`,
        { cause: error },
      );
    }
  }

  private parse(collection: string, key: string, text: string): JsonValue {
    try {
      return JSON.parse(text) as JsonValue;
    } catch {
      throw new Error(
        `Redis at ${this.location}: field "${key}" of ${this.prefix}${collection} is not JSON; something other than Moat wrote it. Delete that field or choose another key prefix`,
      );
    }
  }
}

/** `url` with any password replaced by `***`, fit for logs and error messages. */
function maskedLocation(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    // Not echoed: it may hold a password.
    throw new Error(
      'the Redis URL is not a valid URL; expected redis://[[user]:password@]host[:port][/db]',
    );
  }
  if (parsed.protocol !== 'redis:' && parsed.protocol !== 'rediss:') {
    throw new Error(
      `the Redis URL must start with redis:// or rediss://, not ${parsed.protocol}//; expected redis://[[user]:password@]host[:port][/db]`,
    );
  }
  if (parsed.password !== '') parsed.password = '***';
  // ioredis also takes options from the query string, a password among them.
  if (parsed.searchParams.has('password')) parsed.searchParams.set('password', '***');
  return parsed.href;
}

/** Whether the client becomes ready within `timeoutMs`. */
function readyWithin(client: Redis, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      client.off('ready', onReady);
      resolve(false);
    }, timeoutMs);
    const onReady = () => {
      clearTimeout(timer);
      resolve(true);
    };
    client.once('ready', onReady);
  });
}
