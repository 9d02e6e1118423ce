/**
 * A "world" for kernel enforcement tests and benchmarks: a network namespace made here (nothing
 * outside this host is ever contacted), linked to the host by a veth pair, holding four origin
 * addresses (`10.<a>.<b>.2` to `.5`) that all run the servers of world-servers.ts.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { testCertificate } from './certificate.js';

export { WORLD_PORTS } from './world-servers.js';

export interface WorldEvent {
  readonly event: string;
  readonly from?: string;
  readonly host?: string;
  readonly sni?: string;
}

const ip = (...args: string[]) => execFileSync('/usr/sbin/ip', args, { stdio: 'pipe' });

export class World {
  readonly events: WorldEvent[] = [];
  /** The world's origin addresses. */
  readonly origins: readonly string[];
  /** The host's end of the link (an address of this host, not of the world). */
  readonly hostAddress: string;

  private constructor(
    readonly namespace: string,
    private readonly link: string,
    prefix: string,
    private readonly servers: ChildProcess,
  ) {
    this.origins = [2, 3, 4, 5].map((n) => `${prefix}.${n}`);
    this.hostAddress = `${prefix}.1`;
  }

  /**
   * `tag`: a few characters naming this world apart from others running at once; `prefix`:
   * its /24 without the last part (e.g. `10.251.7`); `certificate`: what HTTPS on 443 presents
   * (PEM; a throwaway self-signed one for `moat-test` unless given, e.g. a test CA's leaf for
   * the names a test maps to the world).
   */
  static async create(
    tag: string,
    prefix: string,
    certificate: { key: string | Buffer; cert: string | Buffer } = testCertificate(),
  ): Promise<World> {
    const namespace = `moat-world-${tag}`;
    const link = `mw-${tag}`;
    // Leftovers of an interrupted earlier run of the same tag.
    for (const args of [
      ['link', 'delete', link],
      ['netns', 'delete', namespace],
    ]) {
      try {
        ip(...args);
      } catch {
        // Not there.
      }
    }
    ip('netns', 'add', namespace);
    ip('link', 'add', link, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', namespace);
    ip('addr', 'add', `${prefix}.1/24`, 'dev', link);
    ip('link', 'set', link, 'up');
    const inside = (...args: string[]) => ip('-n', namespace, ...args);
    inside('link', 'set', 'lo', 'up');
    for (const n of [2, 3, 4, 5]) inside('addr', 'add', `${prefix}.${n}/24`, 'dev', 'eth0');
    inside('link', 'set', 'eth0', 'up');
    inside('route', 'add', 'default', 'via', `${prefix}.1`);
    const { key, cert } = certificate;
    // Compiled next to this file when run from dist/; from the sources (tests), the build's copy.
    const here = path.dirname(fileURLToPath(import.meta.url));
    const script = existsSync(path.join(here, 'world-servers.js'))
      ? path.join(here, 'world-servers.js')
      : path.resolve(here, '../../dist/bench/lib/world-servers.js');
    const servers = spawn(
      '/usr/bin/nsenter',
      [`--net=/run/netns/${namespace}`, '--', process.execPath, script],
      {
        env: {
          PATH: process.env.PATH ?? '',
          MOAT_WORLD_KEY: Buffer.from(key).toString('base64'),
          MOAT_WORLD_CERT: Buffer.from(cert).toString('base64'),
          MOAT_WORLD_ADDRESSES: [2, 3, 4, 5].map((n) => `${prefix}.${n}`).join(','),
        },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    const world = new World(namespace, link, prefix, servers);
    let buffered = '';
    const ready = new Promise<void>((resolve, reject) => {
      servers.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
        buffered += chunk;
        for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
          const line = JSON.parse(buffered.slice(0, nl)) as WorldEvent & { message?: string };
          buffered = buffered.slice(nl + 1);
          if (line.event === 'ready') resolve();
          else if (line.event === 'error') reject(new Error(`world servers: ${line.message}`));
          else world.events.push(line);
        }
      });
      servers.on('exit', (code) => reject(new Error(`world servers exited (${code})`)));
    });
    try {
      await ready;
    } catch (error) {
      await world.close();
      throw error;
    }
    return world;
  }

  /** Events of one kind seen so far. */
  seen(kind: string): WorldEvent[] {
    return this.events.filter((e) => e.event === kind);
  }

  async close(): Promise<void> {
    this.servers.kill('SIGKILL');
    for (const args of [
      ['link', 'delete', this.link],
      ['netns', 'delete', this.namespace],
    ]) {
      try {
        ip(...args);
      } catch {
        // Already gone.
      }
    }
  }
}

/**
 * What a Moat of scope `scope` holds on this host: its sandboxes' namespaces and host-side
 * links, its nftables table and its gateway address (`ip netns list`, `ip link`, `nft list
 * tables`, `ip addr show lo`).
 */
export function hostNetworkLines(
  scope: string,
  gateway?: string,
): { namespaces: string[]; links: string[]; tables: string[]; gateway: string[] } {
  const lines = (file: string, args: string[]) =>
    execFileSync(file, args, { encoding: 'utf8' }).split('\n');
  return {
    namespaces: lines('/usr/sbin/ip', ['netns', 'list']).filter((l) =>
      l.startsWith(`moat-${scope}-`),
    ),
    links: lines('/usr/sbin/ip', ['-br', 'link']).filter((l) => l.startsWith(`mt${scope}-`)),
    tables: lines('/usr/sbin/nft', ['list', 'tables']).filter((l) => l.includes(`moat_${scope}`)),
    gateway: gateway
      ? lines('/usr/sbin/ip', ['-br', 'addr', 'show', 'lo']).filter((l) =>
          l.includes(` ${gateway}/32`),
        )
      : [],
  };
}
