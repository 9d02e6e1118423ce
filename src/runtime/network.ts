/**
 * Each sandbox's own network namespace: a veth link (a /30 from the pool, the host end `.1`,
 * the sandbox end `.2`), IPv6 switched off on it, a default route to the host, and an nft session
 * through which the kernel enforcer writes the sandbox's firewall. The host keeps one gateway
 * address (the pool's first address, on `lo`) where Moat's DNS, proxy and transparent listeners
 * wait for sandboxes.
 *
 * Names are derived from a scope (the pool's, which one Moat holds at a time) and the link's
 * slot, so that start-up can find and remove what an earlier Moat on the same pool left, and only
 * that.
 */
import { execFile, execFileSync, spawn } from 'node:child_process';
import { accessSync, constants, existsSync } from 'node:fs';
import { readdir, readFile, writeFile } from 'node:fs/promises';
import type net from 'node:net';
import {
  AdoptRefused,
  type AdoptRequest,
  devicesOf,
  identityOf,
  INNER_DEVICE,
  INNER_LINK,
  type NamespaceIdentity,
  namespaceFile,
  refuseHostNamespaces,
  sameNamespace,
  uplinkOf,
} from './adoption.js';
import { type DirectFlow, DirectFlowLog } from './direct-flow-log.js';
import { NFT, NftSession, NSENTER } from './nft-session.js';
import { RangeLock } from './range-lock.js';
import type { HostPort } from '../net/index.js';

const IP = '/usr/sbin/ip';
/** iproute2's traffic control: each sandbox's bandwidth, a token bucket on each end of its link. */
const TC = '/usr/sbin/tc';
/** How long a packet may wait in a bandwidth limit's queue before it is dropped (TCP backs off). */
const SHAPER_LATENCY_SECONDS = 0.05;
/**
 * The least queue of a bandwidth limit, in bytes: four full-size (64 KiB GSO) packets. A queue of
 * 50 ms at a low rate holds barely one: a local TCP sender then loses more packets than it gets
 * through (measured at 12 Mbit/s: 26,000 dropped for 14,000 sent), and under load its
 * retransmissions leave the link idle below the rate set.
 */
const SHAPER_MIN_QUEUE_BYTES = 256 * 1024;
/** The largest bandwidth limit, in Mbit/s (100 Gbit/s). */
export const MAX_BANDWIDTH_MBPS = 100_000;
/** iproute2's socket tool: lists a namespace's sockets, and ends them (sock_diag destroy). */
const SS = '/usr/bin/ss';
/** Connections ended by one `ss -K` (its filter is one argument). */
const END_BATCH = 64;
/**
 * The states of a connection whose program may be waiting for bytes: established, or half-closed
 * by the sandbox (FIN-WAIT: as a client that sent its whole request; its peer may still send).
 * Not CLOSE-WAIT (its peer sends no more: the program's next send is refused at once) nor
 * SYN-SENT (a web one may be on its way to the transparent listener, which decides it itself).
 */
const OPEN_STATES = ['established', 'fin-wait-1', 'fin-wait-2'].flatMap((state) => [
  'state',
  state,
]);
const NETNS_DIR = '/run/netns';
/**
 * In Moat's own namespaces, conntrack does not judge TCP segments by its idea of the window
 * (the setting is per namespace; the host's is untouched). After a fast transfer with much
 * reordering it can take the peer's FIN for out of window, INVALID, which the namespace's
 * inbound chain drops with every retransmission: the sandbox's socket then waits in FIN-WAIT-2
 * for a close that never comes (seen in test/netns/bandwidth.test.ts).
 */
const CONNTRACK_LIBERAL =
  'f=/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal; if [ -e $f ]; then echo 1 > $f; fi';
const MOUNT = '/usr/bin/mount';
const COMMAND_TIMEOUT_MS = 10_000;
/** The sandbox's end of a link Moat made with its namespace. */
const OWN_DEVICE = 'eth0';
/**
 * What removes the firewall the kernel enforcer writes into a sandbox's namespace (its table,
 * `inet moat`), from a namespace Moat adopted and leaves behind when it detaches.
 */
