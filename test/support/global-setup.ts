import { execFileSync } from 'node:child_process';
import { chmodSync } from 'node:fs';
import { startLocalRedis } from './redis.js';

/**
 * Tests that run the real `moat` binary need dist/ built from the current sources; sandbox tests
 * need the packages of scripts/system-packages.mjs where the machine allows installing them; the
 * Redis store tests need a Redis on 127.0.0.1:6379 (they are skipped without one).
 */
export default async function setup(): Promise<void> {
  // `npm test` (scripts/test-suites.mjs) did both once before its vitest runs began together.
  if (process.env.MOAT_TEST_PREPARED !== '1') {
    execFileSync(process.execPath, ['scripts/system-packages.mjs'], { stdio: 'inherit' });
    execFileSync(
      process.execPath,
      ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json'],
      {
        stdio: 'inherit',
      },
    );
  }
  // The bin `npx moat` runs (tsc does not set the executable bit).
  chmodSync('dist/src/cli/main.js', 0o755);
  await startLocalRedis();
}
