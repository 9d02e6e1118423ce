// Writes docs/configuration.md from the settings table (run by `npm run docs:config`, after a build).
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { configurationDoc } from '../dist/src/config-doc.js';

writeFileSync(fileURLToPath(import.meta.resolve('../docs/configuration.md')), configurationDoc());