const REMOVE_FIREWALL = 'table inet moat; delete table inet moat';
/**
 * What holds an adopted namespace from the moment Moat's link comes up until the kernel enforcer
 * writes its firewall (which replaces this table in one transaction): nothing forwarded or sent
 * leaves. Its guests may be running already (a restart re-adopts a live VM's namespace).
 */
const HOLD_FIREWALL = `${REMOVE_FIREWALL}; table inet moat { chain hold_forward { type filter hook forward priority filter; policy drop; }; chain hold_output { type filter hook output priority filter; policy drop; oifname "lo" accept; }; }`;

export interface NamespaceNetworkOptions {
  /** Hex that names this Moat's namespaces and links apart from other Moats' (6 characters). */
  readonly scope: string;
  /** The pool's network address and prefix length (IPv4, /30 per sandbox). */
  readonly pool: { readonly network: string; readonly prefixLength: number };
}

/** Whether namespaces with nftables can be made here, and why not. */
export function namespacesWork(): { ok: boolean; reason: string } {
  if (process.getuid?.() !== 0) return { ok: false, reason: 'Moat is not running as root' };
  for (const [tool, pkg] of [
    [IP, 'iproute2'],
    [NFT, 'nftables'],
    [NSENTER, 'util-linux'],
  ] as const) {
    if (!existsSync(tool))
      return { ok: false, reason: `${tool} is missing (Debian package ${pkg})` };
  }
  try {
    accessSync('/proc/sys/net/ipv4/ip_forward', constants.W_OK);
  } catch {
    return {
      ok: false,
      reason: '/proc/sys/net/ipv4/ip_forward is not writable (sandboxes could not be routed)',
    };
  }
  const probe = `moat-probe-${process.pid}`;
  try {
    execFileSync(IP, ['netns', 'add', probe], { stdio: 'pipe', timeout: COMMAND_TIMEOUT_MS });
    execFileSync(NSENTER, [`--net=${NETNS_DIR}/${probe}`, NFT, 'list', 'tables'], {
      stdio: 'pipe',
      timeout: COMMAND_TIMEOUT_MS,
    });
    return { ok: true, reason: 'network namespaces and nftables work' };
  } catch (error) {
    const stderr = (error as { stderr?: Buffer }).stderr?.toString().trim();
    return {
      ok: false,
      reason: `cannot make a network namespace with nftables: ${stderr || (error as Error).message}`,
    };
  } finally {
    try {
      execFileSync(IP, ['netns', 'delete', probe], {
        stdio: 'ignore',
        timeout: COMMAND_TIMEOUT_MS,
      });
    } catch {
      // It was never made.
    }
  }
}

/** Runs a command to its end: its output, or an error naming the command and its complaint. */
function run(file: string, args: readonly string[], input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    // An `ss` listing of a sandbox's sockets is the largest output: about 100 bytes a socket.
    const options = { timeout: COMMAND_TIMEOUT_MS, maxBuffer: 64 * 1024 * 1024 };
    const child = execFile(file, args, options, (error, out, stderr) => {
      if (error === null) return resolve(String(out));
      const detail = String(stderr).trim() || error.message;
      reject(new Error(`${[file, ...args].join(' ')}: ${detail}`));
    });
    if (input !== undefined) child.stdin!.end(input);
  });
}

/** A device's outgoing rate held to `mbps` by a token bucket; 0 removes the limit. */
async function limitDevice(where: string[], device: string, mbps: number): Promise<void> {
  if (mbps > 0) {
    const bytesPerSecond = (mbps * 1_000_000) / 8;
    // 20 ms at the rate, and never less than a few full-size (GSO) packets.
    const burst = Math.max(32 * 1024, Math.ceil(bytesPerSecond / 50));
    const queue = Math.max(
      SHAPER_MIN_QUEUE_BYTES,
      Math.ceil(bytesPerSecond * SHAPER_LATENCY_SECONDS),
    );
    await run(TC, [
      ...where,
      ...['qdisc', 'replace', 'dev', device, 'root', 'tbf'],
      ...['rate', `${mbps}mbit`, 'burst', String(burst), 'limit', String(queue)],
    ]);
    return;
  }
  await run(TC, [...where, 'qdisc', 'del', 'dev', device, 'root']).catch((error: Error) => {
    // The device's own default queue, which tc cannot delete: there was no limit.
    if (!error.message.includes('handle of zero')) throw error;
  });
}

