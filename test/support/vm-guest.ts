/**
 * What the VM test boots: a Debian kernel (the cloud flavour: small, boots fast under TCG),
 * fetched once with `apt-get download` and unpacked into .cache/vm/ (git-ignored), and a busybox
 * initramfs made for each boot. Its init brings up loopback and eth0 (virtio-net, whose modules
 * it carries: Debian builds them as modules) with a static address, a default route and a
 * resolver, runs the probes given, prints each one's output between markers on the serial
 * console and powers off. QEMU and busybox come from scripts/system-packages.mjs --vm.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import {
  accessSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const CACHE = path.join(ROOT, '.cache', 'vm');
/** The metapackage whose dependency names the current kernel package. */
const KERNEL_META = 'linux-image-cloud-amd64';
export const QEMU = '/usr/bin/qemu-system-x86_64';
const BUSYBOX = '/bin/busybox';

/** virtio-net and what it needs, each after its dependencies (their `depends=`). */
const MODULES = [
  'drivers/virtio/virtio_ring',
  'drivers/virtio/virtio',
  'drivers/virtio/virtio_pci_legacy_dev',
  'drivers/virtio/virtio_pci_modern_dev',
  'drivers/virtio/virtio_pci',
  'net/core/failover',
  'drivers/net/net_failover',
  'drivers/net/virtio_net',
];

export interface Kernel {
  readonly image: string;
  /** lib/modules/<version> of the same package. */
  readonly modules: string;
}

/** One command the guest runs; its exit code and output come back under `name`. */
export interface Probe {
  /** Letters, digits and dashes. */
  readonly name: string;
  /** A busybox sh line; it bounds its own time (`timeout`). */
  readonly command: string;
}

/** The guest's network, as its init sets it up. */
export interface GuestNetwork {
  /** With its prefix, e.g. 172.30.0.2/24. */
  readonly address: string;
  readonly router: string;
  readonly resolver: string;
}

/** An unpacked kernel in the cache, if one is there. */
function cachedKernel(): Kernel | undefined {
  if (!existsSync(CACHE)) return undefined;
  for (const entry of readdirSync(CACHE).sort().reverse()) {
    const boot = path.join(CACHE, entry, 'boot');
    const image = existsSync(boot) && readdirSync(boot).find((f) => f.startsWith('vmlinuz-'));
    if (!image) continue;
    const version = image.slice('vmlinuz-'.length);
    const modules = path.join(CACHE, entry, 'lib', 'modules', version);
    if (existsSync(modules)) return { image: path.join(boot, image), modules };
  }
  return undefined;
}

/** The kernel package the metapackage depends on now (apt's lists must know it). */
function kernelPackage(): string | Error {
  const asked = spawnSync('apt-cache', ['depends', KERNEL_META], {
    encoding: 'utf8',
    timeout: 30_000,
  });
  const name = /Depends: (linux-image-\S+)/.exec(asked.stdout ?? '')?.[1];
  return name ?? new Error(`apt-cache names no kernel package for ${KERNEL_META}`);
}

/** Downloads and unpacks the kernel once; later calls use the cache. */
function fetchKernel(): Kernel | Error {
  const cached = cachedKernel();
  if (cached) return cached;
  const name = kernelPackage();
  if (name instanceof Error) return name;
  const target = path.join(CACHE, name);
  mkdirSync(CACHE, { recursive: true });
  const downloaded = spawnSync('apt-get', ['download', name], {
    cwd: CACHE,
    encoding: 'utf8',
    timeout: 300_000,
  });
  const deb = readdirSync(CACHE).find((f) => f.startsWith(`${name}_`) && f.endsWith('.deb'));
  if (downloaded.status !== 0 || deb === undefined)
    return new Error(`apt-get download ${name} failed: ${downloaded.stderr.trim()}`);
  try {
    execFileSync('dpkg-deb', ['-x', path.join(CACHE, deb), target]);
  } catch (error) {
    rmSync(target, { recursive: true, force: true });
    return new Error(`dpkg-deb -x ${deb}: ${(error as Error).message}`);
  } finally {
    rmSync(path.join(CACHE, deb), { force: true });
  }
  return cachedKernel() ?? new Error(`${name} holds no vmlinuz and modules`);
}

