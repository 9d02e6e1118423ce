/**
 * A QEMU guest behind a tap device, the way a VM runtime (Firecracker, QEMU/Kata) holds one: a
 * network namespace this test makes, `tap0` in it as the guest's router on a subnet of its own
 * (172.30.0.1/24; the guest is 172.30.0.2), IPv4 forwarding on in that namespace only, and QEMU
 * (TCG, no KVM assumed) run inside it (`ip netns exec`). Each boot runs probes (./vm-guest.ts)
 * and returns what each printed and its exit code, read from the serial console.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  buildInitramfs,
  type GuestNetwork,
  type Kernel,
  MARK,
  type Probe,
  QEMU,
} from './vm-guest.js';

const IP = '/usr/sbin/ip';
export const TAP = {
  name: 'tap0',
  subnet: '172.30.0.0',
  router: '172.30.0.1',
  guest: '172.30.0.2',
  prefix: 24,
};

export interface ProbeResult {
  readonly code: number;
  readonly out: string;
}

export interface Boot {
  readonly results: ReadonlyMap<string, ProbeResult>;
  /** From QEMU's start to the guest's network being up, wall clock. */
  readonly upMs: number;
  /** The guest's own uptime then (its kernel's clock). */
  readonly guestUpS: number;
  /** From QEMU's start to its exit. */
  readonly totalMs: number;
  /** Everything on the serial console, for failure messages. */
  readonly console: string;
}

export class VmNamespace {
  readonly path: string;
  private qemu: ChildProcess | undefined;
  private readonly scratch: string;

  private constructor(readonly name: string) {
    this.path = `/run/netns/${name}`;
    this.scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-vm-'));
  }

  /** Makes the namespace with loopback, `tap0` holding the router's address, and forwarding. */
  static create(name: string): VmNamespace {
    try {
      execFileSync(IP, ['netns', 'delete', name], { stdio: 'ignore' });
    } catch {
      // Not left by an earlier run.
    }
    execFileSync(IP, ['netns', 'add', name]);
    const vm = new VmNamespace(name);
    try {
      vm.ip('link', 'set', 'lo', 'up');
      vm.ip('tuntap', 'add', 'dev', TAP.name, 'mode', 'tap');
      vm.ip('addr', 'add', `${TAP.router}/${TAP.prefix}`, 'dev', TAP.name);
      vm.ip('link', 'set', TAP.name, 'up');
      // This namespace's own value: the machine's stays as it is.
      execFileSync(IP, ['netns', 'exec', name, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
    } catch (error) {
      vm.close();
      throw error;
    }
    return vm;
  }

  /** `ip` inside the namespace. */
  ip(...args: string[]): void {
    execFileSync(IP, ['-n', this.name, ...args], { stdio: 'pipe' });
  }

  /**
   * Boots the guest on tap0 with `resolver` in its resolv.conf, runs `probes` in order and
   * powers off; rejects (with the console) when it does not finish within `timeoutMs`.
   */
  async boot(
    kernel: Kernel,
    resolver: string,
    probes: readonly Probe[],
    timeoutMs = 50_000,
  ): Promise<Boot> {
    const network: GuestNetwork = {
      address: `${TAP.guest}/${TAP.prefix}`,
      router: TAP.router,
      resolver,
    };
    const initramfs = buildInitramfs(kernel, this.scratch, network, probes);
    const started = performance.now();
    let upMs = NaN;
    let output = '';
    const qemu = spawn(
      IP,
      [
        ...['netns', 'exec', this.name, QEMU, '-accel', 'tcg', '-m', '256', '-smp', '1'],
        ...['-nodefaults', '-nographic', '-serial', 'stdio', '-monitor', 'none', '-no-reboot'],
        ...['-kernel', kernel.image, '-initrd', initramfs],
        // panic=-1 with -no-reboot: a kernel that cannot go on ends QEMU instead of hanging.
        ...['-append', 'console=ttyS0 quiet loglevel=1 panic=-1'],
        ...['-netdev', `tap,id=net0,ifname=${TAP.name},script=no,downscript=no`],
        // No option ROM: nothing boots from the network, and ipxe's image is not needed.
        ...['-device', 'virtio-net-pci,netdev=net0,romfile='],
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    this.qemu = qemu;
    const onData = (chunk: string) => {
      output += chunk;
      if (Number.isNaN(upMs) && output.includes(MARK.up)) upMs = performance.now() - started;
    };
    qemu.stdout!.setEncoding('utf8').on('data', onData);
    qemu.stderr!.setEncoding('utf8').on('data', onData);
    const exit = await new Promise<number | null>((resolve) => {
      const timer = setTimeout(() => qemu.kill('SIGKILL'), timeoutMs);
      qemu.once('exit', (code) => {
        clearTimeout(timer);
        resolve(code);
      });
    });
    this.qemu = undefined;
    const totalMs = performance.now() - started;
    const serial = output.replace(/\r/g, '');
    if (!serial.includes(MARK.done))
      throw new Error(
        `the guest did not finish its probes (QEMU exit ${exit}, ${Math.round(totalMs)} ms):\n${serial}`,
      );
    return {
      results: parseProbes(serial),
      upMs,
      guestUpS: Number(new RegExp(`${MARK.up} ([0-9.]+)`).exec(serial)?.[1]),
      totalMs,
      console: serial,
    };
  }

  close(): void {
    this.qemu?.kill('SIGKILL');
    try {
      execFileSync(IP, ['netns', 'delete', this.name], { stdio: 'ignore' });
    } catch {
      // Already gone.
    }
    rmSync(this.scratch, { recursive: true, force: true });
  }
}

/** Each probe's output lines (between its markers) and exit code. */
function parseProbes(serial: string): Map<string, ProbeResult> {
  const results = new Map<string, ProbeResult>();
  let current: { name: string; lines: string[] } | undefined;
  for (const line of serial.split('\n')) {
    if (line.startsWith(`${MARK.begin} `)) {
      current = { name: line.slice(MARK.begin.length + 1).trim(), lines: [] };
      continue;
    }
    const end = new RegExp(`^${MARK.end} (\\S+) (\\d+)`).exec(line);
    if (current === undefined) continue;
    if (end && current.name === end[1]) {
      results.set(current.name, { code: Number(end[2]), out: current.lines.join('\n') });
      current = undefined;
    } else current.lines.push(line);
  }
  return results;
}
