import { type ChildProcess, execFile, execFileSync, spawn } from 'node:child_process';
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

/** iproute2: `ip monitor address route` prints a line for every address or route that comes or goes. */
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

/** `ip` arguments listing the local routes of every table, for one address family. */
const LOCAL_ROUTES = [
  ['-j', 'route', 'show', 'table', 'all', 'type', 'local'],
  ['-j', '-6', 'route', 'show', 'table', 'all', 'type', 'local'],
];

/** The prefixes of local routes, as CIDR text, from `ip -j route` output (IPv4 or IPv6). */
export function localRoutePrefixes(json: string): string[] {
  let routes: unknown;
  try {
    routes = JSON.parse(json);
  } catch {
    return [];
  }
  if (!Array.isArray(routes)) return [];
  return routes.flatMap((route: unknown) => {
    const dst = (route as { dst?: unknown } | null)?.dst;
    if (typeof dst !== 'string' || dst === 'default') return [];
    return [dst.includes('/') ? dst : `${dst}/${dst.includes(':') ? 128 : 32}`];
  });
}

/** The host's local routes now (read once, at start). */
function localRoutesNow(): string[] {
  try {
    return LOCAL_ROUTES.flatMap((args) =>
      localRoutePrefixes(execFileSync(IP, args, { encoding: 'utf8', timeout: 2000 })),
    );
  } catch {
    return [];
  }
}

/** The host's local routes, read without blocking; undefined when `ip` could not list them. */
async function localRoutesRead(): Promise<string[] | undefined> {
  const lists = await Promise.all(
    LOCAL_ROUTES.map(
      (args) =>
        new Promise<string[] | undefined>((resolve) =>
          execFile(IP, args, { encoding: 'utf8', timeout: 2000 }, (error, out) =>
            resolve(error === null ? localRoutePrefixes(out) : undefined),
          ),
        ),
    ),
  );
  return lists.some((list) => list === undefined) ? undefined : (lists.flat() as string[]);
}

/**
 * The host's addresses as the kernel has them now: its interfaces' and what its local routes
 * deliver to it (AnyIP prefixes no interface lists). Read at start, and again whenever netlink
 * says an address or route came or went (through `ip monitor address route`, so a host address
 * added while Moat runs is denied within milliseconds). Without iproute2 the interfaces are
 * re-read every second instead, and local routes are not seen (the dialler's own check, that a
 * connection's two ends differ, still holds for those that source from the destination).
 */
export class HostWatch implements HostAddresses {
  private current: HostAddresses;
  private monitor: ChildProcess | undefined;
  private timer: NodeJS.Timeout | undefined;
  private pending = false;
  private stopped = false;
  private routes: string[];
  /** A read of the local routes is under way; `routesAgain`: something changed meanwhile. */
  private readingRoutes = false;
  private routesAgain = false;

  constructor(private readonly options: HostWatchOptions = {}) {
    this.routes = existsSync(IP) ? localRoutesNow() : [];
    this.current = compileHostAddresses(hostInterfaces(), options, this.routes);
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
    const monitor = spawn(IP, ['-o', 'monitor', 'address', 'route'], {
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

  /**
   * Re-reads the interfaces once per turn of the event loop, however many lines came, and the
   * local routes once more when the read under way is done.
   */
  private renew(): void {
    if (this.pending || this.stopped) return;
    this.pending = true;
    setImmediate(() => {
      this.pending = false;
      this.compile();
      if (this.monitor !== undefined) this.readRoutes();
    });
  }

  private compile(): void {
    this.current = compileHostAddresses(hostInterfaces(), this.options, this.routes);
  }

  private readRoutes(): void {
    if (this.readingRoutes) {
      this.routesAgain = true;
      return;
    }
    this.readingRoutes = true;
    void localRoutesRead().then((routes) => {
      this.readingRoutes = false;
      if (this.stopped) return;
      // A failed listing keeps the last one: a prefix is never forgotten for a hiccup.
      if (routes !== undefined) {
        this.routes = routes;
        this.compile();
      }
      if (this.routesAgain) {
        this.routesAgain = false;
        this.readRoutes();
      }
    });
  }

  private lost(why: string): void {
    if (this.stopped || this.timer !== undefined) return;
    this.monitor = undefined;
    this.poll(`ip monitor address route stopped: ${why}`);
  }

  private poll(why: string): void {
    this.options.onPolling?.(why);
    this.renew();
    this.timer = setInterval(() => this.renew(), HOST_REFRESH_MS).unref();
  }
}
