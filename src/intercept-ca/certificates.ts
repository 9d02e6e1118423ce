/**
 * X.509 writing (Node has a reader, no writer): the CA's self-signed certificate and the leaves
 * it signs, through @peculiar/x509 on Node's WebCrypto. Every key made here is ECDSA P-256.
 */
// @peculiar/x509's dependency injection needs the Reflect metadata API before it loads.
import 'reflect-metadata';
import { type KeyObject, randomBytes, webcrypto } from 'node:crypto';

type CryptoKey = webcrypto.CryptoKey;
type CryptoKeyPair = webcrypto.CryptoKeyPair;
import * as x509 from '@peculiar/x509';

x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

const { subtle } = webcrypto;
const P256 = { name: 'ECDSA', namedCurve: 'P-256' } as const;

/** A key that signs certificates, with the algorithm its signatures use. */
export interface SigningKey {
  readonly privateKey: CryptoKey;
  readonly algorithm: webcrypto.Algorithm | webcrypto.EcdsaParams;
}

export interface MintedCertificate {
  readonly certificatePem: string;
  /** PKCS #8 PEM. */
  readonly keyPem: string;
}

const pem = (label: string, der: ArrayBuffer): string =>
  `-----BEGIN ${label}-----\n${Buffer.from(der)
    .toString('base64')
    .replace(/.{1,64}/g, '$&\n')}-----END ${label}-----\n`;

/** 16 random bytes, the first below 0x80 and above 0 so that DER keeps them positive and whole. */
function serialNumber(): string {
  const bytes = randomBytes(16);
  bytes[0] = (bytes[0]! & 0x7f) | 0x01;
  return bytes.toString('hex');
}

async function newKeyPair(): Promise<CryptoKeyPair> {
  return (await subtle.generateKey(P256, true, ['sign', 'verify'])) as CryptoKeyPair;
}

async function keyPem(key: CryptoKey): Promise<string> {
  return pem('PRIVATE KEY', await subtle.exportKey('pkcs8', key));
}

/**
 * A private key read by Node as one WebCrypto can sign with: ECDSA P-256 or P-384, or RSA
 * (PKCS #1 v1.5, SHA-256). Undefined for any other kind of key.
 */
export async function signingKeyOf(key: KeyObject): Promise<SigningKey | undefined> {
  const der = key.export({ format: 'der', type: 'pkcs8' });
  if (key.asymmetricKeyType === 'ec') {
    const curve = { prime256v1: 'P-256', secp384r1: 'P-384' }[
      key.asymmetricKeyDetails?.namedCurve ?? ''
    ];
    if (curve === undefined) return undefined;
    const privateKey = await subtle.importKey(
      'pkcs8',
      der,
      { name: 'ECDSA', namedCurve: curve },
      false,
      ['sign'],
    );
    return {
      privateKey,
      algorithm: { name: 'ECDSA', hash: curve === 'P-256' ? 'SHA-256' : 'SHA-384' },
    };
  }
  if (key.asymmetricKeyType === 'rsa') {
    const algorithm = { name: 'RSASSA-PKCS1-v1_5', hash: 'SHA-256' };
    const privateKey = await subtle.importKey('pkcs8', der, algorithm, false, ['sign']);
    return { privateKey, algorithm };
  }
  return undefined;
}

/** A new self-signed CA: may sign leaves only (path length 0), valid `lifetimeMs` from `now`. */
export async function mintCa(
  commonName: string,
  now: number,
  lifetimeMs: number,
): Promise<MintedCertificate> {
  const keys = await newKeyPair();
  const certificate = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serialNumber(),
    name: [{ CN: [commonName] }, { O: ['Moat'] }],
    // Backdated: a sandbox whose clock lags the host's still accepts it.
    notBefore: new Date(now - 3_600_000),
    notAfter: new Date(now + lifetimeMs),
    keys,
    signingAlgorithm: { name: 'ECDSA', hash: 'SHA-256' },
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(
        x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign,
        true,
      ),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return {
    certificatePem: `${certificate.toString('pem')}\n`,
    keyPem: await keyPem(keys.privateKey),
  };
}

/** What a leaf's issuer is: the CA certificate and its signing key. */
export interface Issuer {
  readonly certificate: x509.X509Certificate;
  readonly key: SigningKey;
  /** The CA's key identifier, named in every leaf (authorityKeyIdentifier). */
  readonly keyId: string | undefined;
}

export function issuerKeyId(certificate: x509.X509Certificate): string | undefined {
  return certificate.getExtension(x509.SubjectKeyIdentifierExtension)?.keyId;
}

/** A server certificate for `name` alone (SAN dNSName), with a fresh key, valid `from`-`to`. */
export async function mintLeaf(
  issuer: Issuer,
  name: string,
  from: Date,
  to: Date,
): Promise<MintedCertificate> {
  const keys = await newKeyPair();
  const certificate = await x509.X509CertificateGenerator.create({
    serialNumber: serialNumber(),
    // X.520 bounds a common name at 64 characters; the SAN is what clients check.
    subject: name.length <= 64 ? [{ CN: [name] }] : [{ O: ['Moat egress'] }],
    issuer: issuer.certificate.subjectName,
    notBefore: from,
    notAfter: to,
    publicKey: keys.publicKey,
    signingKey: issuer.key.privateKey,
    signingAlgorithm: issuer.key.algorithm,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.SubjectAlternativeNameExtension([{ type: 'dns', value: name }]),
      ...(issuer.keyId === undefined
        ? []
        : [new x509.AuthorityKeyIdentifierExtension(issuer.keyId)]),
    ],
  });
  return {
    certificatePem: `${certificate.toString('pem')}\n`,
    keyPem: await keyPem(keys.privateKey),
  };
}

/** What a certificate says about signing others: basicConstraints CA and keyUsage keyCertSign. */
export function signingRights(certificate: x509.X509Certificate): {
  readonly ca: boolean;
  readonly keyCertSign: boolean;
} {
  const usage = certificate.getExtension(x509.KeyUsagesExtension)?.usages ?? 0;
  return {
    ca: certificate.getExtension(x509.BasicConstraintsExtension)?.ca === true,
    keyCertSign: (usage & x509.KeyUsageFlags.keyCertSign) !== 0,
  };
}

export function parseCertificate(pemText: string): x509.X509Certificate {
  return new x509.X509Certificate(pemText);
}
