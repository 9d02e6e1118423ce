import { defineConfig } from 'vitest/config';

/**
 * Suites that put sandboxes in network namespaces, hold them to cgroup limits, or run Moat as
 * the README does (namespace enforcement on the default pool, which one Moat holds at a time)
 * run one file at a time: two at once interfere (the netns lifecycle test then finds a deleted
 * sandbox's namespace still there). vitest runs a project of one worker after all the others, so
 * `npm test` (scripts/test-suites.mjs) runs this project in a vitest of its own beside the rest
 * (in-process Moats on free loopback ports, proxy enforcement; two files at a time): most of its
 * time is spent waiting on namespaces, sandboxes and timers.
 */
const ALONE = [
  'test/netns/**/*.test.ts',
  'test/confinement/**/*.test.ts',
  'test/walkthrough.test.ts',
  'test/deploy.test.ts',
  'test/cni/podman.test.ts',
];

const shared = { testTimeout: 30_000, hookTimeout: 30_000 };

export default defineConfig({
  test: {
    globalSetup: ['test/support/global-setup.ts'],
    reporters: ['default', './test/support/summary-reporter.ts'],
    projects: [
      {
        test: {
          ...shared,
          name: 'together',
          include: ['test/**/*.test.ts'],
          exclude: ALONE,
          maxWorkers: 2,
          sequence: { groupOrder: 0 },
        },
      },
      {
        test: {
          ...shared,
          name: 'alone',
          include: ALONE,
          maxWorkers: 1,
          sequence: { groupOrder: 0 },
        },
      },
    ],
  },
});
