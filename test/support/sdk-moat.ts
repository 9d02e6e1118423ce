/**
 * One Moat per SDK suite, configured the way a user would point the real `e2b` SDK at it: only
 * E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and E2B_DOMAIN are set.
 */
import http from 'node:http';
import { pino } from 'pino';
import { scratchMoatFlags } from '../../bench/lib/scratch.js';
import { type RunningMoat, startMoat } from '../../src/cli/index.js';
import { loadConfig } from '../../src/config.js';
import { FakeDns } from './fake-dns.js';

export const SDK_API_KEY = 'sdk-suite-api-key-0123456789';
export const SDK_DOMAIN = 'moat.test';

export interface SdkMoat {
  readonly moat: RunningMoat;
  readonly sandboxUrl: string;
  stop(): Promise<void>;
}

export async function startSdkMoat(): Promise<SdkMoat> {
  const upstream = await new FakeDns(new Map()).start();
  const scratch = scratchMoatFlags();
  const config = loadConfig({
    flags: {
      ...scratch.flags,
      'api-keys': SDK_API_KEY,
      'dns-listen': '127.0.0.1:0',
      'dns-upstream': `127.0.0.1:${upstream.port}`,
      'proxy-listen': '127.0.0.1:0',
      'transparent-listen': 'off',
      'log-level': 'silent',
    },
  });
  if (!config.ok) throw new Error(config.error);
  const moat = await startMoat(config.value, pino({ level: 'silent' }), { defaultMetrics: false });
  const sandboxUrl = `http://127.0.0.1:${moat.listening.sandbox.port}`;
  Object.assign(process.env, {
    E2B_API_URL: `http://127.0.0.1:${moat.listening.api.port}`,
    E2B_SANDBOX_URL: sandboxUrl,
    E2B_API_KEY: SDK_API_KEY,
    E2B_DOMAIN: SDK_DOMAIN,
  });
  return {
    moat,
    sandboxUrl,
    async stop() {
      await moat.stop();
      await upstream.stop();
      scratch.remove();
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
