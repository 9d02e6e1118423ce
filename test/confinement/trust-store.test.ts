/**
 * The sandbox trusts Moat's CA, and nothing a sandbox does changes what it or another sandbox
 * trusts. Real confined sandboxes run curl, Python's ssl and Node against a loopback origin whose
 * certificate Moat's CA minted; a sandbox's root attacks its bundle, and looks for the CA key.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MoatCa } from '../../src/intercept-ca/index.js';
import type { RuntimeSandbox } from '../../src/runtime/index.js';
import { runShell, shell } from '../support/sandbox-shell.js';
import { type Harness, skipReason, startHarness } from './runtime-harness.js';

const skip = skipReason('confinement/trust-store');
const NAME = 'origin.moat.test';
const BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
const HOST_BUNDLE = readFileSync(BUNDLE, 'utf8');

let harness: Harness;
let ca: MoatCa;
let origin: tls.Server;
let port: number;
/** An origin whose certificate another CA (not trusted by sandboxes) minted. */
let stranger: tls.Server;
let strangerPort: number;

async function serve(authority: MoatCa): Promise<[tls.Server, number]> {
  const server = tls.createServer(
    {
      SNICallback: (name, done) =>
        authority.secureContextFor(name).then((context) => done(null, context), done),
    },
    (socket) => {
      socket.on('error', () => undefined);
      socket.once('data', () =>
        socket.end('HTTP/1.1 200 OK\r\ncontent-length: 10\r\nconnection: close\r\n\r\ntrusted-ok'),
      );
    },
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return [server, (server.address() as { port: number }).port];
}

const curl = (at: number, extra = '') =>
  `curl -sS --max-time 10 --noproxy '*' --resolve ${NAME}:${at}:127.0.0.1 ${extra} https://${NAME}:${at}/`;

beforeAll(async () => {
  if (skip) return;
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'moat-trust-'));
  const opened = await MoatCa.open({ dataDir, owner: 'trust-test' });
  if (!opened.ok) throw new Error(opened.error);
  ca = opened.value;
  const other = await MoatCa.open({ dataDir: path.join(dataDir, 'stranger'), owner: 'stranger' });
  if (!other.ok) throw new Error(other.error);
  [origin, port] = await serve(ca);
  [stranger, strangerPort] = await serve(other.value);
  harness = await startHarness({ dataDir, trustedCaPem: ca.certificatePem });
}, 120_000);

afterAll(async () => {
  origin?.close();
  stranger?.close();
  await harness?.close();
});

describe.skipIf(skip)("a sandbox trusts Moat's CA", () => {
  let sandbox: RuntimeSandbox;
  beforeAll(async () => {
    sandbox = await harness.sandbox();
  }, 60_000);

  it('names the bundle in every variable clients read', async () => {
    const env = await shell(sandbox, 'env');
    for (const name of [
      'NODE_EXTRA_CA_CERTS',
      'REQUESTS_CA_BUNDLE',
      'SSL_CERT_FILE',
      'CURL_CA_BUNDLE',
      'GIT_SSL_CAINFO',
      'PIP_CERT',
    ]) {
      expect(env).toContain(`${name}=${BUNDLE}\n`);
    }
  });

  it("sees the host's bundle plus Moat's CA at the Debian paths", async () => {
    const seen = await shell(sandbox, `cat ${BUNDLE}`);
    expect(seen.startsWith(HOST_BUNDLE)).toBe(true);
    expect(seen).toContain(ca.certificatePem.trim());
    expect(await shell(sandbox, 'cat /usr/lib/ssl/cert.pem')).toBe(seen);
  });

  it('curl verifies a leaf of the CA without -k, with the variables and without them', async () => {
    expect(await shell(sandbox, curl(port))).toBe('trusted-ok');
    expect(await shell(sandbox, `env -u CURL_CA_BUNDLE -u SSL_CERT_FILE ${curl(port)}`)).toBe(
      'trusted-ok',
    );
  });

  it('still refuses a certificate of a CA it does not trust', async () => {
    const result = await runShell(sandbox, curl(strangerPort));
    expect(result.code).toBe(60); // CURLE_PEER_FAILED_VERIFICATION
  });

  it("Python's default ssl context verifies it (no variables)", async () => {
    const code = `import socket, ssl
context = ssl.create_default_context()
with context.wrap_socket(socket.create_connection(('127.0.0.1', ${port}), timeout=10), server_hostname='${NAME}') as s:
    print(s.getpeercert()['subjectAltName'])`;
    const out = await shell(sandbox, 'exec env -u SSL_CERT_FILE python3 -c "$1"', { args: [code] });
    expect(out.trim()).toBe(`(('DNS', '${NAME}'),)`);
  });

  it('Node verifies it through NODE_EXTRA_CA_CERTS', async () => {
    const code = `require('https').get({ host: '127.0.0.1', port: ${port}, servername: '${NAME}', headers: { host: '${NAME}' } }, (r) => { r.pipe(process.stdout); }).on('error', (e) => { console.error(e.message); process.exit(3); });`;
    expect(await shell(sandbox, 'exec node -e "$1"', { args: [code] })).toBe('trusted-ok');
  });
});

