/**
 * Secretless egress end to end with the real `e2b` SDK: a stored secret, a sandbox whose
 * network rule names it, and `curl https://...` inside a real (confined) sandbox reaching an
 * origin that sees the injected header, while the sandbox itself never holds the value. The
 * sandbox verifies Moat's leaf through its own trust store (no -k); Moat verifies the origin
 * against the test CA given as --upstream-ca.
 */
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { Sandbox, Secret } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';
import { TestCa } from '../support/test-ca.js';
import { skipReason } from '../confinement/runtime-harness.js';

const skip = skipReason('sdk/secretless');
const ORIGIN_IP = '127.0.0.41';
const TOKEN = `ghp_${'s3cr3t'.repeat(6)}`;
const ROTATED = `ghp_${'r0tat3d'.repeat(5)}`;

describe.skipIf(skip !== undefined)('secretless egress through the SDK', () => {
  let harness: SdkMoat;
  let origin: https.Server;
  let port: number;
  const originCa = new TestCa('Secretless origin test CA');

  beforeAll(async () => {
    const leaf = originCa.issue(['api.secret.test', 'plain.secret.test']);
    origin = https.createServer({ key: leaf.key, cert: leaf.cert }, (request, response) => {
      response.setHeader('content-type', 'application/json');
      response.end(
        JSON.stringify({
          authorization: request.headers.authorization ?? null,
          team: request.headers['x-team'] ?? null,
        }),
      );
    });
    await new Promise<void>((resolve) => origin.listen(0, ORIGIN_IP, resolve));
    port = (origin.address() as AddressInfo).port;
    harness = await startSdkMoat({
      zone: new Map([
        ['api.secret.test', { A: [ORIGIN_IP] }],
        ['plain.secret.test', { A: [ORIGIN_IP] }],
      ]),
      flags: {
        enforcement: 'proxy',
        // The origin is this host's loopback: opened as an operator opens a host port.
        'internal-deny': '169.254.0.0/16',
        'allow-host-ports': String(port),
        'upstream-ca': originCa.certFile(),
      },
    });
    await Secret.create('gh', TOKEN);
  }, 60_000);

  afterAll(async () => {
    await harness?.stop();
    origin?.close();
    originCa.remove();
  });

  const curl = async (sandbox: Sandbox, url: string, flags = '') => {
    const result = await sandbox.commands
      .run(`curl -sS --max-time 10 ${flags} ${url}`)
      .catch((error: { stdout: string; stderr: string; exitCode: number }) => error);
    return { stdout: result.stdout, stderr: result.stderr };
  };

  it('adds the rule’s headers at the gateway; the sandbox never holds the secret', async () => {
    const sandbox = await harness.sandbox({
      network: {
        allowOut: ['api.secret.test', 'plain.secret.test'],
        denyOut: ['0.0.0.0/0'],
        rules: {
          'api.secret.test': [
            {
              transform: {
                headers: { Authorization: 'Bearer ${e2b.secrets.gh}', 'X-Team': 'moat' },
              },
            },
          ],
        },
      } as never,
    });
    // Through the proxy variables (CONNECT), verified by the sandbox's own bundle: no -k.
    const seen = await curl(sandbox, `https://api.secret.test:${port}/`);
    expect(JSON.parse(seen.stdout), seen.stderr).toEqual({
      authorization: `Bearer ${TOKEN}`,
      team: 'moat',
    });
    // A header the sandbox sends itself is replaced, not doubled.
    const replaced = await curl(
      sandbox,
      `https://api.secret.test:${port}/`,
      "-H 'Authorization: Bearer mine'",
    );
    expect(JSON.parse(replaced.stdout).authorization).toBe(`Bearer ${TOKEN}`);
    // A name without a rule is an opaque tunnel: the origin's own certificate, no headers.
    const opaque = await curl(sandbox, `https://plain.secret.test:${port}/`);
    expect(opaque.stderr).toMatch(/certificate/i);
    const unverified = await curl(sandbox, `https://plain.secret.test:${port}/`, '-k');
    expect(JSON.parse(unverified.stdout)).toEqual({ authorization: null, team: null });
    // Plain HTTP to the rule's domain is never given credentials.
    const plain = await curl(sandbox, `http://api.secret.test:${port}/`);
    expect(plain.stdout).toContain('added over HTTPS only');

    // The next request takes a rotated value.
    await Secret.update('gh', ROTATED);
    const rotated = await curl(sandbox, `https://api.secret.test:${port}/`);
    expect(JSON.parse(rotated.stdout).authorization).toBe(`Bearer ${ROTATED}`);

    // Nowhere the sandbox or an API client can look: its environment, its files, the API.
    const inside = await sandbox.commands.run(
      `env; cat /proc/self/environ; grep -rs -e ${TOKEN.slice(0, 12)} -e ${ROTATED.slice(0, 12)} /etc /home /tmp /root || true`,
      { user: 'root' },
    );
    for (const value of [TOKEN, ROTATED]) {
      expect(inside.stdout).not.toContain(value);
      const detail = await harness.api.get(`/sandboxes/${sandbox.sandboxId}`);
      expect(JSON.stringify(detail.body)).not.toContain(value);
      expect(JSON.stringify(detail.body)).toContain('${e2b.secrets.gh}');
    }
  });

  it('does not open a destination through a rule alone: allowOut decides', async () => {
    const sandbox = await harness.sandbox({
      network: {
        allowOut: ['plain.secret.test'],
        denyOut: ['0.0.0.0/0'],
        rules: { 'api.secret.test': [{ transform: { headers: { 'X-Team': 'moat' } } }] },
      } as never,
    });
    const denied = await curl(sandbox, `https://api.secret.test:${port}/`);
    expect(denied.stderr).toMatch(/403|CONNECT/);
    expect(denied.stdout).not.toContain('moat');
  });
});
