import { readFileSync } from 'node:fs';

/** package.json sits above src/ (running from source) or above dist/src/ (built). */
function packageVersion(): string {
  for (let url = new URL('.', import.meta.url); url.pathname !== '/'; url = new URL('..', url)) {
    try {
      return (JSON.parse(readFileSync(new URL('package.json', url), 'utf8')) as { version: string })
        .version;
    } catch {}
  }
  return 'unknown';
}

export const VERSION = packageVersion();