describe.skipIf(skip)('what the sandbox trusts is not its to change', () => {
  it("root cannot write, replace, remove or unmount the bundle; the next sandbox's is intact", async () => {
    const attacker = await harness.sandbox();
    const attacks = [
      `echo '-----BEGIN CERTIFICATE-----' >> ${BUNDLE}`,
      `: > ${BUNDLE}`,
      `cp /etc/hostname /tmp/x && mv /tmp/x ${BUNDLE}`,
      `rm -f ${BUNDLE}`,
      `umount ${BUNDLE}`,
      `umount -l ${BUNDLE}`,
      `mount -o remount,rw ${BUNDLE}`,
      `mount -o remount,bind,rw ${BUNDLE}`,
      `chmod 666 ${BUNDLE}`,
      `python3 -c "open('${BUNDLE}', 'a').write('x')"`,
    ];
    for (const attack of attacks) {
      const result = await runShell(attacker, attack, { user: 'root' });
      expect(result.code, `${attack} succeeded`).not.toBe(0);
    }
    const mine = await shell(attacker, `sha256sum < ${BUNDLE}`);
    const next = await harness.sandbox();
    const theirs = await shell(next, `sha256sum < ${BUNDLE}`);
    expect(theirs).toBe(mine);
    const expected = createHash('sha256')
      .update(readFileSync(path.join(harness.dataDir, 'trust', 'ca-certificates.crt')))
      .digest('hex');
    expect(theirs.split(' ')[0]).toBe(expected);
    expect(await shell(next, curl(port))).toBe('trusted-ok');
  }, 60_000);

  it("the CA's private key is not reachable from inside, as root or user", async () => {
    const sandbox = await harness.sandbox();
    const keyFile = path.join(harness.dataDir, 'ca', 'ca-key.pem');
    expect(existsSync(keyFile)).toBe(true);
    for (const user of ['root', 'user']) {
      const result = await runShell(sandbox, `cat ${keyFile} ${path.dirname(keyFile)}/*`, { user });
      expect(result.code).not.toBe(0);
      expect(result.stdout).not.toContain('PRIVATE KEY');
      const found = await runShell(
        sandbox,
        `grep -rls -- 'BEGIN PRIVATE KEY' /etc/ssl /tmp /root /home /var 2>/dev/null`,
        { user },
      );
      expect(found.stdout).toBe('');
    }
  }, 60_000);

  it('a snapshot never carries the bundle: a sandbox made from it gets the current CA', async () => {
    const sandbox = await harness.sandbox();
    await shell(sandbox, `cat ${BUNDLE} > /root/copy`, { user: 'root' });
    await harness.runtime.snapshot(sandbox.sandboxID, 'trust-snapshot');
    const layers = path.join(harness.dataDir, 'layers');
    for (const layer of readdirSync(layers)) {
      expect(
        existsSync(path.join(layers, layer, 'etc', 'ssl', 'certs', 'ca-certificates.crt')),
      ).toBe(false);
    }
    const fromSnapshot = await harness.sandbox({}, 'trust-snapshot');
    expect(await shell(fromSnapshot, curl(port))).toBe('trusted-ok');
  }, 120_000);
});
