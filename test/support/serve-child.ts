/** A real `moat serve` child for tests: its output, start-up facts, signals and log lines. */
import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { MOAT_BIN } from './moat.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** What the human start-up lines (on standard error) say. */
export interface Started {
  readonly api: string;
  readonly sandbox: string;
  readonly proxy: string;
  readonly dns: string;
  /** `off` or ip:port. */
  readonly metrics: string;
  readonly dataDir: string;
  /** The key, read from the file start-up names, when this start generated it. */
  readonly generatedKey: string | undefined;
}

const keyIn = (file: string | undefined) =>
  file === undefined ? undefined : readFileSync(file, 'utf8').trim();

export type LogLine = Record<string, unknown> & { msg?: string };

export class ServeChild {
  /** Every child started, so that a suite can end them all. */
  static readonly all: ServeChild[] = [];

  static async killAll(): Promise<void> {
    await Promise.all(ServeChild.all.splice(0).map((c) => c.kill()));
  }

  stdout = '';
  stderr = '';
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private readonly child: ChildProcess;

  /**
   * `netns`: a network namespace the test made, where this Moat then plays the host;
   * `wrapper`: a command that runs it (`prlimit --nofile=...`).
   */
  constructor(
    args: string[],
    env: Record<string, string> = {},
    netns?: string,
    wrapper: string[] = [],
  ) {
    const command = [...wrapper, process.execPath, MOAT_BIN, 'serve', ...args];
    const [file, ...argv] =
      netns === undefined
        ? command
        : ['/usr/bin/nsenter', `--net=/run/netns/${netns}`, '--', ...command];
    // Only PATH from the environment: no MOAT_* setting of the host leaks in. Its own process
    // group, as a shell gives a foreground job: interrupt() signals the group, as Ctrl-C does.
    this.child = spawn(file!, argv, {
      env: { PATH: process.env.PATH ?? '', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    this.child.stdout!.setEncoding('utf8').on('data', (chunk: string) => (this.stdout += chunk));
    this.child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (this.stderr += chunk));
    this.exited = new Promise((resolve) =>
      this.child.once('exit', (code, signal) => resolve({ code, signal })),
    );
    ServeChild.all.push(this);
  }

  get running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  output(): string {
    return `stdout:\n${this.stdout}\nstderr:\n${this.stderr}`;
  }

  /** The log lines so far: every line on standard output is one JSON object. */
  logLines(): LogLine[] {
    return this.stdout
      .split('\n')
      .filter((line) => line !== '')
      .map((line) => JSON.parse(line) as LogLine);
  }

  /**
   * Waits for the last human start-up line (standard error) and the "moat started" log line
   * (standard output; either may come first) and returns what the human lines say.
   */
  async started(deadlineMs = 15_000): Promise<Started> {
    const deadline = Date.now() + deadlineMs;
    const complete = () =>
      /^moat: metrics .*$/m.test(this.stderr) && /"msg":"moat started"/.test(this.stdout);
    while (!complete()) {
      if (!this.running || Date.now() > deadline) {
        throw new Error(`moat serve did not start\n${this.output()}`);
      }
      await sleep(20);
    }
    const field = (pattern: RegExp) => {
      const found = pattern.exec(this.stderr)?.[1];
      if (found === undefined) throw new Error(`no ${pattern} in\n${this.output()}`);
      return found;
    };
    return {
      api: field(/^moat: platform API +http:\/\/(\S+) /m),
      sandbox: field(/^moat: sandbox API +http:\/\/(\S+) /m),
      proxy: field(/^moat: egress proxy +(\S+) /m),
      dns: field(/^moat: DNS interceptor +(\S+) /m),
      metrics: field(/^moat: metrics +(?:http:\/\/)?([^/\s]+)/m),
      dataDir: field(/^moat: data folder +(\S+)$/m),
      generatedKey: keyIn(/^moat: API key +generated into (\S+) /m.exec(this.stderr)?.[1]),
    };
  }

  /** Sends `signal` and waits (bounded) for the exit. */
  async stop(signal: NodeJS.Signals): Promise<{ code: number | null; signal: string | null }> {
    this.child.kill(signal);
    return this.exitWithin15s();
  }

  /**
   * Ctrl-C in the terminal: SIGINT to the whole process group, Moat and every child it left in
   * its group, at once; then waits (bounded) for the exit.
   */
  async interrupt(): Promise<{ code: number | null; signal: string | null }> {
    process.kill(-this.child.pid!, 'SIGINT');
    return this.exitWithin15s();
  }

  private exitWithin15s(): Promise<{ code: number | null; signal: string | null }> {
    const timeout = sleep(15_000).then(() => ({ code: null, signal: 'still running after 15 s' }));
    return Promise.race([this.exited, timeout]);
  }

  async kill(): Promise<void> {
    if (this.running) this.child.kill('SIGKILL');
    await this.exited;
  }
}

/**
 * `moat serve` flags for a test: loopback everywhere, ports chosen by the kernel, the fake DNS on
 * `dnsUpstreamPort` as upstream, sandboxes on the host network (several of these run at once;
 * namespaced Moats would need a pool each, as test/netns gives them).
 */
export const loopbackServeArgs = (
  dataDir: string,
  dnsUpstreamPort: number,
  extra: string[] = [],
): string[] => [
  ...['--data-dir', dataDir, '--api-listen', '127.0.0.1:0', '--sandbox-listen', '127.0.0.1:0'],
  ...['--dns-listen', '127.0.0.1:0', '--proxy-listen', '127.0.0.1:0'],
  ...['--transparent-listen', 'off', '--dns-upstream', `127.0.0.1:${dnsUpstreamPort}`],
  ...['--enforcement', 'proxy'],
  ...extra,
];
