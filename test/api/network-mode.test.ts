/**
 * `network.mode` on the wire: fixed at create (the operator's `--default-network-mode` where the
 * body names none), kept by a PUT that names none (the E2B SDK never sends it), replaced by one
 * that does, and refused with a message naming it when it is neither mode.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ApiMoat, startApiMoat } from '../support/api-client.js';

const POLICY = { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] };

describe('network.mode', () => {
  let env: ApiMoat;

  beforeAll(async () => {
    env = await startApiMoat(new Map(), { 'default-network-mode': 'report' });
  });
  afterAll(() => env?.stop());

  const modeOf = async (sandboxID: string) =>
    ((await env.api.detail(sandboxID)) as unknown as { network: { mode: string } }).network.mode;
  const put = (sandboxID: string, body: object) =>
    env.api.call('PUT', `/sandboxes/${sandboxID}/network`, { body });

  it('is the operator default at create unless the body names one, and a PUT without one keeps it', async () => {
    const created = await env.api.call('POST', '/sandboxes', {
      body: { templateID: 'base', timeout: 60, network: POLICY },
    });
    expect(created.status, created.text).toBe(201);
    const { sandboxID } = created.body as { sandboxID: string };
    expect(await modeOf(sandboxID)).toBe('report');
    expect((await put(sandboxID, POLICY)).status).toBe(204);
    expect(await modeOf(sandboxID)).toBe('report');
    expect((await put(sandboxID, { ...POLICY, mode: 'enforce' })).status).toBe(204);
    expect(await modeOf(sandboxID)).toBe('enforce');
    expect((await put(sandboxID, { allowOut: [] })).status).toBe(204);
    expect(await modeOf(sandboxID)).toBe('enforce');

    const enforced = await env.api.call('POST', '/sandboxes', {
      body: { templateID: 'base', timeout: 60, network: { ...POLICY, mode: 'enforce' } },
    });
    expect(enforced.status, enforced.text).toBe(201);
    expect(await modeOf((enforced.body as { sandboxID: string }).sandboxID)).toBe('enforce');
  });

  it('refuses a mode that is neither, naming the field', async () => {
    const created = await env.api.call('POST', '/sandboxes', {
      body: { templateID: 'base', timeout: 60, network: { ...POLICY, mode: 'audit' } },
    });
    expect(created.status).toBe(400);
    expect(created.text).toContain('mode');
  });
});