/** One established TCP connection of a sandbox, as seen from inside its namespace. */
export interface SandboxConnection {
  readonly local: HostPort;
  readonly peer: HostPort;
}

/**
 * `address:port` of an IPv4 socket end as ss prints it (IPv6 is off on sandbox links), in each
 * form a sandbox can give it: an IPv6 socket to an IPv4-mapped address prints as
 * `[::ffff:a.b.c.d]`, one bound to a device (SO_BINDTODEVICE, unprivileged) adds `%device`.
 */
function socketEnd(text: string | undefined): HostPort | undefined {
  const match =
    /^(?:(\d{1,3}(?:\.\d{1,3}){3})|\[::ffff:(\d{1,3}(?:\.\d{1,3}){3})\])(?:%[^\s:]+)?:(\d{1,5})$/.exec(
      text ?? '',
    );
  return match === null ? undefined : { host: (match[1] ?? match[2])!, port: Number(match[3]) };
}

const toWord = (text: string) =>
  text.split('.').reduce((word, part) => ((word << 8) | Number(part)) >>> 0, 0);
const toText = (word: number) =>
  [word >>> 24, (word >>> 16) & 255, (word >>> 8) & 255, word & 255].join('.');

interface Link {
  readonly namespace: string;
  readonly hostLink: string;
  /** The sandbox's end of the link, in its namespace. */
  readonly device: string;
  /** Set for guestLink "redirect": the guest's end of Moat's inner pair (the request's ifname). */
  readonly guest?: string;
  /** Set for a namespace Moat adopted: the path it was given, and what that named then. */
  readonly adopted?: { readonly netns: string; readonly identity: NamespaceIdentity };
  /** The sandbox end (its source address) and the host end. */
  readonly address: string;
  readonly host: string;
  readonly firewall: NftSession;
  /** Moat's listener inside the namespace for redirected TCP (listenInside), once opened. */
  inside?: Promise<net.Server>;
}

/**
 * Run by Node inside a sandbox's namespace: listens on a free port of its loopback and hands
 * the listening socket to Moat (its parent) over the IPC channel, then exits. Moat accepts on
 * it from then on, in the host's namespace.
 */
const LISTEN_INSIDE = `
const server = require('node:net').createServer();
server.on('error', (error) => { process.send({ error: error.message }); process.exit(1); });
server.listen({ host: '127.0.0.1', port: 0 }, () => {
  process.send({ port: server.address().port }, server, () => process.exit(0));
});
`;

export class NamespaceNetwork {
  /** Moat's address for its sandboxes: the pool's first address. */
  readonly gateway: string;
  /** Host-side link names start with this. */
  readonly linkPrefix: string;
  /** The nftables table (family inet) holding the host's side of the links. */
  readonly hostTable: string;
  private readonly namespacePrefix: string;
  private readonly base: number;
  private readonly links = new Map<string, Link>();
  /** The reader of every namespace's direct-flow log, once asked for (readDirectFlows). */
  private flowLog: DirectFlowLog | undefined;
  private readonly hostFirewall: NftSession;
  /** Two Moats on one gateway address would undo each other: one pool per Moat. */
  private readonly lock: RangeLock;

