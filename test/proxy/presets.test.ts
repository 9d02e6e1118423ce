/**
 * A preset decided at a real door: a sandbox created through the API with
 * `allowOut: ["preset:pypi"]` reaches files.pythonhosted.org through Moat's proxy (names from a
 * fake DNS zone, the origin on loopback) and is refused example.test; the flow records name the
 * preset and its entry.
 */
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ApiMoat, startApiMoat } from '../support/api-client.js';
import { connectThrough } from '../support/origins.js';

let harness: ApiMoat;
let origin: net.Server;
let originPort: number;

beforeAll(async () => {
  origin = net.createServer((socket) => {
    socket.on('error', () => socket.destroy());
    socket.pipe(socket);
  });
  await new Promise<void>((resolve) => origin.listen(0, '127.0.0.1', resolve));
  originPort = (origin.address() as net.AddressInfo).port;
  harness = await startApiMoat(
    new Map([
      ['files.pythonhosted.org', { A: ['127.0.0.1'] }],
      ['example.test', { A: ['127.0.0.1'] }],
    ]),
    // The origin is this host's: its port is opened as an operator would.
    { enforcement: 'proxy', 'internal-deny': 'none', 'allow-host-ports': String(originPort) },
  );
});

afterAll(async () => {
  await harness?.stop();
  origin?.close();
});

describe('preset:pypi at the proxy', () => {
  it('allows files.pythonhosted.org, denies example.test, and the flows name the preset', async () => {
    const { sandboxID } = await harness.api.sandbox({
      network: { allowOut: ['preset:pypi'], denyOut: ['0.0.0.0/0'] },
    });
    const { egressSecret } = await harness.moat.sandboxes.get(sandboxID);
    const connect = (host: string) =>
      connectThrough(harness.moat.listening.proxy, `${host}:${originPort}`, {
        auth: `${sandboxID}:${egressSecret}`,
      });

    const allowed = await connect('files.pythonhosted.org');
    expect(allowed.status).toBe(200);
    // Bytes that cannot begin an HTTP request: the tunnel carries them without waiting for more.
    allowed.socket.write('{"ping":1}');
    const echoed = await new Promise<string>((resolve) => {
      allowed.socket.once('data', (chunk: Buffer) => resolve(chunk.toString()));
      allowed.socket.resume();
    });
    allowed.socket.destroy();
    expect(echoed).toBe('{"ping":1}');

    const denied = await connect('example.test');
    denied.socket.destroy();
    expect(denied.status).toBe(403);
    expect(denied.body).toContain('0.0.0.0/0');

    const flows = await harness.api.get(`/flows?sandboxID=${sandboxID}`);
    expect(flows.status, flows.text).toBe(200);
    const rules = (flows.body as Array<{ verdict: string; rule: string | null }>).map(
      (flow) => `${flow.verdict} ${flow.rule}`,
    );
    expect(rules).toContain('allow preset:pypi (files.pythonhosted.org)');
    expect(rules).toContain('deny 0.0.0.0/0');
  });
});
