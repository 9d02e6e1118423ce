/**
 * A "guest" behind a sandbox's network namespace, as a VM's tap or a container's bridge puts one
 * there: a namespace this test makes, linked by a veth pair to the sandbox's namespace (given by
 * any path: /run/netns/<name>, /proc/<pid>/ns/net), on its own subnet, with its default route
 * via the sandbox's end. Forwarding is switched on inside the sandbox's namespace only. The
 * guest's programs run as an unprivileged user (nobody), so only the sandbox's namespace can
 * hold them.
 *
 * `uplink` adds what a VM runtime's own uplink would be: a third namespace ("outside") linked
 * to the sandbox's namespace on another subnet, which must not become a way around Moat.
 *
 * `redirected` makes instead a guest joined below the IP stack, as firecracker-containerd's
 * tc-redirect-tap joins a VM's tap: a veth pair standing in for the tap (one end in the sandbox's
 * namespace, the other the guest's eth0), and tc mirroring that end and the CNI interface both
 * ways; the guest holds the address and router a CNI result gave.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';

const IP = '/usr/sbin/ip';
const NSENTER = '/usr/bin/nsenter';
const SETPRIV = '/usr/bin/setpriv';
/** nobody: holds no capability in any namespace. */
const GUEST_USER = ['--reuid=65534', '--regid=65534', '--clear-groups', '--inh-caps=-all'];
/** A command prefix that runs what follows as nobody. */
export const AS_NOBODY: readonly string[] = [SETPRIV, ...GUEST_USER];

export interface Ran {
  readonly code: number;
  readonly out: string;
  readonly err: string;
  readonly ms: number;
}

/** A Python program as one argument list for the guest's interpreter (no shell quoting). */
const pythonArgs = (code: string) => ['/usr/bin/python3', '-u', '-c', code];

/** Runs a command as root inside the namespace at `netns`: its output, or an error naming it. */
const inside = (netns: string, args: string[], input?: string) =>
  execFileSync(NSENTER, [`--net=${netns}`, '--', ...args], {
    encoding: 'utf8',
    stdio: 'pipe',
    input,
    timeout: 10_000,
  });

export class GuestBehind {
  /** The guest's address, and the sandbox namespace's end of the guest's link (its router). */
  readonly address: string;
  readonly router: string;
  /** With `uplink`: the outside's address, reached from the sandbox's namespace only by that link. */
  readonly outside?: string;

  private constructor(
    /** The guest's namespace, under /run/netns. */
    readonly namespace: string,
    private readonly sandboxNetns: string,
    private readonly links: readonly string[],
    ends: { address: string; router: string; outside?: string },
  ) {
    this.address = ends.address;
    this.router = ends.router;
    this.outside = ends.outside;
  }

  /** The path of a namespace this support made. */
  get netns(): string {
    return `/run/netns/${this.namespace}`;
  }

