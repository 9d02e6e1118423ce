/**
 * Presets through the real `e2b` SDK: `preset:pypi` passes through the SDK's allowOut untouched,
 * GET /sandboxes/{id} shows it as written and, in Moat's `network.presets`, expanded; an unknown
 * preset or a preset in denyOut is a 400 naming the entry.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type SdkMoat, startSdkMoat } from '../support/sdk-moat.js';

const PYPI = JSON.parse(readFileSync('policies/presets/pypi.json', 'utf8')) as {
  version: number;
  allowOut: string[];
};

let harness: SdkMoat;
beforeAll(async () => {
  harness = await startSdkMoat({ flags: { enforcement: 'proxy' } });
});
afterAll(() => harness.stop());

describe('presets through the SDK', () => {
  it('creates with preset:pypi; GET shows it by name and expanded; PUT refuses an unknown preset', async () => {
    const sandbox = await harness.sandbox({
      network: { allowOut: ['preset:pypi'], denyOut: ['0.0.0.0/0'] },
    });
    // The E2B round trip: allowOut exactly as given.
    expect((await sandbox.getInfo()).network?.allowOut).toEqual(['preset:pypi']);
    const detail = await harness.api.get(`/sandboxes/${sandbox.sandboxId}`);
    expect(detail.status).toBe(200);
    const network = (detail.body as { network: Record<string, unknown> }).network;
    expect(network.allowOut).toEqual(['preset:pypi']);
    expect(network.presets).toEqual([
      { name: 'pypi', version: PYPI.version, entries: PYPI.allowOut },
    ]);

    await expect(
      sandbox.updateNetwork({ allowOut: ['pypi.org', 'preset:nope'], denyOut: ['0.0.0.0/0'] }),
    ).rejects.toThrow(
      /unknown preset preset:nope \(allowOut\[1\]\): known presets are .*preset:pypi/,
    );
    const inDeny = await harness.api.put(`/sandboxes/${sandbox.sandboxId}/network`, {
      allowOut: [],
      denyOut: ['preset:pypi'],
    });
    expect(inDeny.status).toBe(400);
    expect(inDeny.text).toMatch(
      /invalid denied CIDR preset:pypi \(denyOut\[0\]\): presets only allow/,
    );
    // Refused changes leave the policy as it was.
    const after = await harness.api.get(`/sandboxes/${sandbox.sandboxId}`);
    expect((after.body as { network: { allowOut: string[] } }).network.allowOut).toEqual([
      'preset:pypi',
    ]);

    // Without a preset the field is absent: replies of other sandboxes are unchanged.
    await sandbox.updateNetwork({ allowOut: ['pypi.org'], denyOut: ['0.0.0.0/0'] });
    const plain = await harness.api.get(`/sandboxes/${sandbox.sandboxId}`);
    expect((plain.body as { network: Record<string, unknown> }).network).not.toHaveProperty(
      'presets',
    );
  });
});
