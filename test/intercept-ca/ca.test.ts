/**
 * Moat's CA: the files an operator (or an attacker who can write them) gives it, the leaves it
 * mints (checked by Node's own TLS client against the CA alone), the names it refuses, the
 * cache's bound and its single mint per name.
 */
import { execFileSync } from 'node:child_process';
import { createPrivateKey, X509Certificate } from 'node:crypto';
import { chmodSync, mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { checkLeafName, LeafRefused, MoatCa } from '../../src/intercept-ca/index.js';

const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-ca-'));
afterAll(() => execFileSync('rm', ['-rf', scratch]));

function openssl(...args: string[]): void {
  execFileSync('openssl', args, { stdio: 'pipe' });
}

async function open(options: Partial<Parameters<typeof MoatCa.open>[0]> = {}): Promise<MoatCa> {
  const result = await MoatCa.open({
    dataDir: path.join(scratch, 'data'),
    owner: 'test',
    ...options,
  });
  if (!result.ok) throw new Error(result.error);
  return result.value;
}

/** A TLS server answering every name with `ca`'s leaf; the client checks against `ca` alone. */
async function handshake(
  ca: MoatCa,
  name: string,
): Promise<{ authorized: boolean; error: string | undefined; peer: X509Certificate }> {
  const server = tls.createServer(
    {
      SNICallback: (servername, done) =>
        ca.secureContextFor(servername).then((context) => done(null, context), done),
    },
    (socket) => socket.end(),
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  try {
    return await new Promise((resolve, reject) => {
      const socket = tls.connect(
        {
          host: '127.0.0.1',
          port,
          servername: name,
          ca: ca.certificatePem,
          rejectUnauthorized: false,
        },
        () => {
          resolve({
            authorized: socket.authorized,
            error: socket.authorizationError?.toString(),
            peer: socket.getPeerX509Certificate()!,
          });
          socket.destroy();
        },
      );
      socket.on('error', reject);
    });
  } finally {
    server.close();
  }
}

describe('the generated CA', () => {
  let ca: MoatCa;
  beforeAll(async () => {
    ca = await open();
  });

  test('is made in <data>/ca, the folder 0700 and the key 0600, and named for its owner', () => {
    const folder = path.join(scratch, 'data', 'ca');
    expect(statSync(folder).mode & 0o777).toBe(0o700);
    expect(statSync(path.join(folder, 'ca-key.pem')).mode & 0o777).toBe(0o600);
    const certificate = new X509Certificate(readFileSync(path.join(folder, 'ca.pem')));
    expect(certificate.subject).toContain('CN=Moat egress CA test');
    expect(certificate.ca).toBe(true);
    expect(certificate.publicKey.asymmetricKeyDetails?.namedCurve).toBe('prime256v1');
    expect(ca.certificatePem).toBe(readFileSync(path.join(folder, 'ca.pem'), 'utf8'));
  });

  test('is the same CA at the next start, and its key is made 0600 again if widened', async () => {
    const keyFile = path.join(scratch, 'data', 'ca', 'ca-key.pem');
    chmodSync(keyFile, 0o644);
    const again = await open();
    expect(again.certificatePem).toBe(ca.certificatePem);
    expect(statSync(keyFile).mode & 0o777).toBe(0o600);
  });

  test('a missing half is an error naming it, never a silent new CA', async () => {
    const dataDir = path.join(scratch, 'half');
    await open({ dataDir });
    execFileSync('rm', [path.join(dataDir, 'ca', 'ca-key.pem')]);
    const result = await MoatCa.open({ dataDir, owner: 'test' });
    expect(result.ok).toBe(false);
    expect(!result.ok && result.error).toContain(path.join(dataDir, 'ca', 'ca-key.pem'));
  });

  test('a leaf verifies against the CA alone: exact SAN, ECDSA P-256, about 24 h', async () => {
    const before = Date.now();
    const { authorized, error, peer } = await handshake(ca, 'api.example.com');
    expect(error).toBeUndefined();
    expect(authorized).toBe(true);
    expect(peer.subjectAltName).toBe('DNS:api.example.com');
    expect(peer.ca).toBe(false);
    expect(peer.publicKey.asymmetricKeyDetails?.namedCurve).toBe('prime256v1');
    expect(peer.checkIssued(new X509Certificate(ca.certificatePem))).toBe(true);
    const from = Date.parse(peer.validFrom);
    const to = Date.parse(peer.validTo);
    expect(from).toBeLessThanOrEqual(before);
    expect(before - from).toBeLessThan(10 * 60_000);
    expect(to - before).toBeGreaterThan(23 * 3_600_000);
    expect(to - before).toBeLessThanOrEqual(24 * 3_600_000 + 1000);
  });

  test('a leaf for one name is refused for another (no hostname confusion)', async () => {
    const leaf = (await handshake(ca, 'a.example.com')).peer;
    expect(leaf.checkHost('a.example.com')).toBe('a.example.com');
    expect(leaf.checkHost('b.example.com')).toBeUndefined();
    expect(leaf.checkHost('x.a.example.com')).toBeUndefined();
  });

  test('leaves of two names have different keys and serials', async () => {
    const [a, b] = await Promise.all([
      handshake(ca, 'k1.example.com'),
      handshake(ca, 'k2.example.com'),
    ]);
    expect(a.peer.serialNumber).not.toBe(b.peer.serialNumber);
    expect(a.peer.publicKey.export({ format: 'der', type: 'spki' })).not.toEqual(
      b.peer.publicKey.export({ format: 'der', type: 'spki' }),
    );
  });
});

describe('names a leaf is never minted for', () => {
  const refused: Array<[string, string]> = [
    ['', 'empty'],
    ['127.0.0.1', 'IPv4 address'],
    ['10.0.0.1', 'private address'],
    ['::1', 'IPv6 address'],
    ['[::1]', 'bracketed IPv6'],
    ['*.example.com', 'wildcard'],
    ['*', 'bare wildcard'],
    ['a.*.example.com', 'inner wildcard'],
    ['Example.com', 'upper case'],
    ['example.com.', 'trailing dot'],
    ['.example.com', 'empty first label'],
    ['a..example.com', 'empty inner label'],
    ['-a.example.com', 'leading hyphen'],
    ['a-.example.com', 'trailing hyphen'],
    ['a_b.example.com', 'underscore'],
    ['a b.example.com', 'space'],
    ['exa\u0000mple.com', 'NUL'],
    ['bücher.example', 'U-label (not canonical A-label)'],
    [`${'a'.repeat(64)}.example.com`, 'label over 63'],
    [`${'a.'.repeat(127)}com`, 'name over 253'],
    ['example.123', 'numeric top label'],
  ];

  test.each(refused)('%j (%s) is refused with a LeafRefused naming it', async (name) => {
    const ca = await open();
    const before = ca.leafStats.minted;
    const error = await ca.secureContextFor(name).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(LeafRefused);
    expect((error as Error).message).toContain('no certificate for');
    expect(ca.leafStats.minted).toBe(before);
  });

  test.each([
    'localhost',
    'a.b',
    'xn--bcher-kva.example',
    `${'a'.repeat(63)}.example.com`,
    '0x7f000001',
  ])('%j is a DNS name and is accepted', (name) => {
    expect(checkLeafName(name).ok).toBe(true);
  });

  test('any name that contains an IP address form, a star or upper case is refused', () => {
    const octet = fc.integer({ min: 0, max: 255 });
    fc.assert(
      fc.property(fc.tuple(octet, octet, octet, octet), (parts) => {
        expect(checkLeafName(parts.join('.')).ok).toBe(false);
      }),
    );
    fc.assert(
      fc.property(fc.string({ maxLength: 300 }), (text) => {
        const result = checkLeafName(text);
        if (result.ok) {
          expect(text).toMatch(/^[a-z0-9.-]{1,253}$/);
          expect(text).not.toMatch(/^\.|\.\.|\.$/);
        }
      }),
      { numRuns: 2000 },
    );
  });
});

describe('the leaf cache', () => {
  test('concurrent requests for one name mint once; a second wave is all hits', async () => {
    const ca = await open();
    const contexts = await Promise.all(
      Array.from({ length: 50 }, () => ca.secureContextFor('one.example.com')),
    );
    expect(new Set(contexts).size).toBe(1);
    expect(ca.leafStats.minted).toBe(1);
    await Promise.all(Array.from({ length: 50 }, () => ca.secureContextFor('one.example.com')));
    expect(ca.leafStats).toMatchObject({ minted: 1, hits: 50, cached: 1 });
  });

  test('holds at most its bound, dropping the least recently used', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.integer({ min: 0, max: 9 }), { minLength: 1, maxLength: 40 }),
        async (sequence) => {
          const ca = await open({ leafCacheSize: 4 });
          const recent: number[] = [];
          for (const n of sequence) {
            const hitsBefore = ca.leafStats.hits;
            await ca.secureContextFor(`n${n}.example.com`);
            // A hit exactly when the name is among the 4 most recently used.
            expect(ca.leafStats.hits - hitsBefore).toBe(recent.slice(-4).includes(n) ? 1 : 0);
            if (recent.includes(n)) recent.splice(recent.indexOf(n), 1);
            recent.push(n);
            expect(ca.leafStats.cached).toBeLessThanOrEqual(4);
          }
        },
      ),
      { numRuns: 30 },
    );
  });

  test('a leaf is renewed before it expires', async () => {
    let clock = Date.now();
    const ca = await open({ now: () => clock, leafLifetimeMs: 3_600_000 });
    const first = await ca.secureContextFor('renew.example.com');
    clock += 30 * 60_000;
    expect(await ca.secureContextFor('renew.example.com')).toBe(first);
    clock += 20 * 60_000; // 50 minutes: past three quarters of an hour
    expect(await ca.secureContextFor('renew.example.com')).not.toBe(first);
    expect(ca.leafStats.minted).toBe(2);
  });
});

