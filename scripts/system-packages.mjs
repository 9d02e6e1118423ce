#!/usr/bin/env node
/**
 * Installs the Debian packages Moat uses when they are missing and this machine allows it
 * (root with apt-get): python3 and python3-seccomp run each sandbox's supervisor (namespaces,
 * layers, seccomp filter), e2fsprogs and mount make and mount its disk, iproute2 and nftables
 * give each sandbox its own network namespace and firewall; bubblewrap, the peer
 * `npm run bench:sandbox` measures, only with `--bench`; chromium, the browser the console's
 * test drives, only with `--browser`; podman, runc and containernetworking-plugins, the runtime
 * the CNI plugin's test drives (test/cni/podman.test.ts), only with `--cni`; qemu-system-x86, the
 * VM test's guest (test/netns/vm.test.ts), only with `--vm`; busybox-static, the image of the one
 * and the initramfs of the other, with either; dropbear-bin, the SSH server git clones from in
 * the ports test, only with `--ssh`. Without the first, Moat refuses sandboxes (unless
 * started with --unconfined-sandboxes); without iproute2 and nftables it enforces through the
 * proxy only; it says so at start-up. This script says why it did not install.
 * Run by `npm start` (prestart), the test suite's global set-up, the benchmarks that need a peer,
 * the console's browser test, the Podman test, the VM test and the ports test.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';

/** Whether Debian's python3 imports `module` (from its own dist-packages too). */
const pythonHas = (module) =>
  existsSync('/usr/bin/python3') &&
  spawnSync(
    '/usr/bin/python3',
    ['-c', `import sys; sys.path.append('/usr/lib/python3/dist-packages'); import ${module}`],
    { stdio: 'ignore', timeout: 10_000 },
  ).status === 0;

const PACKAGES = [
  { name: 'python3', present: () => pythonHas('ctypes'), for: 'sandbox supervisors' },
  {
    name: 'python3-seccomp',
    present: () => pythonHas('seccomp'),
    for: "sandboxes' seccomp filter",
  },
  { name: 'e2fsprogs', present: () => existsSync('/sbin/mkfs.ext4'), for: 'sandbox disks' },
  { name: 'mount', present: () => existsSync('/bin/mount'), for: 'sandbox disks' },
  {
    name: 'iproute2',
    present: () => existsSync('/usr/sbin/ip'),
    for: 'per-sandbox network namespaces',
  },
  {
    name: 'nftables',
    present: () => existsSync('/usr/sbin/nft'),
    for: 'per-sandbox firewall rules',
  },
  {
    name: 'bubblewrap',
    present: () => existsSync('/usr/bin/bwrap'),
    for: 'the bench:sandbox peer',
    only: '--bench',
  },
  {
    name: 'chromium',
    present: () => existsSync('/usr/bin/chromium'),
    for: "the console's browser test",
    only: '--browser',
  },
  // The Podman test (test/cni): Podman with the CNI backend, runc (crun refuses this machine
  // kind's mixed cgroup set-up), the CNI reference plugins and a static busybox for its image.
  {
    name: 'podman',
    present: () => existsSync('/usr/bin/podman'),
    for: "the CNI plugin's Podman test",
    only: '--cni',
  },
  { name: 'runc', present: () => existsSync('/usr/sbin/runc'), for: 'Podman', only: '--cni' },
  {
    name: 'containernetworking-plugins',
    present: () => existsSync('/usr/lib/cni/loopback'),
    for: "Podman's CNI backend",
    only: '--cni',
  },
  {
    name: 'qemu-system-x86',
    present: () => existsSync('/usr/bin/qemu-system-x86_64'),
    for: "the VM test's guest",
    only: '--vm',
  },
  {
    name: 'dropbear-bin',
    present: () => existsSync('/usr/sbin/dropbear'),
    for: 'the SSH server of the git over SSH test (test/netns/ports.test.ts)',
    only: '--ssh',
  },
  {
    name: 'busybox-static',
    present: () => existsSync('/bin/busybox'),
    for: "the Podman test's image and the VM test's initramfs",
    only: ['--cni', '--vm'],
  },
];

// Packages marked `only` are extras for one purpose, installed when (one of) their options is given.
const missing = PACKAGES.filter(
  (p) =>
    (p.only === undefined || [p.only].flat().some((option) => process.argv.includes(option))) &&
    !p.present(),
);
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
  // Another installer (a second suite's set-up) may hold dpkg's lock: wait for it, bounded.
  spawnSync(
    'apt-get',
    ['-o', 'DPkg::Lock::Timeout=240', 'install', '-y', '--no-install-recommends', ...names],
    {
      env,
      stdio: 'inherit',
      timeout: 300_000,
    },
  ).status === 0;
// A fresh machine may have no package lists yet: fetch them once and retry.
if (!install()) {
  execFileSync('apt-get', ['update'], { env, stdio: 'inherit', timeout: 300_000 });
  if (!install())
    console.warn(`moat: apt-get could not install ${names.join(' ')}; continuing without`);
}
