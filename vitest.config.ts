import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/support/global-setup.ts'],
    reporters: ['default', './test/support/summary-reporter.ts'],
    // One file at a time (vitest's default on two CPUs): two at once halve the suite's time, but
    // two namespace suites running together interfere (the netns lifecycle test then finds a
    // deleted sandbox's namespace still there, and a 100 ms bound is missed under the load).
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
