import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/support/global-setup.ts'],
    reporters: ['default', './test/support/summary-reporter.ts'],
    // Two files at a time: the suite waits on child processes, sockets and timers far more than
    // it computes, so two workers halve its time on a two-CPU machine (vitest's default there is
    // one). Files share nothing that two at once could break (own ports, pools, id ranges).
    maxWorkers: 2,
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
