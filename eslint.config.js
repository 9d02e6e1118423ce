import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

/**
 * Import boundaries, from ARCHITECTURE.md's "Where the code lives" table (the one statement of
 * which part may import which; test/docs.test.ts keeps it equal to the code): a part imports
 * another only through its face (index.js), and only the parts its row names.
 */
function importBoundaries() {
  const text = readFileSync(fileURLToPath(import.meta.resolve('./ARCHITECTURE.md')), 'utf8');
  const rows = [...text.matchAll(/^\| `src\/([^`]*)` \|.*\| ([^|]*) \|$/gm)].map(
    ([, folder, imports]) => ({
      part: folder === '*.ts' ? undefined : folder.replace(/\/$/, ''),
      allowed: [...imports.matchAll(/`([^`]+)`/g)].map(([, name]) => name),
    }),
  );
  const parts = rows.flatMap((row) => (row.part === undefined ? [] : [row.part]));
  return rows.flatMap(({ part, allowed }) => {
    const where = part === undefined ? 'the top-level files of src/' : `src/${part}/`;
    const refused = parts.filter((other) => other !== part && !allowed.includes(other));
    // The top-level files sit beside the folders (./x/); a part's files in its folder (../x/)
    // or one folder down in it (../../x/, e.g. src/envd/files/).
    const places =
      part === undefined
        ? [{ files: 'src/*.ts', up: './' }]
        : [
            { files: `src/${part}/*.ts`, up: '../' },
            { files: `src/${part}/*/*.ts`, up: '../../' },
          ];
    return places.map(({ files, up }) => {
      const patterns = [
        {
          group: [`${up}*/**`, `!${up}*/index.js`],
          message: `import another part through its face (${up}<part>/index.js), never its internals`,
        },
      ];
      if (refused.length > 0)
        patterns.push({
          group: refused.map((other) => `${up}${other}/**`),
          message: `${where} may import ${allowed.length === 0 ? 'no other part' : `only ${allowed.join(', ')}`} (ARCHITECTURE.md, "Where the code lives"): a new direction is a design change, made in that table first`,
        });
      return { files: [files], rules: { 'no-restricted-imports': ['error', { patterns }] } };
    });
  });
}

export default tseslint.config(
  { ignores: ['dist/', 'data/', 'node_modules/', 'build/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      // Non-null assertions mark indexes the code has just bounds-checked.
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_' },
      ],
      'no-empty': ['error', { allowEmptyCatch: true }],
    },
  },
  ...importBoundaries(),
  {
    // Plain Node scripts (not TypeScript, so no @types/node to declare these).
    files: ['scripts/**/*.mjs'],
    languageOptions: { globals: { process: 'readonly', console: 'readonly' } },
  },
  {
    // The console's page modules run in the browser (no build step, so no DOM types to lint with).
    files: ['console/**/*.js'],
    languageOptions: {
      sourceType: 'module',
      globals: Object.fromEntries(
        [
          'AbortController',
          'clearTimeout',
          'console',
          'document',
          'fetch',
          'history',
          'location',
          'Node',
          'sessionStorage',
          'setTimeout',
          'TextDecoderStream',
          'URLSearchParams',
          'window',
        ].map((name) => [name, 'readonly']),
      ),
    },
  },
);