  constructor(private readonly options: NamespaceNetworkOptions) {
    this.base = toWord(options.pool.network);
    this.gateway = toText(this.base + 1);
    // Interface names have at most 15 characters: "mt" + 6 + "-" + up to 6 hex digits of slot.
    this.linkPrefix = `mt${options.scope}-`;
    this.namespacePrefix = `moat-${options.scope}-`;
    this.hostTable = `moat_${options.scope}`;
    this.hostFirewall = new NftSession(undefined, 'the host namespace');
    const size = 2 ** (32 - options.pool.prefixLength);
    this.lock = new RangeLock(
      'pool',
      this.base,
      this.base + size - 1,
      `the namespace pool ${this.pool}`,
      'give each Moat on a host its own, disjoint --namespace-pool',
      (start, end) => `${toText(start)}/${32 - Math.log2(end - start + 1)}`,
    );
  }

  /** The pool, as CIDR text. */
  get pool(): string {
    return `${this.options.pool.network}/${this.options.pool.prefixLength}`;
  }

  /** The namespace file a sandbox's processes enter. */
  namespaceOf(sandboxID: string): string | undefined {
    const link = this.links.get(sandboxID);
    return link && `${NETNS_DIR}/${link.namespace}`;
  }

  /**
   * Gives the host its gateway address and lets it forward sandbox traffic, after removing every
   * namespace an earlier run of this Moat left (their processes did not survive it).
   */
  async prepare(): Promise<string[]> {
    await this.lock.acquire();
    const removed = await this.sweep();
    // Written only when off: a host that forwards already is left untouched.
    const forwarding = '/proc/sys/net/ipv4/ip_forward';
    if ((await readFile(forwarding, 'utf8')).trim() !== '1') await writeFile(forwarding, '1\n');
    await run(IP, ['addr', 'replace', `${this.gateway}/32`, 'dev', 'lo']);
    return removed;
  }

  /**
   * Records the direct flows every namespace's firewall logs from now on (made or not yet):
   * one reader for all of them, ended by `stop`.
   */
  readDirectFlows(onFlow: (flow: DirectFlow) => void, onProblem: (message: string) => void): void {
    if (this.flowLog !== undefined) return;
    this.flowLog = new DirectFlowLog(onFlow, onProblem);
    for (const [sandboxID, link] of this.links)
      this.flowLog.add(sandboxID, `${NETNS_DIR}/${link.namespace}`);
  }

  /** Applies nft commands in the host's namespace (the host side of sandbox links). */
  host(commands: string): Promise<void> {
    return this.hostFirewall.run(commands);
  }

  /** Makes the sandbox's namespace and link; no destination is reachable until its firewall is written. */
  async create(sandboxID: string, address: string): Promise<void> {
    await this.destroy(sandboxID);
    const link = this.linkFor(sandboxID, address, OWN_DEVICE);
    this.links.set(sandboxID, link);
    try {
      await run(IP, ['netns', 'add', link.namespace]);
      await this.connect(sandboxID, link, true);
    } catch (error) {
      await this.destroy(sandboxID);
      throw error;
    }
  }

  /**
   * Adopts the network namespace `request.netns` names for a network-only sandbox: Moat's own
   * handle on it (a bind mount under its scope's name, so every later command reaches that
   * namespace even if the path is re-used), and a link like a sandbox's own, whose end in the
   * namespace is `request.ifname`. With `expected` (a restart), only the namespace of that
   * identity is adopted. Refuses (AdoptRefused, nothing changed) a path that names no network
   * namespace, Moat's, the host's, one of its sandboxes', or one holding `ifname` already.
   * Adoptions run one at a time, so two cannot take one namespace.
   */
  adopt(
    sandboxID: string,
    request: AdoptRequest,
    address: string,
    expected?: NamespaceIdentity,
  ): Promise<NamespaceIdentity> {
    const adopting = this.adopting.then(() => this.adoptNow(sandboxID, request, address, expected));
    this.adopting = adopting.catch(() => undefined);
    return adopting;
  }

  private adopting: Promise<unknown> = Promise.resolve();

