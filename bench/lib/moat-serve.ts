import type { ChildProcess } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { commandPid, sleep, spawnBounded } from './procs.js';

/** The built CLI, next to the built benchmarks (dist/bench/lib -> dist/src/cli). */
const MOAT_CLI = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));

export interface MoatServe {
  readonly child: ChildProcess;
  /** The node process itself (spawnBounded may put a wrapper in front). */
  readonly pid: number;
  readonly apiPort: number;
  readonly sandboxPort: number;
  /** A start-up line `moat: <label> <text>`, without the prefix. */
  line(label: string): string | undefined;
}

/**
 * `moat serve` as a benchmark runs it: a child process on loopback ports, a data folder in
 * `dir`, its log in `dir/moat.log`, no DNS upstream that answers (a closed loopback port), and
 * ready once /health answers.
 */
export async function startMoatServe(options: {
  readonly dir: string;
  readonly apiKey: string;
  readonly lifetimeSeconds: number;
  readonly profileDir?: string;
  /** The upstream resolver (default: a loopback port where nothing listens). */
  readonly dnsUpstream?: string;
  /** More `moat serve` flags (a Redis store, a node ID...). */
  readonly extraArgs?: readonly string[];
}): Promise<MoatServe> {
  const host = '127.0.0.1';
  const args = [
    ...['serve', '--data-dir', join(options.dir, 'data'), '--api-listen', `${host}:0`],
    ...[
      '--sandbox-listen',
      `${host}:0`,
      '--dns-listen',
      `${host}:0`,
      '--proxy-listen',
      `${host}:0`,
    ],
    // Without an upstream given, a loopback port where nothing listens: no query leaves.
    ...['--transparent-listen', 'off', '--dns-upstream', options.dnsUpstream ?? `${host}:9`],
    ...['--api-keys', options.apiKey, '--log-level', 'warn'],
    // Shared host network: namespaced creates are measured by bench:netns.
    ...['--enforcement', 'proxy'],
    ...(options.extraArgs ?? []),
  ];
  const profiling = options.profileDir ? ['--cpu-prof', '--cpu-prof-dir', options.profileDir] : [];
  const log = openSync(join(options.dir, 'moat.log'), 'a');
  const child = spawnBounded(
    options.lifetimeSeconds,
    [process.execPath, ...profiling, MOAT_CLI, ...args],
    // The JSON log (standard output) to the file; start-up lines for people (standard error) here.
    { stdio: ['ignore', log, 'pipe'], env: { PATH: process.env.PATH ?? '' } },
  );
  closeSync(log);
  let output = '';
  child.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
    output += chunk;
  });
  const line = (label: string) => new RegExp(`^moat: ${label}\\s+(.*)$`, 'm').exec(output)?.[1];
  const portOf = (label: string) => /^http:\/\/127\.0\.0\.1:(\d+)/.exec(line(label) ?? '')?.[1];
  const deadline = Date.now() + 15_000;
  for (;;) {
    const apiPort = portOf('platform API');
    const sandboxPort = portOf('sandbox API');
    const pid = commandPid(child.pid!);
    if (apiPort && sandboxPort && pid !== undefined) {
      const health = await fetch(`http://${host}:${apiPort}/health`, {
        signal: AbortSignal.timeout(2000),
      }).catch(() => undefined);
      if (health?.status === 200) {
        return { child, pid, apiPort: Number(apiPort), sandboxPort: Number(sandboxPort), line };
      }
    }
    if (child.exitCode !== null || Date.now() > deadline) {
      throw new Error(`moat serve did not start; its output:\n${output}`);
    }
    await sleep(50);
  }
}
