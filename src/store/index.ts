/**
 * Persistence behind one interface: the embedded file store (default) today, Redis for many
 * hosts. Callers see collections of JSON records and atomic, durable commits.
 */
export { FileStore, type FileStoreOptions, StoreOpenError } from './file-store.js';
export { type JsonValue, type Store, type StoreChange, StoreUnavailableError } from './store.js';