  private async adoptNow(
    sandboxID: string,
    request: AdoptRequest,
    address: string,
    expected: NamespaceIdentity | undefined,
  ): Promise<NamespaceIdentity> {
    const { netns, ifname } = request;
    const devices = devicesOf(request);
    const identity = await namespaceFile(netns);
    if (expected !== undefined && !sameNamespace(identity, expected))
      throw new AdoptRefused(`netns ${netns} names another namespace than the one adopted`);
    await refuseHostNamespaces(netns, identity);
    for (const [other, link] of this.links) {
      const held = await identityOf(`${NETNS_DIR}/${link.namespace}`);
      if (held === undefined || !sameNamespace(held, identity)) continue;
      throw new AdoptRefused(
        link.adopted
          ? `netns ${netns} is already adopted by sandbox ${other}`
          : `netns ${netns} is the network namespace of Moat's sandbox ${other}`,
      );
    }
    // Entering it tells a network namespace from another kind, and lists its interfaces.
    const names = await run(NSENTER, [`--net=${netns}`, '--', IP, '-o', 'link', 'show']).catch(
      () => {
        throw new AdoptRefused(`netns ${netns} is not a network namespace`);
      },
    );
    // `-o` lines: "<index>: <name>[@<peer>]: <flags> ..."
    const peers = new Map(
      names
        .split('\n')
        .map((line) => line.split(': ')[1]?.split('@') ?? [])
        .filter((parts) => parts[0] !== undefined)
        .map(([name, peer]) => [name!, peer] as const),
    );
    // An inner pair an earlier adoption left (Moat stopped; see sweep) is taken over as it is:
    // the runtime's tc filters on `ifname` live as long as that device does.
    const innerKept =
      request.guestLink === 'redirect' &&
      peers.get(ifname) === INNER_DEVICE &&
      peers.get(INNER_DEVICE) === ifname;
    for (const device of devices) {
      if (innerKept && (device === ifname || device === INNER_DEVICE)) continue;
      if (peers.has(device))
        throw new AdoptRefused(`netns ${netns} already has an interface named ${device}`);
    }
    await this.destroy(sandboxID);
    const link = {
      ...this.linkFor(sandboxID, address, uplinkOf(request), { netns, identity }),
      ...(request.guestLink === 'redirect' ? { guest: ifname } : {}),
    };
    const handle = `${NETNS_DIR}/${link.namespace}`;
    this.links.set(sandboxID, link);
    try {
      // An empty file to mount on, as `ip netns add` makes (and `ip netns delete` removes).
      await run('/bin/sh', ['-ec', `mkdir -p ${NETNS_DIR}; : > ${handle}`]);
      await run(MOUNT, ['--bind', netns, handle]);
      const held = await identityOf(handle);
      if (held === undefined || !sameNamespace(held, identity))
        throw new AdoptRefused(`netns ${netns} changed while it was being adopted`);
      await this.connect(sandboxID, link, false);
      return identity;
    } catch (error) {
      await this.destroy(sandboxID);
      throw error;
    }
  }

  /** The names of a sandbox's link and namespace handle: the slot of its address. */
  private linkFor(
    sandboxID: string,
    address: string,
    device: string,
    adopted?: Link['adopted'],
  ): Link {
    const offset = toWord(address) - this.base;
    const slot = (offset - 2) / 4;
    if (!Number.isInteger(slot) || slot < 1 || slot >= 0x1000000) {
      throw new Error(
        `sandbox address ${address} is not a link address of the pool ${this.options.pool.network}/${this.options.pool.prefixLength}`,
      );
    }
    const namespace = `${this.namespacePrefix}${slot}`;
    return {
      namespace,
      hostLink: `${this.linkPrefix}${slot.toString(16)}`,
      device,
      ...(adopted === undefined ? {} : { adopted }),
      address,
      host: toText(toWord(address) - 1),
      firewall: new NftSession(
        `${NETNS_DIR}/${namespace}`,
        `the namespace of sandbox ${sandboxID}`,
      ),
    };
  }

