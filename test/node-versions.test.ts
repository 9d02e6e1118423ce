/**
 * The suite runs on the Node versions `engines` names, with the project's own Node binaries
 * (devDependencies `node` and `node-24`): never on whatever older Node the machine has.
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const pkg = JSON.parse(readFileSync(`${ROOT}/package.json`, 'utf8')) as {
  engines: { node: string };
  devDependencies: Record<string, string>;
  scripts: Record<string, string>;
};
const run = promisify(execFile);
const major = (version: string) => Number(/^v?(\d+)\./.exec(version)![1]);

describe('Node versions', () => {
  it('runs this suite on a Node that engines names (22 or 24 LTS), not the machine’s own older one', () => {
    expect(pkg.engines.node).toBe('>=22');
    expect([22, 24]).toContain(major(process.version));
  });

  it('brings Node 22 and 24 of its own, and npm test runs the fast suites on 24', async () => {
    expect(pkg.devDependencies.node).toMatch(/^\^22\./);
    expect(pkg.devDependencies['node-24']).toMatch(/^npm:node@\^24\./);
    const { stdout } = await run(`${ROOT}/node_modules/node-24/bin/node`, ['--version']);
    expect(major(stdout)).toBe(24);
    expect(pkg.scripts.test).toBe('node scripts/test-suites.mjs');
    const { stdout: plan } = await run(process.execPath, [
      `${ROOT}/scripts/test-suites.mjs`,
      '--list',
    ]);
    const stages = plan.split('\n').map((line) => line.trim());
    expect(stages).toContain('22 together      vitest run --project together');
    expect(stages).toContain('22 alone         vitest run --project alone');
    expect(stages).toContain(
      '24 together      PATH=node_modules/node-24/bin:$PATH vitest run --project together --exclude test/api/console.test.ts',
    );
  });

  it('npx moat runs on the project’s Node 22 and says nothing about engines', async () => {
    const { stdout, stderr } = await run('npx', ['--no-install', 'moat', '--version'], {
      cwd: ROOT,
    });
    expect(stdout.trim()).toMatch(/^\d+\.\d+\.\d+$/);
    expect(stderr).not.toMatch(/EBADENGINE/);
    const node = await run('npx', ['--no-install', 'node', '--version'], { cwd: ROOT });
    expect(major(node.stdout)).toBe(22);
  });
});
