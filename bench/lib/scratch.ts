import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/**
 * Flags that keep an in-process Moat's state out of the working folder: a fresh data folder
 * and the API and sandbox listeners on free ports. Benchmarks and tests both start Moat this way,
 * with sandboxes sharing the host network unless they ask for namespaces.
 */
export function scratchMoatFlags(): { flags: Record<string, string>; remove: () => void } {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'moat-scratch-'));
  return {
    flags: {
      'data-dir': dir,
      'api-listen': '127.0.0.1:0',
      'sandbox-listen': '127.0.0.1:0',
      enforcement: 'proxy',
    },
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}