  /**
   * Links the host to the namespace (its handle made): a veth pair, the /30, IPv6 off on the
   * sandbox's end before it comes up, the default route to the host. `ownLoopback`: the
   * namespace is Moat's, and its loopback is brought up (an adopted one's is its owner's).
   */
  private async connect(sandboxID: string, link: Link, ownLoopback: boolean): Promise<void> {
    const { namespace, hostLink, host, address, device, guest } = link;
    if (link.adopted) await link.firewall.run(HOLD_FIREWALL);
    const ipv6Off = (name: string) =>
      // (Hosts booted without IPv6 have no such file, and nothing to switch off.)
      `f=/proc/sys/net/ipv6/conf/${name}/disable_ipv6; if [ -e $f ]; then echo 1 > $f; fi`;
    // guestLink "redirect": the guest's end and Moat's inner end, the guest routed from the
    // latter through this namespace (forwarding on here only) to Moat's link.
    const inner =
      guest === undefined
        ? []
        : [
            `${IP} link show dev ${INNER_DEVICE} >/dev/null 2>&1 || ${IP} link add ${INNER_DEVICE} type veth peer name ${guest}`,
            ipv6Off(INNER_DEVICE),
            ipv6Off(guest),
            `${IP} addr replace ${INNER_LINK.router}/${INNER_LINK.prefixLength} dev ${INNER_DEVICE}`,
            `${IP} link set ${guest} up`,
            `${IP} link set ${INNER_DEVICE} up`,
            'echo 1 > /proc/sys/net/ipv4/ip_forward',
          ];
    await run(
      IP,
      ['-batch', '-'],
      [
        `link add ${hostLink} type veth peer name ${device} netns ${namespace}`,
        `addr add ${host}/30 dev ${hostLink}`,
        `link set ${hostLink} up`,
      ].join('\n'),
    );
    await run(NSENTER, [
      `--net=${NETNS_DIR}/${namespace}`,
      '--',
      '/bin/sh',
      '-ec',
      [
        ipv6Off(device),
        ...(ownLoopback ? [`${IP} link set lo up`, CONNTRACK_LIBERAL] : []),
        `${IP} addr add ${address}/30 dev ${device}`,
        `${IP} link set ${device} up`,
        // An adopted namespace's own default route, if it had one, is replaced: Moat is its way out.
        `${IP} route replace default via ${host} dev ${device}`,
        ...inner,
      ].join('\n'),
    ]);
    this.flowLog?.add(sandboxID, `${NETNS_DIR}/${namespace}`);
  }

  /**
   * The adopted namespaces whose path no longer names what was adopted (the runtime that made
   * it deleted it, its process ended), each with why.
   */
  async lost(): Promise<Map<string, string>> {
    const lost = new Map<string, string>();
    for (const [sandboxID, { adopted }] of this.links) {
      if (adopted === undefined) continue;
      const now = await identityOf(adopted.netns);
      if (now === undefined) lost.set(sandboxID, `netns ${adopted.netns} no longer exists`);
      else if (!sameNamespace(now, adopted.identity))
        lost.set(sandboxID, `netns ${adopted.netns} now names another namespace`);
    }
    return lost;
  }

  /** Applies nft commands in the sandbox's namespace. */
  firewall(sandboxID: string, commands: string): Promise<void> {
    const link = this.links.get(sandboxID);
    if (link === undefined)
      return Promise.reject(new Error(`sandbox ${sandboxID} has no network namespace`));
    return link.firewall.run(commands);
  }

  /**
   * Holds the sandbox's link to `egressMbps` out and `ingressMbps` in (0: unlimited), replacing
   * any earlier limits: a token bucket (tbf) where each direction leaves a namespace, the
   * sandbox's end for what it sends, the host's end for what it receives. The sandbox holds no
   * capability over its own namespace's devices, so it cannot lift either.
   */
  async limitBandwidth(sandboxID: string, egressMbps: number, ingressMbps: number): Promise<void> {
    const link = this.links.get(sandboxID);
    if (link === undefined) throw new Error(`sandbox ${sandboxID} has no network namespace`);
    await limitDevice(['-n', link.namespace], link.device, egressMbps);
    await limitDevice([], link.hostLink, ingressMbps);
  }

