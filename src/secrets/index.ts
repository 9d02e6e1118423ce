/**
 * Secrets: the E2B secrets API's records in the store, values sealed with AES-256-GCM under a
 * key kept outside the store. Other parts read current values by name at request time.
 */
export { DEFAULT_KEY_FILE, loadSecretsKey, type SecretsKey } from './key.js';
export {
  MAX_METADATA_BYTES,
  MAX_METADATA_ENTRIES,
  MAX_METADATA_KEY_BYTES,
  MAX_METADATA_VALUE_BYTES,
  MAX_NAME_LENGTH,
  MAX_SECRETS,
  MAX_VALUE_BYTES,
  SECRET_ID_PREFIX,
  type SecretInfo,
  SecretsError,
  SecretVault,
  type VaultOptions,
} from './vault.js';
