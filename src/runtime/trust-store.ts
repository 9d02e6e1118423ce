/**
 * What sandboxes trust: the host's Debian CA bundle plus the CAs Moat adds (its egress CA, whose
 * leaves it shows where it terminates a sandbox's TLS). One file per Moat, in its data folder, that
 * every confined sandbox sees read-only, mounted over its own system bundle (supervisor/
 * sandbox_init.py): no sandbox can change what it or any other sandbox trusts, and a sandbox made
 * from a snapshot sees the CA of the Moat that runs it now.
 */
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { SandboxEnvironment } from './runtime.js';

const HOST_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
/** Where a confined sandbox finds the bundle (Debian's path; /usr/lib/ssl/cert.pem links to it). */
export const SANDBOX_TRUST_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';

/** Variables by which curl, Python (requests, ssl), Node, git and pip find a CA bundle. */
const TRUST_VARIABLES = [
  'NODE_EXTRA_CA_CERTS',
  'REQUESTS_CA_BUNDLE',
  'SSL_CERT_FILE',
  'CURL_CA_BUNDLE',
  'GIT_SSL_CAINFO',
  'PIP_CERT',
];

/** Writes `<data>/trust/ca-certificates.crt` (replacing it whole) and returns its path. */
export async function writeTrustBundle(dataDir: string, trustedCaPem: string): Promise<string> {
  const folder = path.join(dataDir, 'trust');
  await mkdir(folder, { recursive: true, mode: 0o700 });
  // A host without Debian's bundle: sandboxes trust Moat's CA alone.
  const host = await readFile(HOST_BUNDLE, 'utf8').catch(() => '');
  const file = path.join(folder, 'ca-certificates.crt');
  const staging = `${file}.new`;
  await rm(staging, { force: true });
  const separator = host === '' || host.endsWith('\n') ? '' : '\n';
  // 0644: read through the sandbox's mount by every user of the sandbox.
  await writeFile(staging, `${host}${separator}# Moat egress CA\n${trustedCaPem.trim()}\n`, {
    mode: 0o644,
  });
  await rename(staging, file);
  return file;
}

/** Each variable naming `bundle`, as a sandbox's processes see it. */
export function trustEnvironment(bundle: string): SandboxEnvironment {
  return Object.fromEntries(TRUST_VARIABLES.map((name) => [name, bundle]));
}
