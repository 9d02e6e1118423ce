/**
 * `network.bandwidth` (Moat's extension) on the platform API: accepted in the create body (v1
 * and v2) and the PUT network body, stored, shown in GET with the operator's defaults for what
 * it leaves out, replaced by PUT; a bad value is a 400 naming the field. In proxy mode GET says
 * it is not enforced. (test/netns/bandwidth.test.ts measures it held in the kernel.)
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ApiClient, expectError, startApiMoat } from '../support/api-client.js';

let api: ApiClient;
let stop: () => Promise<void>;

beforeAll(async () => {
  const started = await startApiMoat(undefined, {
    enforcement: 'proxy',
    'sandbox-egress-mbps': '50',
    'sandbox-ingress-mbps': '0',
  });
  api = started.api;
  stop = started.stop;
});

afterAll(async () => {
  await stop?.();
});

async function create(network: unknown, path = '/v2/sandboxes'): Promise<string> {
  const reply = await api.call('POST', path, {
    body: { templateID: 'base', timeout: 120, network },
  });
  expect(reply.status, reply.text).toBe(201);
  return (reply.body as { sandboxID: string }).sandboxID;
}

const detailOf = async (id: string) =>
  (await api.call('GET', `/sandboxes/${id}`)).body as {
    network: { bandwidth: unknown };
    egress: { bandwidthEnforced: boolean };
  };

describe('network.bandwidth', () => {
  it("is shown as asked, the operator's default for a direction left out, and not enforced in proxy mode", async () => {
    for (const path of ['/sandboxes', '/v2/sandboxes']) {
      const id = await create({ bandwidth: { ingressMbps: 8 } }, path);
      const detail = await detailOf(id);
      expect(detail.network.bandwidth).toEqual({ egressMbps: 50, ingressMbps: 8 });
      expect(detail.egress.bandwidthEnforced).toBe(false);
    }
    const plain = await detailOf(await create({}));
    expect(plain.network.bandwidth).toEqual({ egressMbps: 50, ingressMbps: 0 });
  });

  it('is replaced by PUT network, and back to the defaults when a PUT leaves it out', async () => {
    const id = await create({ bandwidth: { egressMbps: 8, ingressMbps: 8 } });
    const put = await api.call('PUT', `/sandboxes/${id}/network`, {
      body: { allowOut: [], bandwidth: { egressMbps: 0, ingressMbps: 20 } },
    });
    expect(put.status, put.text).toBe(204);
    expect((await detailOf(id)).network.bandwidth).toEqual({ egressMbps: 0, ingressMbps: 20 });
    const cleared = await api.call('PUT', `/sandboxes/${id}/network`, { body: {} });
    expect(cleared.status, cleared.text).toBe(204);
    expect((await detailOf(id)).network.bandwidth).toEqual({ egressMbps: 50, ingressMbps: 0 });
  });

  it.each([
    [{ egressMbps: -1 }, /egressMbps/],
    [{ ingressMbps: 1.5 }, /ingressMbps/],
    [{ egressMbps: 100_001 }, /egressMbps/],
    [{ egressMbps: '8' }, /egressMbps/],
    [{ burst: 1 }, /burst/],
    [8, /bandwidth/],
  ])('refuses %j with a 400 naming the field, on create and on PUT', async (bandwidth, field) => {
    const created = await api.call('POST', '/v2/sandboxes', {
      body: { templateID: 'base', network: { bandwidth } },
    });
    expectError(created, 400, field);
    const id = await create({});
    const put = await api.call('PUT', `/sandboxes/${id}/network`, { body: { bandwidth } });
    expectError(put, 400, field);
  });
});
