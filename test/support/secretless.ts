/**
 * What the secretless egress tests (proxy and namespace mode) share: curl inside a sandbox, and
 * the check that a secret's value is nowhere a sandbox or an API client can look.
 */
import type { Sandbox } from 'e2b';
import { expect } from 'vitest';
import { SDK_DOMAIN, type SdkMoat, viaHost } from './sdk-moat.js';

/** The port envd answers on, behind the sandbox listener. */
const ENVD_PORT = 49983;

/** curl in the sandbox (as its default user); a failing exit is a result, not an exception. */
export async function curlIn(
  sandbox: Sandbox,
  url: string,
  flags = '',
): Promise<{ stdout: string; stderr: string }> {
  const result = await sandbox.commands
    .run(`curl -sS --max-time 10 ${flags} ${url}`)
    .catch((error: { stdout: string; stderr: string; exitCode: number }) => error);
  return { stdout: result.stdout, stderr: result.stderr };
}

/**
 * None of `values` is in the sandbox's environment or its files (searched as root), in envd's
 * GET /envs, in GET /sandboxes/{id} (which shows `placeholder` instead) or, when given, in
 * Moat's log lines.
 */
export async function expectSecretsNowhere(
  harness: SdkMoat,
  sandbox: Sandbox,
  options: { values: readonly string[]; placeholder: string; logs?: readonly string[] },
): Promise<void> {
  const { values, placeholder, logs } = options;
  const patterns = values.map((v) => `-e ${v.slice(0, 12)}`).join(' ');
  const inside = await sandbox.commands.run(
    `env; cat /proc/self/environ; grep -rs ${patterns} /etc /home /tmp /root || true`,
    { user: 'root' },
  );
  // envd's own view of the sandbox's environment, as the SDK would ask for it.
  const token = (sandbox as unknown as { envdAccessToken?: string }).envdAccessToken;
  const envs = await viaHost(
    harness.sandboxUrl,
    `${ENVD_PORT}-${sandbox.sandboxId}.${SDK_DOMAIN}`,
    {
      path: '/envs',
      headers: token === undefined ? {} : { 'X-Access-Token': token },
    },
  );
  expect(envs.status, envs.body).toBe(200);
  const detail = await harness.api.get(`/sandboxes/${sandbox.sandboxId}`);
  expect(detail.status, detail.text).toBe(200);
  expect(detail.text).toContain(placeholder);
  const logged = logs?.join('') ?? '';
  for (const value of values) {
    expect(inside.stdout).not.toContain(value);
    expect(envs.body).not.toContain(value);
    expect(detail.text).not.toContain(value);
    expect(logged).not.toContain(value);
  }
}
