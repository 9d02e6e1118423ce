/**
 * The outside world of a Moat that runs in a namespace playing the host (test/support
 * host-moat.ts): a "world" namespace linked to that host namespace (never to the machine's),
 * whose origin addresses run bench/lib/world-servers (HTTP 80, HTTPS 443, TCP echo 7000...),
 * and the upstream resolver that Moat's host-moat flags name (127.0.0.1:5399 inside the host
 * namespace), answering A records from a zone given here.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { testCertificate } from '../../bench/lib/certificate.js';
import type { WorldEvent } from '../../bench/lib/world.js';

const IP = '/usr/sbin/ip';
const NFT = '/usr/sbin/nft';
/** The ports whose connections the world counts at each origin. */
export const SEEN_PORTS = [80, 443, 7000] as const;
const NSENTER = '/usr/bin/nsenter';
const SERVERS = fileURLToPath(new URL('../../dist/bench/lib/world-servers.js', import.meta.url));
const DNS_PACKET = createRequire(import.meta.url).resolve('dns-packet');

/** Answers A questions from the zone (argv[2], JSON); a name outside it is NXDOMAIN. */
const RESOLVER = `
const dgram = require('node:dgram');
const packet = require(process.argv[1]);
const zone = JSON.parse(process.argv[2]);
const socket = dgram.createSocket('udp4');
socket.on('message', (message, from) => {
  let query;
  try { query = packet.decode(message); } catch { return; }
  const question = (query.questions || [])[0];
  if (!question) return;
  const address = zone[question.name.toLowerCase().replace(/\\.$/, '')];
  const answers = address && question.type === 'A' ? [{ type: 'A', name: question.name, ttl: 5, data: address }] : [];
  const flags = packet.RECURSION_DESIRED | packet.RECURSION_AVAILABLE | (address ? 0 : 3);
  socket.send(packet.encode({ id: query.id, type: 'response', flags, questions: query.questions, answers }), from.port, from.address);
});
socket.bind(5399, '127.0.0.1', () => console.log(JSON.stringify({ event: 'ready' })));`;

export class HostWorld {
  readonly events: WorldEvent[] = [];
  private readonly children: ChildProcess[] = [];

  private constructor(
    readonly namespace: string,
    readonly origins: readonly string[],
  ) {}

  /**
   * `host`: the host namespace's name; `prefix`: the world's /24 less its last part (its .1 is
   * the host's end, .2 to .5 the origins); `zone`: name -> address for the resolver.
   */
  static async create(
    host: string,
    tag: string,
    prefix: string,
    zone: Record<string, string>,
  ): Promise<HostWorld> {
    const namespace = `moat-world-${tag}`;
    try {
      execFileSync(IP, ['netns', 'delete', namespace], { stdio: 'ignore' });
    } catch {
      // Not left by an earlier run.
    }
    const origins = [2, 3, 4, 5].map((n) => `${prefix}.${n}`);
    const world = new HostWorld(namespace, origins);
    execFileSync(IP, ['netns', 'add', namespace]);
    try {
      const link = `mw-${tag}`.slice(0, 15);
      execFileSync(IP, [
        '-n',
        host,
        'link',
        'add',
        link,
        'type',
        'veth',
        'peer',
        'name',
        'eth0',
        'netns',
        namespace,
      ]);
      execFileSync(IP, ['-n', host, 'addr', 'add', `${prefix}.1/24`, 'dev', link]);
      execFileSync(IP, ['-n', host, 'link', 'set', link, 'up']);
      const inside = (...args: string[]) => execFileSync(IP, ['-n', namespace, ...args]);
      inside('link', 'set', 'lo', 'up');
      for (const origin of origins) inside('addr', 'add', `${origin}/24`, 'dev', 'eth0');
      inside('link', 'set', 'eth0', 'up');
      inside('route', 'add', 'default', 'via', `${prefix}.1`);
      // A counter per origin and port of the connections that reach it (their SYNs).
      const counters = origins.flatMap((origin) =>
        SEEN_PORTS.map(
          (port) =>
            `add rule inet seen input ip daddr ${origin} tcp dport ${port} tcp flags & (syn | ack) == syn counter comment "${origin}:${port}"`,
        ),
      );
      execFileSync(NSENTER, [`--net=/run/netns/${namespace}`, '--', NFT, '-f', '-'], {
        input: [
          'add table inet seen',
          'add chain inet seen input { type filter hook input priority 0; }',
          ...counters,
          '',
        ].join('\n'),
      });
      const { key, cert } = testCertificate();
      await world.start(namespace, [SERVERS], {
        MOAT_WORLD_KEY: Buffer.from(key).toString('base64'),
        MOAT_WORLD_CERT: Buffer.from(cert).toString('base64'),
        MOAT_WORLD_ADDRESSES: origins.join(','),
      });
      await world.start(host, ['-e', RESOLVER, DNS_PACKET, JSON.stringify(zone)]);
    } catch (error) {
      world.close();
      throw error;
    }
    return world;
  }

  /** Events of one kind the origins saw from `from` (every sender when absent). */
  seen(kind: string, from?: string): WorldEvent[] {
    return this.events.filter(
      (e) => e.event === kind && (from === undefined || e.from?.endsWith(from)),
    );
  }

  /** How many connections reached `origin` on `port` (counted in the world's own firewall). */
  connectionsTo(origin: string, port: (typeof SEEN_PORTS)[number]): number {
    const listed = execFileSync(
      NSENTER,
      [
        `--net=/run/netns/${this.namespace}`,
        '--',
        NFT,
        '-j',
        'list',
        'chain',
        'inet',
        'seen',
        'input',
      ],
      {
        encoding: 'utf8',
      },
    );
    const rules = (
      JSON.parse(listed) as {
        nftables: Array<{
          rule?: { comment?: string; expr: Array<{ counter?: { packets: number } }> };
        }>;
      }
    ).nftables;
    const rule = rules.find((r) => r.rule?.comment === `${origin}:${port}`)?.rule;
    if (rule === undefined) throw new Error(`the world counts no ${origin}:${port}`);
    return rule.expr.find((e) => e.counter)!.counter!.packets;
  }

  close(): void {
    for (const child of this.children) child.kill('SIGKILL');
    try {
      // Its end of the link goes with it.
      execFileSync(IP, ['netns', 'delete', this.namespace], { stdio: 'ignore' });
    } catch {
      // Already gone.
    }
  }

  /** A node program in `netns`; resolves at its "ready" line (within 10 s), records the rest. */
  private start(netns: string, args: string[], env: Record<string, string> = {}): Promise<void> {
    const child = spawn(NSENTER, [`--net=/run/netns/${netns}`, '--', process.execPath, ...args], {
      env: { PATH: process.env.PATH ?? '', ...env },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    this.children.push(child);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${args[0]} not ready within 10 s`)), 10_000);
      let buffered = '';
      child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
        buffered += chunk;
        for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
          const line = JSON.parse(buffered.slice(0, nl)) as WorldEvent;
          buffered = buffered.slice(nl + 1);
          if (line.event === 'ready') {
            clearTimeout(timer);
            resolve();
          } else this.events.push(line);
        }
      });
      child.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`${args[0]} exited (${code}) before it was ready`));
      });
    });
  }
}
