import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/**
 * The folder holding Moat's package.json: above src/ when running from source, above dist/src/
 * when built. Undefined when this file was moved out of the package.
 */
export function packageRoot(): string | undefined {
  for (let url = new URL('.', import.meta.url); url.pathname !== '/'; url = new URL('..', url)) {
    if (existsSync(new URL('package.json', url))) return fileURLToPath(url);
  }
  return undefined;
}
