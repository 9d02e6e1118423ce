/**
 * Persistence behind one interface: the embedded file store (default) for one host, Redis for
 * many. Callers see collections of JSON records and atomic, durable commits.
 */
export { FileStore, type FileStoreOptions, StoreOpenError } from './file-store.js';
export { RedisStore, type RedisStoreOptions } from './redis-store.js';
export { type JsonValue, type Store, type StoreChange, StoreUnavailableError } from './store.js';