  /** What a listing nft command prints in the sandbox's namespace (its budget counters). */
  firewallListing(sandboxID: string, command: string): Promise<string> {
    const link = this.links.get(sandboxID);
    if (link === undefined)
      return Promise.reject(new Error(`sandbox ${sandboxID} has no network namespace`));
    return link.firewall.read(command);
  }

  /** The sandboxes that have a namespace here. */
  sandboxes(): string[] {
    return [...this.links.keys()];
  }

  /**
   * A listening socket on the loopback of the sandbox's namespace, made there and accepted on by
   * Moat: connections the sandbox's firewall redirects to it keep their original destination
   * in that namespace's conntrack (the NAT happened there), which a listener in the host's
   * namespace could not read. Opened once per sandbox; closed with the namespace.
   */
  listenInside(sandboxID: string): Promise<net.Server> {
    const link = this.links.get(sandboxID);
    if (link === undefined)
      return Promise.reject(new Error(`sandbox ${sandboxID} has no network namespace`));
    if (link.inside !== undefined) return link.inside;
    const opening = new Promise<net.Server>((resolve, reject) => {
      const child = spawn(
        NSENTER,
        [`--net=${NETNS_DIR}/${link.namespace}`, '--', process.execPath, '-e', LISTEN_INSIDE],
        { stdio: ['ignore', 'ignore', 'ignore', 'ipc'], timeout: COMMAND_TIMEOUT_MS },
      );
      const where = `a listener in the namespace of sandbox ${sandboxID}`;
      child.on('message', (message: { error?: string }, handle?: net.Server) => {
        if (handle !== undefined) resolve(handle);
        else
          reject(new Error(`${where} could not be opened: ${message.error ?? 'no socket came'}`));
      });
      child.on('error', (error) => reject(new Error(`${where}: ${error.message}`)));
      child.on('exit', (code, signal) =>
        reject(new Error(`${where} could not be opened (its helper ended: ${signal ?? code})`)),
      );
    });
    link.inside = opening;
    opening.catch(() => {
      if (link.inside === opening) link.inside = undefined; // the next call tries again
    });
    return link.inside;
  }

  /**
   * The open TCP connections (OPEN_STATES) the sandbox opened from its link address, as its
   * own view shows them (a connection its firewall redirected to Moat shows its original
   * destination). Left out: Moat's ingress (from the link's host end), Moat's listeners on the
   * gateway (never the sandbox's to lose), and the sandbox's own addresses (over its loopback,
   * no firewall decides those). Rejects a listing larger than 64 MiB.
   */
  async sandboxConnections(sandboxID: string): Promise<SandboxConnection[]> {
    const link = this.links.get(sandboxID);
    if (link === undefined) return [];
    // The kernel filters (sock_diag bytecode): sockets the sandbox holds in numbers on its
    // loopback are neither printed nor parsed.
    const filter = [link.host, this.gateway, link.address, '127.0.0.0/8']
      .map((address) => `not dst ${address}`)
      .join(' and ');
    // -H: no heading; lines are: State Recv-Q Send-Q Local:Port Peer:Port.
    const listing = await run(NSENTER, [
      ...this.ssIn(link),
      '-tnH',
      ...OPEN_STATES,
      `src ${link.address} and ${filter}`,
    ]);
    const connections: SandboxConnection[] = [];
    for (const line of listing.split('\n')) {
      const [, , , localText, peerText] = line.trim().split(/\s+/);
      const local = socketEnd(localText);
      const peer = socketEnd(peerText);
      if (local !== undefined && peer !== undefined) connections.push({ local, peer });
    }
    return connections;
  }

