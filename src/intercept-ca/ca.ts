/**
 * Moat's CA: the certificate authority whose leaves Moat shows a sandbox when it terminates the
 * sandbox's TLS for a rule's destination. Generated once into the data folder, or the
 * operator's own (--ca-cert and --ca-key).
 *
 *   <data>/ca/          0700
 *   <data>/ca/ca.pem    the certificate (what sandboxes trust, GET /ca.pem)
 *   <data>/ca/ca-key.pem  its private key, 0600: whoever holds it can impersonate any origin
 *                         to every sandbox that trusts the CA
 */
import { createPrivateKey, type KeyObject, X509Certificate } from 'node:crypto';
import { chmod, mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import tls from 'node:tls';
import type { Result } from '../policy/index.js';
import {
  type Issuer,
  issuerKeyId,
  mintCa,
  mintLeaf,
  parseCertificate,
  signingKeyOf,
  signingRights,
} from './certificates.js';
import { LeafCache } from './leaf-cache.js';
import { checkLeafName } from './leaf-name.js';

const HOUR_MS = 3_600_000;
const CA_LIFETIME_MS = 10 * 365 * 24 * HOUR_MS;
const CN_MAX = 64;

export interface MoatCaOptions {
  readonly dataDir: string;
  /** The operator's CA (--ca-cert); both or neither with keyFile. */
  readonly certFile?: string | undefined;
  /** Its private key (--ca-key). */
  readonly keyFile?: string | undefined;
  /** Who the generated CA belongs to, in its name: "Moat egress CA <owner>" (node or host). */
  readonly owner: string;
  /** Leaves kept (least recently used go first). */
  readonly leafCacheSize?: number;
  /** How long a leaf is valid from its minting (a few minutes of backdating come on top). */
  readonly leafLifetimeMs?: number;
  readonly now?: () => number;
}

/** A leaf name Moat refuses to mint for (an IP address, a wildcard, not a DNS name...). */
export class LeafRefused extends Error {
  override readonly name = 'LeafRefused';
}

export interface LeafStats {
  /** Leaves minted since start. */
  readonly minted: number;
  /** Requests answered from the cache. */
  readonly hits: number;
  /** Leaves held now. */
  readonly cached: number;
}

const LEAF_BACKDATE_MS = 5 * 60_000;

export class MoatCa {
  private readonly leaves: LeafCache<tls.SecureContext>;

  private constructor(
    private readonly issuer: Issuer,
    /** The CA certificate, PEM: what sandboxes trust. */
    readonly certificatePem: string,
    /** Where it came from, for start-up output. */
    readonly description: string,
    private readonly leafLifetimeMs: number,
    private readonly now: () => number,
    leafCacheSize: number,
  ) {
    this.leaves = new LeafCache(leafCacheSize, now);
  }

  /** Loads the operator's CA, or the one in the data folder, making it there on first start. */
  static async open(options: MoatCaOptions): Promise<Result<MoatCa>> {
    const now = options.now ?? Date.now;
    const { certFile, keyFile } = options;
    if ((certFile === undefined) !== (keyFile === undefined)) {
      return {
        ok: false,
        error:
          certFile === undefined
            ? `CA key ${keyFile} given without its certificate (--ca-cert / MOAT_CA_CERT): give both or neither`
            : `CA certificate ${certFile} given without its key (--ca-key / MOAT_CA_KEY): give both or neither`,
      };
    }
    let files: { certFile: string; keyFile: string; description: string };
    if (certFile !== undefined && keyFile !== undefined) {
      files = { certFile, keyFile, description: `the operator's CA from ${certFile}` };
    } else {
      const made = await ensureGenerated(options.dataDir, options.owner, now());
      if (!made.ok) return made;
      files = made.value;
    }
    const issuer = await loadIssuer(files.certFile, files.keyFile, now());
    if (!issuer.ok) return issuer;
    return {
      ok: true,
      value: new MoatCa(
        issuer.value.issuer,
        issuer.value.pem,
        `${files.description} (${issuer.value.issuer.certificate.subject})`,
        options.leafLifetimeMs ?? 24 * HOUR_MS,
        now,
        options.leafCacheSize ?? 10_000,
      ),
    };
  }

  /**
   * What a TLS server presents for `name` (its SNICallback's answer; ALPN is the server's own):
   * a leaf for exactly that canonical DNS name, minted at most once at a time, cached until
   * it is due for renewal. Rejects with LeafRefused for a name that is not one.
   */
  secureContextFor(name: string): Promise<tls.SecureContext> {
    const checked = checkLeafName(name);
    if (!checked.ok) return Promise.reject(new LeafRefused(checked.error));
    return this.leaves.get(name, async () => {
      const now = this.now();
      // Never past the CA's own end: a client would refuse the chain.
      const notAfter = Math.min(
        now + this.leafLifetimeMs,
        this.issuer.certificate.notAfter.getTime(),
      );
      const leaf = await mintLeaf(
        this.issuer,
        name,
        new Date(now - LEAF_BACKDATE_MS),
        new Date(notAfter),
      );
      return {
        value: tls.createSecureContext({ cert: leaf.certificatePem, key: leaf.keyPem }),
        // Renewed once three quarters of its life are over.
        renewAt: now + (notAfter - now) * 0.75,
      };
    });
  }

  get leafStats(): LeafStats {
    return { minted: this.leaves.mints, hits: this.leaves.hits, cached: this.leaves.size };
  }
}

/** The data folder's CA files, made (whole, or not at all) when there are none. */
async function ensureGenerated(
  dataDir: string,
  owner: string,
  now: number,
): Promise<Result<{ certFile: string; keyFile: string; description: string }>> {
  const folder = path.join(path.resolve(dataDir), 'ca');
  const certFile = path.join(folder, 'ca.pem');
  const keyFile = path.join(folder, 'ca-key.pem');
  const present = await Promise.all(
    [certFile, keyFile].map((file) =>
      stat(file).then(
        () => true,
        () => false,
      ),
    ),
  );
  if (present[0] && present[1]) {
    // Whatever widened them since, the key is Moat's alone again.
    await chmod(folder, 0o700);
    await chmod(keyFile, 0o600);
    return { ok: true, value: { certFile, keyFile, description: `the CA in ${folder}` } };
  }
  if (present[0] || present[1]) {
    return {
      ok: false,
      error: `${present[0] ? keyFile : certFile} is missing beside ${present[0] ? certFile : keyFile}: restore it, or remove ${folder} to make a new CA (sandboxes and images that trust the old one must then be given the new one)`,
    };
  }
  await mkdir(path.dirname(folder), { recursive: true, mode: 0o700 });
  // Made in a staging folder renamed into place: a crash leaves both files or neither.
  const staging = `${folder}.new`;
  await rm(staging, { recursive: true, force: true });
  await mkdir(staging, { mode: 0o700 });
  const name = `Moat egress CA ${owner}`.slice(0, CN_MAX);
  const ca = await mintCa(name, now, CA_LIFETIME_MS);
  await writeFile(path.join(staging, 'ca-key.pem'), ca.keyPem, { mode: 0o600 });
  await writeFile(path.join(staging, 'ca.pem'), ca.certificatePem, { mode: 0o644 });
  await rename(staging, folder);
  return { ok: true, value: { certFile, keyFile, description: `a new CA made in ${folder}` } };
}

async function readText(file: string, what: string): Promise<Result<string>> {
  try {
    return { ok: true, value: await readFile(file, 'utf8') };
  } catch (error) {
    return {
      ok: false,
      error: `${what} ${file} cannot be read: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`,
    };
  }
}

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----/;

/** The CA certificate and key from their files, checked to be a usable CA and one pair. */
async function loadIssuer(
  certFile: string,
  keyFile: string,
  now: number,
): Promise<Result<{ issuer: Issuer; pem: string }>> {
  const certText = await readText(certFile, 'CA certificate');
  if (!certText.ok) return certText;
  const pem = PEM_CERTIFICATE.exec(certText.value)?.[0];
  let node: X509Certificate;
  try {
    if (pem === undefined) throw new Error('no PEM certificate');
    node = new X509Certificate(pem);
  } catch {
    return { ok: false, error: `CA certificate ${certFile} holds no PEM X.509 certificate` };
  }
  const problem = caProblem(node, pem, now);
  if (problem !== undefined) return { ok: false, error: `CA certificate ${certFile} ${problem}` };
  const keyText = await readText(keyFile, 'CA key');
  if (!keyText.ok) return keyText;
  let key: KeyObject;
  try {
    key = createPrivateKey(keyText.value);
  } catch {
    // Node's parse error is not repeated: it could quote part of the file.
    return { ok: false, error: `CA key ${keyFile} is not a PEM private key (or it is encrypted)` };
  }
  if (!node.checkPrivateKey(key)) {
    return { ok: false, error: `CA key ${keyFile} does not match the certificate in ${certFile}` };
  }
  const signing = await signingKeyOf(key);
  if (signing === undefined) {
    return {
      ok: false,
      error: `CA key ${keyFile} is a ${key.asymmetricKeyType} key; Moat signs with ECDSA P-256 or P-384, or RSA`,
    };
  }
  const certificate = parseCertificate(pem!);
  return {
    ok: true,
    value: {
      issuer: { certificate, key: signing, keyId: issuerKeyId(certificate) },
      pem: `${pem!}\n`,
    },
  };
}

/** Why this certificate cannot sign leaves now, or undefined. */
function caProblem(node: X509Certificate, pem: string, now: number): string | undefined {
  const rights = signingRights(parseCertificate(pem));
  if (!rights.ca) return 'is not a CA certificate (basicConstraints CA:true is missing)';
  if (!rights.keyCertSign) return 'is not a CA certificate (keyUsage keyCertSign is missing)';
  if (Date.parse(node.validTo) <= now) return `expired on ${new Date(node.validTo).toISOString()}`;
  if (Date.parse(node.validFrom) > now) {
    return `is not valid before ${new Date(node.validFrom).toISOString()}`;
  }
  return undefined;
}