/**
 * Why a VM cannot be booted here (printed once, as the suite's skip reason), or the kernel to
 * boot. Installs QEMU and busybox (scripts/system-packages.mjs --vm) and fetches the kernel first.
 */
export function prepareGuest(suite: string): Kernel | string {
  const reason = ((): Kernel | string => {
    if (process.getuid?.() !== 0) return 'needs root (a tap device and network namespaces)';
    try {
      accessSync('/dev/net/tun');
    } catch {
      return '/dev/net/tun is missing (no tap devices here)';
    }
    spawnSync(process.execPath, [path.join(ROOT, 'scripts', 'system-packages.mjs'), '--vm'], {
      stdio: 'inherit',
      timeout: 600_000,
    });
    if (!existsSync(QEMU)) return `${QEMU} is missing (Debian's qemu-system-x86)`;
    if (!existsSync(BUSYBOX)) return `${BUSYBOX} is missing (Debian's busybox-static)`;
    const kernel = fetchKernel();
    if (kernel instanceof Error) return `no Debian kernel to boot: ${kernel.message}`;
    const missing = MODULES.find(
      (m) => !existsSync(path.join(kernel.modules, 'kernel', `${m}.ko`)),
    );
    return missing ? `the kernel has no ${missing}.ko` : kernel;
  })();
  if (typeof reason === 'string') console.warn(`${suite}: skipped: ${reason}`);
  return reason;
}

/** Marker lines on the serial console; parsed by ./vm.ts. */
export const MARK = {
  up: '@@vm up',
  begin: '@@probe begin',
  end: '@@probe end',
  done: '@@vm done',
};

/** The guest's PID 1: network up, probes run between markers, power off. */
function initScript(network: GuestNetwork, probes: readonly Probe[]): string {
  const modules = MODULES.map((m) => path.basename(m)).join(' ');
  const run = probes.map((p) =>
    [
      `echo "${MARK.begin} ${p.name}"`,
      `( ${p.command} ) 2>&1`,
      `echo "${MARK.end} ${p.name} $?"`,
    ].join('\n'),
  );
  return `#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in ${modules}; do insmod /lib/modules/$m.ko || echo "insmod $m failed"; done
ip link set lo up
ip addr add ${network.address} dev eth0
ip link set eth0 up
ip route add default via ${network.router}
echo "nameserver ${network.resolver}" > /etc/resolv.conf
echo "${MARK.up} $(cut -d' ' -f1 /proc/uptime)"
${run.join('\n')}
echo "${MARK.done}"
poweroff -f
`;
}

/** Writes an initramfs (newc cpio, made by busybox) for one boot into `folder`; its path. */
export function buildInitramfs(
  kernel: Kernel,
  folder: string,
  network: GuestNetwork,
  probes: readonly Probe[],
): string {
  for (const probe of probes)
    if (!/^[a-z0-9-]+$/.test(probe.name))
      throw new Error(`probe name "${probe.name}" is not [a-z0-9-]+`);
  const tree = path.join(folder, 'root');
  rmSync(tree, { recursive: true, force: true });
  for (const dir of ['bin', 'lib/modules', 'proc', 'sys', 'dev', 'etc'])
    mkdirSync(path.join(tree, dir), { recursive: true });
  copyFileSync(BUSYBOX, path.join(tree, 'bin', 'busybox'));
  for (const m of MODULES)
    copyFileSync(
      path.join(kernel.modules, 'kernel', `${m}.ko`),
      path.join(tree, 'lib', 'modules', `${path.basename(m)}.ko`),
    );
  writeFileSync(path.join(tree, 'init'), initScript(network, probes), { mode: 0o755 });
  const archive = path.join(folder, 'initramfs.cpio');
  const files = execFileSync(BUSYBOX, ['find', '.'], { cwd: tree });
  const cpio = execFileSync(BUSYBOX, ['cpio', '-o', '-H', 'newc'], {
    cwd: tree,
    input: files,
    maxBuffer: 64 << 20,
    stdio: ['pipe', 'pipe', 'ignore'],
  });
  writeFileSync(archive, cpio);
  return archive;
}