  /**
   * `tag`: a few characters naming this guest apart from others (device names hold 15);
   * `sandboxNetns`: the sandbox's namespace; `subnet`: the guest's /24 without its last part.
   */
  static create(
    tag: string,
    sandboxNetns: string,
    options: { subnet?: string; uplink?: string } = {},
  ): GuestBehind {
    const subnet = options.subnet ?? '192.168.77';
    const namespace = `moat-guest-${tag}`;
    const link = `mg${tag}`.slice(0, 15);
    const up = `mu${tag}`.slice(0, 15);
    const guest = new GuestBehind(
      namespace,
      sandboxNetns,
      options.uplink === undefined ? [link] : [link, up],
      {
        address: `${subnet}.2`,
        router: `${subnet}.1`,
        ...(options.uplink === undefined ? {} : { outside: `${options.uplink}.2` }),
      },
    );
    GuestBehind.remove(namespace, sandboxNetns, [link, up]);
    try {
      execFileSync(IP, ['netns', 'add', namespace], { stdio: 'pipe' });
      if (options.uplink !== undefined)
        execFileSync(IP, ['netns', 'add', `${namespace}-out`], { stdio: 'pipe' });
      // Made from inside the sandbox's namespace: `netns NAME` puts the far end in the guest's.
      const batch = [
        `link add ${link} type veth peer name eth0 netns ${namespace}`,
        `addr add ${guest.router}/24 dev ${link}`,
        `link set ${link} up`,
        ...(options.uplink === undefined
          ? []
          : [
              `link add ${up} type veth peer name eth0 netns ${namespace}-out`,
              `addr add ${options.uplink}.1/24 dev ${up}`,
              `link set ${up} up`,
            ]),
      ];
      inside(sandboxNetns, [IP, '-batch', '-'], batch.join('\n'));
      inside(sandboxNetns, ['/bin/sh', '-c', 'echo 1 > /proc/sys/net/ipv4/ip_forward']);
      const guestIp = (...args: string[]) => inside(guest.netns, [IP, ...args]);
      guestIp('link', 'set', 'lo', 'up');
      guestIp('addr', 'add', `${guest.address}/24`, 'dev', 'eth0');
      guestIp('link', 'set', 'eth0', 'up');
      guestIp('route', 'add', 'default', 'via', guest.router);
      if (options.uplink !== undefined) {
        const outside = `/run/netns/${namespace}-out`;
        inside(outside, [IP, 'link', 'set', 'lo', 'up']);
        inside(outside, [IP, 'addr', 'add', `${options.uplink}.2/24`, 'dev', 'eth0']);
        inside(outside, [IP, 'link', 'set', 'eth0', 'up']);
        inside(outside, [IP, 'route', 'add', 'default', 'via', `${options.uplink}.1`]);
      }
    } catch (error) {
      guest.close();
      throw error;
    }
    return guest;
  }

  /**
   * A guest joined to `ifname` of the sandbox's namespace by tc redirects (see the top), with
   * `address` (CIDR) and its default route via `router`, as the CNI result says.
   */
  static redirected(
    tag: string,
    sandboxNetns: string,
    ifname: string,
    address: string,
    router: string,
  ): GuestBehind {
    const namespace = `moat-guest-${tag}`;
    const tap = `mt${tag}`.slice(0, 15);
    const guest = new GuestBehind(namespace, sandboxNetns, [tap], {
      address: address.split('/')[0]!,
      router,
    });
    GuestBehind.remove(namespace, sandboxNetns, [tap]);
    try {
      execFileSync(IP, ['netns', 'add', namespace], { stdio: 'pipe' });
      inside(
        sandboxNetns,
        [IP, '-batch', '-'],
        [`link add ${tap} type veth peer name eth0 netns ${namespace}`, `link set ${tap} up`].join(
          '\n',
        ),
      );
      // What tc-redirect-tap adds: each device's ingress leaves by the other's egress.
      for (const [from, to] of [
        [ifname, tap],
        [tap, ifname],
      ]) {
        inside(sandboxNetns, ['/usr/sbin/tc', 'qdisc', 'add', 'dev', from!, 'ingress']);
        inside(sandboxNetns, [
          ...['/usr/sbin/tc', 'filter', 'add', 'dev', from!, 'parent', 'ffff:', 'protocol', 'all'],
          ...['u32', 'match', 'u8', '0', '0', 'action', 'mirred', 'egress', 'redirect'],
          ...['dev', to!],
        ]);
      }
      const guestIp = (...args: string[]) => inside(guest.netns, [IP, ...args]);
      guestIp('link', 'set', 'lo', 'up');
      guestIp('addr', 'add', address, 'dev', 'eth0');
      guestIp('link', 'set', 'eth0', 'up');
      guestIp('route', 'add', 'default', 'via', router);
    } catch (error) {
      guest.close();
      throw error;
    }
    return guest;
  }

