/**
 * One Moat per SDK suite, configured the way a user would point the real `e2b` SDK at it: only
 * E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and E2B_DOMAIN are set.
 */
import http from 'node:http';
import { Sandbox, type SandboxOpts } from 'e2b';
import type { RunningMoat } from '../../src/app/index.js';
import { API_KEY, type ApiClient, startApiMoat } from './api-client.js';
import type { FakeDns, ZoneEntry } from './fake-dns.js';

export const SDK_DOMAIN = 'moat.test';

export interface SdkMoat {
  readonly moat: RunningMoat;
  readonly api: ApiClient;
  readonly upstream: FakeDns;
  readonly sandboxUrl: string;
  /** A sandbox from `template` (default base) that stop() kills. */
  sandbox(options?: SandboxOpts, template?: string): Promise<Sandbox>;
  stop(): Promise<void>;
}

/** `logs`: collects Moat's log lines (see startApiMoat). */
export async function startSdkMoat(
  options: { zone?: Map<string, ZoneEntry>; flags?: Record<string, string>; logs?: string[] } = {},
): Promise<SdkMoat> {
  const started = await startApiMoat(options.zone, options.flags, options.logs);
  const { moat } = started;
  const sandboxUrl = `http://127.0.0.1:${moat.listening.sandbox.port}`;
  Object.assign(process.env, {
    E2B_API_URL: `http://127.0.0.1:${moat.listening.api.port}`,
    E2B_SANDBOX_URL: sandboxUrl,
    E2B_API_KEY: API_KEY,
    E2B_DOMAIN: SDK_DOMAIN,
  });
  const created: Sandbox[] = [];
  return {
    moat,
    api: started.api,
    upstream: started.upstream,
    sandboxUrl,
    async sandbox(options = {}, template) {
      const opts = { timeoutMs: 120_000, ...options };
      const sbx = await (template === undefined
        ? Sandbox.create(opts)
        : Sandbox.create(template, opts));
      created.push(sbx);
      return sbx;
    },
    async stop() {
      await Promise.all(created.map((s) => s.kill().catch(() => undefined)));
      await started.stop();
    },
  };
}

/** An HTTP request to the sandbox listener with a chosen Host (how ingress is addressed). */
export function viaHost(
  sandboxUrl: string,
  host: string,
  options: { path?: string; headers?: Record<string, string> } = {},
): Promise<{ status: number; body: string; headers: http.IncomingHttpHeaders }> {
  const url = new URL(sandboxUrl);
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        host: url.hostname,
        port: url.port,
        path: options.path ?? '/',
        headers: { ...options.headers, host },
      },
      (response) => {
        let body = '';
        response.setEncoding('utf8').on('data', (chunk: string) => (body += chunk));
        response.on('end', () =>
          resolve({ status: response.statusCode ?? 0, body, headers: response.headers }),
        );
      },
    );
    request.on('error', reject);
    request.end();
  });
}
