#!/usr/bin/env node
/**
 * Installs the Debian packages Moat uses when they are missing and this machine allows it
 * (root with apt-get): bubblewrap confines sandbox processes, python3 runs the launcher that
 * starts them, iproute2 and nftables give each sandbox its own network namespace and firewall.
 * Without bubblewrap Moat runs with weaker isolation, without iproute2 and nftables it enforces
 * through the proxy only, and says so at start-up; without python3 sandboxes cannot start
 * processes. This script says why it did not install.
 * Run by `npm start` (prestart) and by the test suite's global set-up.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';

const PACKAGES = [
  { name: 'python3-minimal', provides: '/usr/bin/python3', for: 'the in-sandbox process launcher' },
  { name: 'bubblewrap', provides: '/usr/bin/bwrap', for: 'sandbox process confinement' },
  { name: 'iproute2', provides: '/usr/sbin/ip', for: 'per-sandbox network namespaces' },
  { name: 'nftables', provides: '/usr/sbin/nft', for: 'per-sandbox firewall rules' },
];

const missing = PACKAGES.filter((p) => !existsSync(p.provides));
if (missing.length === 0) process.exit(0);
const names = missing.map((p) => p.name);
const why = missing.map((p) => `${p.name} (${p.for})`).join(', ');
if (process.getuid?.() !== 0 || !existsSync('/usr/bin/apt-get')) {
  console.warn(`moat: not installing ${why}: needs root and apt-get; continuing without`);
  process.exit(0);
}
console.log(`moat: installing ${why} with apt-get`);
const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
const install = () =>
  spawnSync('apt-get', ['install', '-y', '--no-install-recommends', ...names], {
    env,
    stdio: 'inherit',
    timeout: 300_000,
  }).status === 0;
// A fresh machine may have no package lists yet: fetch them once and retry.
if (!install()) {
  execFileSync('apt-get', ['update'], { env, stdio: 'inherit', timeout: 300_000 });
  if (!install())
    console.warn(`moat: apt-get could not install ${names.join(' ')}; continuing without`);
}
