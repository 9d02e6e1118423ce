import { createRequire } from 'node:module';
import { join } from 'node:path';
import { packageRoot } from './package-root.js';

/** A native addon from build/Release (built by `npm ci`), or why it cannot be used here. */
export type LoadedAddon<T> = { readonly addon: T } | { readonly problem: string };

/**
 * Loads build/Release/<name>.node, built from native/<source> by scripts/build-native.mjs.
 * Both addons are Linux-only optimisations; `linuxOnly` says what they need from Linux.
 */
export function loadAddon<T>(name: string, source: string, linuxOnly: string): LoadedAddon<T> {
  if (process.platform !== 'linux') return { problem: `${linuxOnly} needs Linux` };
  const relative = join('build', 'Release', `${name}.node`);
  const root = packageRoot();
  const file = root === undefined ? relative : join(root, relative);
  try {
    return { addon: createRequire(import.meta.url)(file) as T };
  } catch (error) {
    return {
      problem:
        `${file} does not load (${(error as Error).message.split('\n')[0]}); ` +
        `\`npm ci\` builds it from native/${source}`,
    };
  }
}
