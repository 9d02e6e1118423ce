/**
 * docs/configuration.md and `moat serve --help` both come from the settings table: the doc must
 * be what `npm run docs:config` writes now, and the help must carry every setting's flag,
 * environment variable, default and text.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { configurationDoc } from '../src/config-doc.js';
import { SETTINGS } from '../src/config-settings.js';
import { runMoat } from './support/moat.js';

const DOC = fileURLToPath(new URL('../docs/configuration.md', import.meta.url));
const oneLine = (text: string) => text.replace(/\s+/g, ' ');

describe('generated configuration docs', () => {
  it('docs/configuration.md is what the settings table generates (npm run docs:config)', () => {
    expect(readFileSync(DOC, 'utf8'), 'stale: run npm run docs:config').toBe(configurationDoc());
  });

  it('has one row per setting, in the table order', () => {
    const keys = [...readFileSync(DOC, 'utf8').matchAll(/^\| `([A-Za-z]+)` \|/gm)].map((m) => m[1]);
    expect(keys).toEqual(SETTINGS.map((s) => s.key));
  });

  it('moat serve --help carries every setting from the same table', async () => {
    const r = await runMoat(['serve', '--help']);
    expect(r.code).toBe(0);
    const help = oneLine(r.stdout);
    for (const s of SETTINGS) {
      expect(help).toContain(`--${s.flag} ${s.metavar}`);
      expect(help).toContain(oneLine(`${s.help}. Env ${s.env}, default ${s.default}`));
    }
    expect(help).toContain('docs/configuration.md');
  });
});
