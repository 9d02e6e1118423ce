/**
 * Certificates for tests and benchmarks, made with the openssl CLI: one self-signed certificate
 * per run, and throwaway certificate authorities with leaves for names.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

let certificate: { key: Buffer; cert: Buffer } | undefined;

/** A throwaway self-signed certificate (made once per run with openssl). */
export function testCertificate(): { key: Buffer; cert: Buffer } {
  if (certificate) return certificate;
  const dir = mkdtempSync(join(tmpdir(), 'moat-cert-'));
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-days',
      '1',
      '-subj',
      '/CN=moat-test',
      '-keyout',
      join(dir, 'key.pem'),
      '-out',
      join(dir, 'cert.pem'),
    ],
    { stdio: 'ignore' },
  );
  certificate = {
    key: readFileSync(join(dir, 'key.pem')),
    cert: readFileSync(join(dir, 'cert.pem')),
  };
  // Kept in memory from here; the files are not needed again.
  rmSync(dir, { recursive: true, force: true });
  return certificate;
}

/** A key and certificate in PEM. */
export interface KeyPair {
  readonly key: string;
  readonly cert: string;
}

/**
 * A throwaway certificate authority made with the openssl CLI (real certificates, ECDSA P-256):
 * leaves for names, expired ones, and self-signed ones for origins Moat must not trust.
 */
export class TestCa {
  private readonly dir = mkdtempSync(join(tmpdir(), 'moat-test-ca-'));
  private serial = 0;
  readonly cert: string;

  constructor(readonly subject: string) {
    this.selfSign(subject, 'ca', [
      'basicConstraints=critical,CA:TRUE',
      'keyUsage=critical,keyCertSign,cRLSign',
    ]);
    this.cert = readFileSync(this.path('ca.pem'), 'utf8');
    writeFileSync(this.path('index.txt'), '');
    writeFileSync(this.path('serial'), '01\n');
    writeFileSync(
      this.path('ca.cnf'),
      [
        '[ca]',
        'default_ca = test',
        '[test]',
        `dir = ${this.dir}`,
        `database = ${this.path('index.txt')}`,
        `serial = ${this.path('serial')}`,
        `new_certs_dir = ${this.dir}`,
        'default_md = sha256',
        'policy = any',
        'unique_subject = no',
        '[any]',
        'commonName = supplied',
        '',
      ].join('\n'),
    );
  }

  /** A leaf for `names` (DNS SANs); `expired`: valid for one day in 2020. */
  issue(names: readonly string[], options: { expired?: boolean } = {}): KeyPair {
    const id = `leaf${++this.serial}`;
    this.openssl([
      'req',
      '-new',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-subj',
      `/CN=${names[0]}`,
      '-keyout',
      this.path(`${id}.key`),
      '-out',
      this.path(`${id}.csr`),
    ]);
    writeFileSync(
      this.path(`${id}.ext`),
      `subjectAltName=${names.map((n) => `DNS:${n}`).join(',')}\nextendedKeyUsage=serverAuth\n`,
    );
    const dates = options.expired
      ? ['-startdate', '20200101000000Z', '-enddate', '20200102000000Z']
      : ['-days', '2'];
    this.openssl([
      'ca',
      '-batch',
      '-notext',
      '-config',
      this.path('ca.cnf'),
      '-cert',
      this.path('ca.pem'),
      '-keyfile',
      this.path('ca.key'),
      '-in',
      this.path(`${id}.csr`),
      '-out',
      this.path(`${id}.pem`),
      '-extfile',
      this.path(`${id}.ext`),
      ...dates,
    ]);
    return {
      key: readFileSync(this.path(`${id}.key`), 'utf8'),
      cert: readFileSync(this.path(`${id}.pem`), 'utf8'),
    };
  }

  /** A self-signed certificate for `name` (no CA vouches for it). */
  selfSigned(name: string): KeyPair {
    const id = `self${++this.serial}`;
    this.selfSign(name, id, [`subjectAltName=DNS:${name}`]);
    return {
      key: readFileSync(this.path(`${id}.key`), 'utf8'),
      cert: readFileSync(this.path(`${id}.pem`), 'utf8'),
    };
  }

  /** Writes the CA certificate to a file (for curl --cacert, --upstream-ca). */
  certFile(): string {
    return this.path('ca.pem');
  }

  /** The CA's private key file, PKCS #8 PEM (for a proxy that signs with this CA). */
  keyFile(): string {
    return this.path('ca.key');
  }

  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** A new P-256 key and a certificate for it signed by itself, as `<id>.key` and `<id>.pem`. */
  private selfSign(subject: string, id: string, extensions: readonly string[]): void {
    this.openssl([
      ...['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'],
      ...['-days', '2', '-subj', `/CN=${subject}`],
      ...extensions.flatMap((extension) => ['-addext', extension]),
      ...['-keyout', this.path(`${id}.key`), '-out', this.path(`${id}.pem`)],
    ]);
  }

  private path(name: string): string {
    return join(this.dir, name);
  }

  private openssl(args: readonly string[]): void {
    execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'], timeout: 20_000 });
  }
}
