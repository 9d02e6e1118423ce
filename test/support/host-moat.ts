/**
 * A `moat serve` in namespace mode inside a network namespace this test makes, which plays the
 * host (test/support/host-namespace.ts): so that what the host's side holds (its connection
 * tracking table, its end of each sandbox link) is the test's own to measure, never the
 * machine's. The API is reached through a forwarder; sandboxes are made through it and driven
 * with the `e2b` SDK.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { CommandExitError, Sandbox } from 'e2b';
import { API_KEY, ApiClient } from './api-client.js';
import { HostNamespace } from './host-namespace.js';
import { ServeChild } from './serve-child.js';

const PORTS = { api: 3000, sandbox: 3001 };

export interface HostMoat {
  readonly host: HostNamespace;
  readonly moat: ServeChild;
  readonly api: ApiClient;
  /** A sandbox that stop() kills. */
  sandbox(network?: Record<string, unknown>): Promise<Sandbox>;
  stop(): Promise<void>;
}

/**
 * `tag` names the host namespace; `address` is the host's own (198.18.0.0/15); `pool` the
 * sandboxes' links; `flags` more `moat serve` flags.
 */
export async function startHostMoat(
  tag: string,
  address: string,
  pool: string,
  flags: string[] = [],
): Promise<HostMoat> {
  const host = HostNamespace.create(`${tag}-${process.pid}`, address);
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-hostmoat-'));
  const moat = new ServeChild(
    [
      ...['--data-dir', scratch, '--enforcement', 'namespace', '--api-keys', API_KEY],
      ...['--namespace-pool', pool, '--internal-deny', '169.254.0.0/16'],
      ...['--api-listen', `0.0.0.0:${PORTS.api}`, '--sandbox-listen', `127.0.0.1:${PORTS.sandbox}`],
      ...['--proxy-listen', '127.0.0.1:3128', '--dns-listen', '127.0.0.1:3053'],
      ...['--transparent-listen', 'off', '--dns-upstream', '127.0.0.1:5399'],
      ...flags,
    ],
    {},
    host.name,
  );
  const created: Sandbox[] = [];
  const stop = async () => {
    await Promise.all(created.map((s) => s.kill().catch(() => undefined)));
    // A clean stop removes the sandboxes' namespaces (their names are the machine's).
    await moat.stop('SIGTERM').catch(() => undefined);
    await ServeChild.killAll();
    host.close();
    rmSync(scratch, { recursive: true, force: true });
  };
  try {
    await moat.started();
    const [api, sandboxes] = await host.forward([PORTS.api, PORTS.sandbox]);
    Object.assign(process.env, {
      E2B_API_URL: `http://127.0.0.1:${api}`,
      E2B_SANDBOX_URL: `http://127.0.0.1:${sandboxes}`,
      E2B_API_KEY: API_KEY,
      E2B_DOMAIN: 'moat.test',
    });
    const client = new ApiClient(`http://127.0.0.1:${api}`);
    return {
      host,
      moat,
      api: client,
      async sandbox(network) {
        // Through the API: the SDK sends only the network fields E2B knows.
        const reply = await client.call('POST', '/v2/sandboxes', {
          body: { templateID: 'base', timeout: 120, ...(network === undefined ? {} : { network }) },
        });
        if (reply.status !== 201) throw new Error(`create: ${reply.status} ${reply.text}`);
        const sandbox = await Sandbox.connect((reply.body as { sandboxID: string }).sandboxID);
        created.push(sandbox);
        return sandbox;
      },
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}

/** Runs a shell line in the sandbox: its exit code and output, a failing exit included. */
export async function runIn(
  sandbox: Sandbox,
  script: string,
  timeoutMs = 30_000,
): Promise<{ code: number; out: string; err: string }> {
  try {
    const done = await sandbox.commands.run(script, { timeoutMs });
    return { code: 0, out: done.stdout, err: done.stderr };
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error;
    return { code: error.exitCode, out: error.stdout, err: error.stderr };
  }
}
