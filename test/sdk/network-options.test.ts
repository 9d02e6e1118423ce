/**
 * The e2b SDK's `network.egressProxy` and `network.httpsPorts` on the wire: what create sends and
 * getInfo reads back, and ingress to a sandbox port that serves TLS with a self-signed
 * certificate (reached over TLS, the certificate not verified, as E2B's proxy does).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { testCertificate } from '../../bench/lib/certificate.js';
import { type SdkMoat, startSdkMoat, viaHost } from '../support/sdk-moat.js';
import { freePort } from '../support/local-host.js';

let harness: SdkMoat;
beforeAll(async () => {
  harness = await startSdkMoat({ flags: { enforcement: 'proxy' } });
});
afterAll(() => harness.stop());

describe('network options through the SDK', () => {
  it('sends egressProxy and httpsPorts on create; getInfo shows them, without the password', async () => {
    const sandbox = await harness.sandbox({
      network: {
        egressProxy: { address: '198.18.0.1:1080', username: 'user', password: 'sdk-secret' },
        httpsPorts: [8443],
      },
    });
    const info = await sandbox.getInfo();
    expect(info.network?.egressProxy).toEqual({ address: '198.18.0.1:1080', username: 'user' });
    expect(info.network?.httpsPorts).toEqual([8443]);
    await sandbox.updateNetwork({ egressProxy: { address: '198.18.0.2:1080' } });
    expect((await sandbox.getInfo()).network?.egressProxy).toEqual({
      address: '198.18.0.2:1080',
    });
    // The update replaces the whole configuration: leaving the proxy out clears it.
    await sandbox.updateNetwork({ allowOut: [] });
    expect((await sandbox.getInfo()).network?.egressProxy).toBeUndefined();
  });

  it("refuses the sandbox API's own port in httpsPorts", async () => {
    await expect(harness.sandbox({ network: { httpsPorts: [49983] } })).rejects.toThrow(
      /httpsPorts cannot list 49983/,
    );
  });

  it('reaches a TLS port with a self-signed certificate over TLS; other ports stay plain', async () => {
    const [tlsPort, plainPort] = [await freePort(), await freePort()];
    const sandbox = await harness.sandbox({ network: { httpsPorts: [tlsPort] } });
    const { key, cert } = testCertificate();
    await sandbox.files.write('/home/user/key.pem', key.toString());
    await sandbox.files.write('/home/user/cert.pem', cert.toString());
    const server = (module: string, port: number, body: string, options: string) =>
      `node -e "require('${module}').createServer(${options}(q,s)=>s.end('${body} '+q.headers.host)).listen(${port},'127.0.0.1')"`;
    await sandbox.commands.run(
      server(
        'https',
        tlsPort,
        'tls',
        "{key:require('fs').readFileSync('/home/user/key.pem'),cert:require('fs').readFileSync('/home/user/cert.pem')},",
      ),
      { background: true },
    );
    await sandbox.commands.run(server('http', plainPort, 'plain', ''), { background: true });
    const host = sandbox.getHost(tlsPort);
    await expect
      .poll(async () => (await viaHost(harness.sandboxUrl, host)).body, { timeout: 15_000 })
      .toBe(`tls ${host}`);
    const plainHost = sandbox.getHost(plainPort);
    await expect
      .poll(async () => (await viaHost(harness.sandboxUrl, plainHost)).body, { timeout: 15_000 })
      .toBe(`plain ${plainHost}`);
  });
});
