import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { packageRoot } from './package-root.js';

function packageVersion(): string {
  const root = packageRoot();
  if (root === undefined) return 'unknown';
  try {
    return (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string })
      .version;
  } catch {
    return 'unknown';
  }
}

export const VERSION = packageVersion();
