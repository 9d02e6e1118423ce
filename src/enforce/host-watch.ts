import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import type { Socket } from 'node:net';
import os from 'node:os';
import {
  compileHostAddresses,
  type Decision,
  type HostAddresses,
  type HostAddressOptions,
  type InterfaceAddress,
  type IPAddress,
} from '../policy/index.js';

/** iproute2: `ip monitor address` prints a line for every address the kernel adds or removes. */
const IP = '/usr/sbin/ip';
/** Where there is no iproute2 (proxy mode on a bare host): how often the interfaces are re-read. */
export const HOST_REFRESH_MS = 1000;

export interface HostWatchOptions extends HostAddressOptions {
  /** Told once when addresses can only be re-read every HOST_REFRESH_MS from now on. */
  readonly onPolling?: (why: string) => void;
}

/** Every address of every interface of this host (the network namespace Moat runs in). */
export function hostInterfaces(): InterfaceAddress[] {
  return Object.values(os.networkInterfaces()).flatMap((addresses) =>
    (addresses ?? []).map((entry) => ({
      address: entry.address,
      prefixLength: Number(entry.cidr?.split('/')[1] ?? (entry.family === 'IPv4' ? 32 : 128)),
      loopback: entry.internal,
    })),
  );
}

/**
 * The host's addresses as the kernel has them now: read at start, and again whenever netlink
 * says an address came or went (through `ip monitor address`, so a host address added while Moat
 * runs is denied within milliseconds). Without iproute2 they are re-read every second instead.
 */
export class HostWatch implements HostAddresses {
  private current: HostAddresses;
  private monitor: ChildProcess | undefined;
  private timer: NodeJS.Timeout | undefined;
  private pending = false;
  private stopped = false;

  constructor(private readonly options: HostWatchOptions = {}) {
    this.current = compileHostAddresses(hostInterfaces(), options);
  }

  decide(ip: IPAddress, port?: number): Decision | undefined {
    return this.current.decide(ip, port);
  }

  reached(port: number): Decision | undefined {
    // Perhaps an address added since the last reading, its news not yet here: read again.
    this.renew();
    return this.current.reached(port);
  }

  /** Starts following address changes. */
  start(): void {
    if (!existsSync(IP)) return this.poll(`${IP} (iproute2) is not installed`);
    const monitor = spawn(IP, ['-o', 'monitor', 'address'], {
      stdio: ['ignore', 'pipe', 'ignore'],
      // Its own process group: a terminal's Ctrl-C is Moat's to handle, not the monitor's.
      detached: true,
    });
    this.monitor = monitor;
    // Moat's stop ends it; it alone must not keep a process alive.
    monitor.unref();
    (monitor.stdout as Socket).unref();
    // Subscribed from here on: what changed before it was listening is read once more.
    monitor.once('spawn', () => this.renew());
    monitor.stdout!.on('data', () => this.renew());
    monitor.once('error', (error) => this.lost(error.message));
    monitor.once('exit', (code, signal) => this.lost(`it exited (${signal ?? code})`));
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
    this.monitor?.kill();
  }

  /** Re-reads the interfaces once per turn of the event loop, however many lines came. */
  private renew(): void {
    if (this.pending || this.stopped) return;
    this.pending = true;
    setImmediate(() => {
      this.pending = false;
      this.current = compileHostAddresses(hostInterfaces(), this.options);
    });
  }

  private lost(why: string): void {
    if (this.stopped || this.timer !== undefined) return;
    this.monitor = undefined;
    this.poll(`ip monitor address stopped: ${why}`);
  }

  private poll(why: string): void {
    this.options.onPolling?.(why);
    this.renew();
    this.timer = setInterval(() => this.renew(), HOST_REFRESH_MS).unref();
  }
}
