/**
 * Ingress where sandboxes share the host's network (proxy mode): a sandbox's address is the
 * host's loopback, so `{port}-{sandboxID}.<domain>` must reach only ports the sandbox's own
 * processes listen on, never another service of the host or one of Moat's own listeners.
 */
import http from 'node:http';
import net from 'node:net';
import type { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type SdkMoat, startSdkMoat, viaHost } from '../support/sdk-moat.js';
import { freePort } from '../support/local-host.js';

let harness: SdkMoat;
beforeAll(async () => {
  harness = await startSdkMoat({ flags: { enforcement: 'proxy' } });
});
afterAll(() => harness.stop());

/** Starts an HTTP server inside the sandbox (answering `body`) and waits until ingress reaches it. */
async function serveInside(
  sandbox: Sandbox,
  {
    port,
    address = '127.0.0.1',
    body = 'inside',
  }: { port?: number; address?: string; body?: string } = {},
): Promise<number> {
  const chosen = port ?? (await freePort());
  await sandbox.commands.run(
    `node -e "require('http').createServer((q,s)=>s.end('${body}')).listen(${chosen},'${address}')"`,
    { background: true },
  );
  await expect
    .poll(async () => (await viaHost(harness.sandboxUrl, sandbox.getHost(chosen))).body, {
      timeout: 15_000,
    })
    .toBe(body);
  return chosen;
}

describe('ingress in proxy mode', () => {
  it("reaches a port the sandbox's own process listens on", async () => {
    const sandbox = await harness.sandbox();
    const port = await serveInside(sandbox);
    const reply = await viaHost(harness.sandboxUrl, sandbox.getHost(port));
    expect(reply).toMatchObject({ status: 200, body: 'inside' });
  });

  it('a server answers again after pause and resume (E2B’s http server test, by Host)', async () => {
    const sandbox = await harness.sandbox();
    const port = await serveInside(sandbox, { body: 'kept' });
    await sandbox.pause();
    expect(await sandbox.isRunning()).toBe(false);
    await sandbox.connect();
    const reply = await viaHost(harness.sandboxUrl, sandbox.getHost(port));
    expect(reply).toMatchObject({ status: 200, body: 'kept' });
  });

  it('refuses a service of the host that no process of the sandbox runs', async () => {
    const sandbox = await harness.sandbox();
    const seen: string[] = [];
    const host = http.createServer((request, response) => {
      seen.push(request.url ?? '');
      response.end('host service');
    });
    await new Promise<void>((resolve) => host.listen(0, '127.0.0.1', resolve));
    try {
      const { port } = host.address() as net.AddressInfo;
      const reply = await viaHost(harness.sandboxUrl, sandbox.getHost(port));
      expect(reply.status).toBe(502);
      expect(JSON.parse(reply.body).message).toBe(
        `no process of sandbox ${sandbox.sandboxId} listens on port ${port}`,
      );
      expect(seen).toEqual([]);
    } finally {
      await new Promise((resolve) => host.close(resolve));
    }
  });

  it("refuses Moat's own listeners, by Host and by the E2b-Sandbox-Port header", async () => {
    const sandbox = await harness.sandbox();
    const { api, sandbox: own, proxy } = harness.moat.listening;
    for (const port of [api.port, own.port, proxy.port]) {
      const byHost = await viaHost(harness.sandboxUrl, sandbox.getHost(port));
      expect(byHost.status, `port ${port}`).toBe(502);
      const byHeader = await viaHost(harness.sandboxUrl, 'anything.test', {
        headers: { 'E2b-Sandbox-Id': sandbox.sandboxId, 'E2b-Sandbox-Port': String(port) },
      });
      expect(byHeader.status, `port ${port}`).toBe(502);
    }
  });

  it("refuses a port another sandbox's process listens on", async () => {
    const [mine, other] = await Promise.all([harness.sandbox(), harness.sandbox()]);
    const port = await serveInside(other);
    expect((await viaHost(harness.sandboxUrl, mine.getHost(port))).status).toBe(502);
  });

  it('reaches its own listener on ::1 even when another sandbox squats 127.0.0.1 on that port', async () => {
    const [victim, squatter] = await Promise.all([harness.sandbox(), harness.sandbox()]);
    const port = await serveInside(squatter, { body: 'squatter' });
    await serveInside(victim, { port, address: '::1', body: 'victim' });
    for (let i = 0; i < 5; i++) {
      expect((await viaHost(harness.sandboxUrl, victim.getHost(port))).body).toBe('victim');
      expect((await viaHost(harness.sandboxUrl, squatter.getHost(port))).body).toBe('squatter');
    }
  });
});
