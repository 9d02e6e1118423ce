/**
 * Secretless egress end to end with the real `e2b` SDK: a stored secret, a sandbox whose
 * network rule names it, and `curl https://...` inside a real (confined) sandbox reaching an
 * origin that sees the injected header, while the sandbox itself never holds the value. The
 * sandbox verifies Moat's leaf through its own trust store (no -k); Moat verifies the origin
 * against the test CA given as --upstream-ca.
 */
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { Secret } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';
import { curlIn, expectSecretsNowhere } from '../support/secretless.js';
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
  const logs: string[] = [];
  const originCa = new TestCa('Secretless origin test CA');

  beforeAll(async () => {
    const leaf = originCa.issue(['api.secret.test', 'plain.secret.test']);
    origin = https.createServer({ key: leaf.key, cert: leaf.cert }, (request, response) => {
      response.setHeader('content-type', 'application/json');
      response.end(
        JSON.stringify({
          authorization: request.headers.authorization ?? null,
          team: request.headers['x-team'] ?? null,
          ...(request.method === 'GET' ? {} : { method: request.method }),
        }),
      );
    });
    await new Promise<void>((resolve) => origin.listen(0, ORIGIN_IP, resolve));
    port = (origin.address() as AddressInfo).port;
    harness = await startSdkMoat({
      logs,
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
    const seen = await curlIn(sandbox, `https://api.secret.test:${port}/`);
    expect(JSON.parse(seen.stdout), seen.stderr).toEqual({
      authorization: `Bearer ${TOKEN}`,
      team: 'moat',
    });
    // A header the sandbox sends itself is replaced, not doubled.
    const replaced = await curlIn(
      sandbox,
      `https://api.secret.test:${port}/`,
      "-H 'Authorization: Bearer mine'",
    );
    expect(JSON.parse(replaced.stdout).authorization).toBe(`Bearer ${TOKEN}`);
    // A name without a rule is an opaque tunnel: the origin's own certificate, no headers.
    const opaque = await curlIn(sandbox, `https://plain.secret.test:${port}/`);
    expect(opaque.stderr).toMatch(/certificate/i);
    const unverified = await curlIn(sandbox, `https://plain.secret.test:${port}/`, '-k');
    expect(JSON.parse(unverified.stdout)).toEqual({ authorization: null, team: null });
    // Plain HTTP to the rule's domain is never given credentials.
    const plain = await curlIn(sandbox, `http://api.secret.test:${port}/`);
    expect(plain.stdout).toContain('added over HTTPS only');

    // The next request takes a rotated value.
    await Secret.update('gh', ROTATED);
    const rotated = await curlIn(sandbox, `https://api.secret.test:${port}/`);
    expect(JSON.parse(rotated.stdout).authorization).toBe(`Bearer ${ROTATED}`);

    // Nowhere the sandbox, an API client or Moat's logs hold it.
    expect(logs.join('')).toContain('secret headers injected');
    await expectSecretsNowhere(harness, sandbox, {
      values: [TOKEN, ROTATED],
      placeholder: '${e2b.secrets.gh}',
      logs,
    });
  });

  it('does not open a destination through a rule alone: allowOut decides', async () => {
    const sandbox = await harness.sandbox({
      network: {
        allowOut: ['plain.secret.test'],
        denyOut: ['0.0.0.0/0'],
        rules: { 'api.secret.test': [{ transform: { headers: { 'X-Team': 'moat' } } }] },
      } as never,
    });
    const denied = await curlIn(sandbox, `https://api.secret.test:${port}/`);
    expect(denied.stderr).toMatch(/403|CONNECT/);
    expect(denied.stdout).not.toContain('moat');
  });

  it('holds a GET-only rule, written as an SDK user writes it, with the credential on GETs alone', async () => {
    // SDK 2.51 sends a rule's transform alone, whole: match and action go inside it (a cast,
    // since the SDK's type names headers only).
    const network = {
      allowOut: ['api.secret.test'],
      denyOut: ['0.0.0.0/0'],
      rules: {
        'api.secret.test': [
          {
            transform: {
              match: { methods: ['GET', 'HEAD'], paths: ['/repos/acme/*'] },
              action: 'allow',
              headers: { Authorization: 'Bearer ${e2b.secrets.gh}' },
            },
          },
          { transform: { action: 'deny' } },
        ],
      },
    };
    await Secret.update('gh', TOKEN);
    const sandbox = await harness.sandbox({ network: network as never });
    const read = await curlIn(sandbox, `https://api.secret.test:${port}/repos/acme/moat`);
    expect(JSON.parse(read.stdout), read.stderr).toEqual({
      authorization: `Bearer ${TOKEN}`,
      team: null,
    });
    const push = await curlIn(
      sandbox,
      `https://api.secret.test:${port}/repos/acme/moat`,
      "-X POST -d '{}' -w ' %{http_code}'",
    );
    expect(push.stdout).toBe(
      '{"code":403,"message":"POST /repos/acme/moat to api.secret.test is denied by rule api.secret.test #2 of network.rules"} 403',
    );
    // Shown as stored: the rule as written, match and action included.
    const shown = await harness.api.call('GET', `/sandboxes/${sandbox.sandboxId}`);
    expect((shown.body as { network: { rules: unknown } }).network.rules).toEqual(network.rules);
    const elsewhere = await curlIn(
      sandbox,
      `https://api.secret.test:${port}/user`,
      "-w ' %{http_code}'",
    );
    expect(elsewhere.stdout).toMatch(/ 403$/);

    // Beside transform, as Moat's own form writes it, the SDK drops match and action and sends
    // {}: refused, never taken as a rule that does nothing.
    await expect(
      harness.sandbox({
        network: {
          allowOut: ['api.secret.test'],
          denyOut: ['0.0.0.0/0'],
          rules: { 'api.secret.test': [{ match: { methods: ['GET'] }, action: 'allow' }] },
        } as never,
      }),
    ).rejects.toThrow(/rule 0 is empty.*write match and action inside transform/);
  });
});