  /**
   * Ends `connections` (from sandboxConnections) at once by sock_diag's destroy (`ss -K`) in
   * the sandbox's namespace: their sockets get a reset now, instead of at their next send (a
   * socket waiting for an answer the firewall now drops would wait for its retransmission
   * timeout, 200 ms or more; one only reading would wait forever).
   */
  async endConnections(
    sandboxID: string,
    connections: readonly SandboxConnection[],
  ): Promise<void> {
    const link = this.links.get(sandboxID);
    if (link === undefined) return;
    const filters = connections.map(
      ({ local, peer }) => `( src ${local.host}:${local.port} and dst ${peer.host}:${peer.port} )`,
    );
    for (let i = 0; i < filters.length; i += END_BATCH) {
      const filter = filters.slice(i, i + END_BATCH).join(' or ');
      await run(NSENTER, [...this.ssIn(link), '-K', '-tnH', ...OPEN_STATES, filter]);
    }
  }

  private ssIn(link: Link): string[] {
    return [`--net=${NETNS_DIR}/${link.namespace}`, '--', SS];
  }

  /** Removes the sandbox's namespace and link. Idempotent. */
  async destroy(sandboxID: string): Promise<void> {
    const link = this.links.get(sandboxID);
    if (link === undefined) return;
    this.links.delete(sandboxID);
    this.flowLog?.remove(sandboxID);
    link.firewall.close();
    // A socket open in the namespace would keep it alive.
    void link.inside?.then(
      (server) => server.close(),
      () => undefined,
    );
    await this.removeNamespace(link.namespace, link.hostLink, async () => {
      // An adopted namespace stays; Moat's firewall in it goes (`ip netns delete` of the handle
      // only unmounts it), and a detached guest's inner pair (`sweep`, when Moat stops, leaves
      // it for the next).
      if (link.adopted) await this.removeFirewall(link.namespace);
      if (link.guest !== undefined)
        await run(NSENTER, [
          `--net=${NETNS_DIR}/${link.namespace}`,
          '--',
          IP,
          'link',
          'delete',
          INNER_DEVICE,
        ]).catch(() => undefined);
    });
  }

  /** Removes every namespace and link of this scope, known or not; returns the namespaces. */
  async sweep(): Promise<string[]> {
    for (const link of this.links.values()) {
      link.firewall.close();
      void link.inside?.then(
        (server) => server.close(),
        () => undefined,
      );
    }
    this.links.clear();
    const names = (await readdir(NETNS_DIR).catch(() => [] as string[])).filter((n) =>
      n.startsWith(this.namespacePrefix),
    );
    for (const name of names) {
      const slot = Number(name.slice(this.namespacePrefix.length));
      // Whether the namespace was Moat's or adopted, its firewall goes: an adopted one stays.
      await this.removeNamespace(name, `${this.linkPrefix}${slot.toString(16)}`, () =>
        this.removeFirewall(name),
      );
    }
    return names;
  }

  /** Removes the sandboxes' namespaces, the host's table and the gateway address. */
  async stop(removeHostRules: string): Promise<void> {
    this.flowLog?.close();
    this.flowLog = undefined;
    if (!this.lock.isHeld) return;
    await this.sweep();
    await this.hostFirewall.run(removeHostRules).catch(() => undefined);
    this.hostFirewall.close();
    await run(IP, ['addr', 'del', `${this.gateway}/32`, 'dev', 'lo']).catch(() => undefined);
    await this.lock.release();
  }

  private async removeFirewall(namespace: string): Promise<void> {
    await run(NSENTER, [`--net=${NETNS_DIR}/${namespace}`, NFT, REMOVE_FIREWALL]).catch(
      () => undefined,
    );
  }

  /**
   * Removes the host's end of the link, then runs `tidy` (what Moat leaves in the namespace),
   * then the namespace's handle. The link first: it is the namespace's only way out, so nothing
   * leaves it while its firewall is taken out; and deleting a namespace frees its devices later,
   * in the background, while the slot may be handed out again before that.
   */
  private async removeNamespace(
    namespace: string,
    hostLink: string,
    tidy?: () => Promise<void>,
  ): Promise<void> {
    await run(IP, ['link', 'delete', hostLink]).catch(() => undefined);
    await tidy?.();
    await run(IP, ['netns', 'delete', namespace]).catch(() => undefined);
  }
}