  /** Runs a Python program in the guest as nobody; a failing exit is a result, not an error. */
  run(code: string, timeoutMs = 15_000): Promise<Ran> {
    const started = performance.now();
    const child = this.spawn(code);
    let out = '';
    let err = '';
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => (out += chunk));
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (err += chunk));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    return new Promise((resolve, reject) => {
      child.on('error', reject);
      child.on('close', (code) => {
        clearTimeout(timer);
        resolve({ code: code ?? -1, out, err, ms: performance.now() - started });
      });
    });
  }

  /** Starts a Python program in the guest as nobody (stdout and stderr piped). */
  spawn(code: string): ChildProcess {
    return spawn(
      NSENTER,
      [`--net=${this.netns}`, '--', SETPRIV, ...GUEST_USER, ...pythonArgs(code)],
      {
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
  }

  /** Starts a Python program as root in the outside namespace (`uplink`). */
  spawnOutside(code: string): ChildProcess {
    return spawn(NSENTER, [`--net=${this.netns}-out`, '--', ...pythonArgs(code)], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
  }

  /** Removes the guest's (and the outside's) namespace and links; idempotent. */
  close(): void {
    GuestBehind.remove(this.namespace, this.sandboxNetns, this.links);
  }

  private static remove(namespace: string, sandboxNetns: string, links: readonly string[]): void {
    for (const link of links) {
      try {
        inside(sandboxNetns, [IP, 'link', 'delete', link]);
      } catch {
        // Not there (or the sandbox's namespace is gone, and its links with it).
      }
    }
    for (const name of [namespace, `${namespace}-out`]) {
      try {
        execFileSync(IP, ['netns', 'delete', name], { stdio: 'pipe' });
      } catch {
        // Not there.
      }
    }
  }
}

/* Probes: Python programs for GuestBehind.run, each printing what it got. */

/** Python: `ask(server, name)` -> "rcode answers", one DNS question (type A) over UDP. */
export const DNS = [
  'import socket, struct',
  'def ask(server, name):',
  "  q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0) + b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\\x00' + struct.pack('>HH', 1, 1)",
  '  s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)',
  '  s.sendto(q, (server, 53)); r = s.recv(512)',
  '  return r, f\'{r[3] & 15} {struct.unpack(">H", r[6:8])[0]}\'',
  'def resolve(server, name):',
  '  r, _ = ask(server, name)',
  '  return socket.inet_ntoa(r[-4:])',
].join('\n');

/** A Python string literal. */
export const text = (value: string) => JSON.stringify(value);

/**
 * An HTTP GET with this Host to `address` (a Python expression) and port; prints the body, or
 * the error's class.
 */
export const get = (address: string, host: string, port = 80) =>
  [
    'import socket',
    'try:',
    `  s = socket.create_connection((${address}, ${port}), timeout=5)`,
    `  s.sendall(b'GET / HTTP/1.1\\r\\nHost: ${host}\\r\\nConnection: close\\r\\n\\r\\n')`,
    "  data = b''",
    '  while True:',
    '    chunk = s.recv(4096)',
    '    if not chunk: break',
    '    data += chunk',
    "  print(data.split(b'\\r\\n\\r\\n', 1)[1].decode(), end='')",
    'except OSError as e: print(type(e).__name__)',
  ].join('\n');

/**
 * A TCP connection to each target at once (a thread each, so silent drops cost one 3 s timeout,
 * not one each), sending `ping`: prints per target, in their order, the first bytes it answers,
 * `closed`, or the errno's name. Addresses are Python literals (`text`).
 */
export const tcpEchoEach = (targets: ReadonlyArray<readonly [address: string, port: number]>) =>
  [
    'import socket, threading',
    `targets = [${targets.map(([address, port]) => `(${address}, ${port})`).join(', ')}]`,
    'results = [None] * len(targets)',
    'def probe(i, address, port):',
    '  try:',
    '    s = socket.create_connection((address, port), timeout=3)',
    "    s.sendall(b'ping'); results[i] = s.recv(4).decode() or 'closed'",
    '  except OSError as e: results[i] = type(e).__name__',
    'threads = [threading.Thread(target=probe, args=(i, *t)) for i, t in enumerate(targets)]',
    'for t in threads: t.start()',
    'for t in threads: t.join()',
    'for result in results: print(result)',
  ].join('\n');

/** tcpEchoEach of one target. */
export const tcpEcho = (address: string, port: number) => tcpEchoEach([[address, port]]);

/** One UDP datagram to an echo, waiting for its answer: prints the answer or the errno. */
export const udpEcho = (address: string, port: number) =>
  [
    'import socket',
    's = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)',
    `s.connect(('${address}', ${port}))`,
    'try:',
    "  s.send(b'pong'); print(s.recv(16).decode())",
    'except OSError as e: print(e.errno)',
  ].join('\n');
