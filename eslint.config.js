import js from '@eslint/js';
import tseslint from 'typescript-eslint';

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
