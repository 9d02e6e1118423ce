/** The store this Moat keeps its state in, and this node's name when it shares one. */
import { randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Logger } from 'pino';
import type { MoatConfig } from '../config.js';
import { isNodeID } from '../config-values.js';
import type { MoatMetrics } from '../metrics/index.js';
import { FileStore, RedisStore, type Store } from '../store/index.js';

export async function openStore(
  config: MoatConfig,
  logger: Logger,
  metrics: MoatMetrics,
): Promise<Store> {
  if (config.store === 'file') {
    return FileStore.open(path.join(config.dataDir, 'store'), {
      onWarning: (message) => logger.warn({ store: config.dataDir }, message),
      onSync: (seconds) => metrics.storeSyncDuration.observe(seconds),
    });
  }
  return RedisStore.open(config.store, {
    prefix: config.storePrefix,
    onError: (error) => {
      metrics.storeErrors.inc();
      logger.error({ err: error.message }, 'store connection lost; enforcing the last policies');
    },
  });
}

/** --node-id, or the name this data folder has kept since its first start. */
export async function nodeIdentity(config: MoatConfig): Promise<string> {
  if (config.nodeID !== 'auto') return config.nodeID;
  const file = path.join(config.dataDir, 'node-id');
  const kept = (await readFile(file, 'utf8').catch(() => '')).trim();
  if (isNodeID(kept)) return kept;
  const made = `${os
    .hostname()
    .toLowerCase()
    .replace(/[^a-z0-9-]/g, '-')
    .slice(0, 40)}-${randomBytes(4).toString('hex')}`.replace(/^-+/, 'n');
  await writeFile(file, `${made}\n`, { mode: 0o600 });
  return made;
}