describe("the operator's CA files", () => {
  const dir = path.join(scratch, 'operator');
  const file = (name: string) => path.join(dir, name);
  beforeAll(() => {
    execFileSync('mkdir', ['-p', dir]);
    // A good P-256 CA, a second key, a leaf (not a CA), a CA without keyCertSign, an Ed25519 CA.
    openssl('ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', file('ca-key.pem'));
    openssl('ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', file('other-key.pem'));
    const ca = (out: string, key: string, ...ext: string[]) =>
      openssl(
        'req',
        '-x509',
        '-new',
        '-key',
        file(key),
        '-subj',
        '/CN=Operator CA',
        '-days',
        '30',
        '-out',
        file(out),
        ...ext,
      );
    ca(
      'ca.pem',
      'ca-key.pem',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    );
    ca(
      'leaf.pem',
      'ca-key.pem',
      '-addext',
      'basicConstraints=critical,CA:FALSE',
      '-addext',
      'keyUsage=critical,digitalSignature',
    );
    ca(
      'no-certsign.pem',
      'ca-key.pem',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,digitalSignature',
    );
    openssl('genpkey', '-algorithm', 'ed25519', '-out', file('ed-key.pem'));
    openssl(
      'req',
      '-x509',
      '-new',
      '-key',
      file('ed-key.pem'),
      '-subj',
      '/CN=Ed CA',
      '-days',
      '30',
      '-out',
      file('ed.pem'),
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign',
    );
    writeFileSync(file('garbage.pem'), 'not a certificate\n');
    writeFileSync(file('unreadable.pem'), '');
    chmodSync(file('unreadable.pem'), 0o000);
  });

  test('a good P-256 CA loads and its leaves verify against it', async () => {
    const ca = await open({ certFile: file('ca.pem'), keyFile: file('ca-key.pem') });
    expect(ca.description).toContain(file('ca.pem'));
    const { authorized, peer } = await handshake(ca, 'op.example.com');
    expect(authorized).toBe(true);
    expect(peer.issuer).toContain('CN=Operator CA');
  });

  const cases: Array<[string, string | undefined, string | undefined, string]> = [
    ['certificate without key', 'ca.pem', undefined, 'without its key'],
    ['key without certificate', undefined, 'ca-key.pem', 'without its certificate'],
    ['missing certificate', 'absent.pem', 'ca-key.pem', 'absent.pem cannot be read: ENOENT'],
    ['missing key', 'ca.pem', 'absent-key.pem', 'absent-key.pem cannot be read: ENOENT'],
    ['not PEM', 'garbage.pem', 'ca-key.pem', 'garbage.pem holds no PEM X.509 certificate'],
    [
      'a key as the certificate',
      'ca-key.pem',
      'ca-key.pem',
      'ca-key.pem holds no PEM X.509 certificate',
    ],
    [
      'a leaf, not a CA',
      'leaf.pem',
      'ca-key.pem',
      'leaf.pem is not a CA certificate (basicConstraints',
    ],
    [
      'a CA that may not sign certificates',
      'no-certsign.pem',
      'ca-key.pem',
      'keyCertSign is missing',
    ],
    ['expired (60 days on)', 'ca.pem', 'ca-key.pem', 'ca.pem expired on'],
    [
      'key of another CA',
      'ca.pem',
      'other-key.pem',
      'other-key.pem does not match the certificate in',
    ],
    ['a certificate as the key', 'ca.pem', 'ca.pem', 'ca.pem is not a PEM private key'],
    ['an Ed25519 CA', 'ed.pem', 'ed-key.pem', 'ed-key.pem is a ed25519 key'],
  ];
  test.each(cases)('%s: refused, naming the file', async (what, cert, key, message) => {
    const result = await MoatCa.open({
      dataDir: path.join(scratch, 'never'),
      owner: 'test',
      now: () => Date.now() + (what.startsWith('expired') ? 60 * 86_400_000 : 0),
      certFile: cert && file(cert),
      keyFile: key && file(key),
    });
    expect(result.ok).toBe(false);
    expect(!result.ok && result.error).toContain(message);
    // The key's text never appears in what is reported.
    const keyBody = readFileSync(file('ca-key.pem'), 'utf8').split('\n')[1]!;
    expect(!result.ok && result.error).not.toContain(keyBody.slice(0, 20));
  });

  test('an unreadable certificate is named (when not root, who reads anything)', async () => {
    if (process.getuid?.() === 0) return;
    const result = await MoatCa.open({
      dataDir: scratch,
      owner: 'test',
      certFile: file('unreadable.pem'),
      keyFile: file('ca-key.pem'),
    });
    expect(!result.ok && result.error).toContain('unreadable.pem cannot be read: EACCES');
  });

  test('an RSA operator CA signs leaves too', async () => {
    openssl(
      'genpkey',
      '-algorithm',
      'RSA',
      '-pkeyopt',
      'rsa_keygen_bits:2048',
      '-out',
      file('rsa-key.pem'),
    );
    openssl(
      'req',
      '-x509',
      '-new',
      '-key',
      file('rsa-key.pem'),
      '-subj',
      '/CN=RSA CA',
      '-days',
      '30',
      '-out',
      file('rsa.pem'),
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign',
    );
    const ca = await open({ certFile: file('rsa.pem'), keyFile: file('rsa-key.pem') });
    expect((await handshake(ca, 'rsa.example.com')).authorized).toBe(true);
    expect(createPrivateKey(readFileSync(file('rsa-key.pem'))).asymmetricKeyType).toBe('rsa');
  });
});
