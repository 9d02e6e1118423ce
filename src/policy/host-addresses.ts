/**
 * The host as a destination. Whatever a sandbox's policy says, it never reaches the host Moat
 * runs on through Moat: not the host's services, not Moat's own listeners, not the gateway or
 * another sandbox's link. This is decided before any policy, like the internal deny list, but
 * from facts only the running host knows (its interfaces, which come and go), so it is compiled
 * from a snapshot that the caller reads and renews. Pure: no I/O.
 */
import { type CIDR, type IPAddress, maskWords, parseCIDR } from './address.js';
import { AddressPrefixMap } from './address-prefix-map.js';
import type { Decision } from './policy.js';

/** One address of one of the host's interfaces, as the operating system lists it. */
export interface InterfaceAddress {
  readonly address: string;
  readonly prefixLength: number;
  /** A loopback interface: the kernel delivers its whole prefix locally (127.0.0.0/8). */
  readonly loopback: boolean;
}

export interface HostAddressOptions {
  /** The sandboxes' links and the gateway (namespace mode's pool): never a destination. */
  readonly sandboxLinks?: CIDR;
  /**
   * TCP ports of the host that the operator opened to sandboxes (`--allow-host-ports`): to
   * these, a host address is decided by the sandbox's policy like any other destination.
   */
  readonly openPorts?: ReadonlySet<number>;
}

export interface HostAddresses {
  /**
   * The deny for `ip` (and `port`) when it is the host itself or a sandbox link; undefined when
   * the policy decides. Without a port (an address in a DNS answer) no open port counts.
   */
  decide(ip: IPAddress, port?: number): Decision | undefined;
  /**
   * The deny for a connection found, once made, to have reached the host itself on `port` (its
   * two ends have one address: how the kernel sources a connection to a local address), whatever
   * the address; undefined on a port the operator opened.
   */
  reached(port: number): Decision | undefined;
}

const deny = (reason: string): Decision =>
  Object.freeze({ verdict: 'deny', list: 'host', rule: null, reason });

const HOST = deny(
  "the address is the host itself (one of its interfaces); no sandbox rule can open it, only the operator's --allow-host-ports",
);
const LINKS = deny(
  'the address is the gateway or a sandbox link (the host itself or another sandbox); no sandbox reaches those through Moat',
);
const UNSPECIFIED = deny('the unspecified address reaches the host itself');

/** Connecting to 0.0.0.0 or :: reaches this host, whatever its interfaces are. */
const ALWAYS: ReadonlyArray<readonly [string, Decision]> = [
  ['0.0.0.0/8', UNSPECIFIED],
  ['::/128', UNSPECIFIED],
];

/**
 * Compiles a snapshot of the host's addresses into the check every enforcement point makes:
 * its interfaces' addresses and the prefixes its local routes deliver to it (`ip route add
 * local 198.18.9.0/24 dev lo`, AnyIP: no interface lists those), as CIDR text.
 */
export function compileHostAddresses(
  interfaces: readonly InterfaceAddress[],
  options: HostAddressOptions = {},
  localRoutes: readonly string[] = [],
): HostAddresses {
  const map = new AddressPrefixMap<Decision>();
  const insert = (text: string, decision: Decision) => {
    const cidr = parseCIDR(text);
    if (!cidr.ok) throw new Error(`host address ${text}: ${cidr.error}`);
    map.insert(cidr.value, decision);
  };
  for (const [text, decision] of ALWAYS) insert(text, decision);
  const links = options.sandboxLinks;
  if (links !== undefined) map.insert(links, LINKS);
  for (const { address, prefixLength, loopback } of interfaces) {
    // The scope of a link-local address (fe80::1%eth0) is no part of the address.
    const bare = address.split('%')[0]!;
    const entry = parseCIDR(loopback ? `${bare}/${prefixLength}` : bare);
    if (!entry.ok) throw new Error(`interface address ${address}: ${entry.error}`);
    // The host's ends of sandbox links and the gateway stay LINKS: no port opens them.
    if (links !== undefined && inside(links, entry.value)) continue;
    map.insert(entry.value, HOST);
  }
  for (const prefix of localRoutes) {
    const entry = parseCIDR(prefix);
    if (!entry.ok) throw new Error(`local route ${prefix}: ${entry.error}`);
    if (links !== undefined && inside(links, entry.value)) continue;
    map.insert(entry.value, HOST);
  }
  const open = options.openPorts ?? new Set<number>();
  return {
    decide(ip, port) {
      const found = map.lookup(ip);
      if (found === HOST && port !== undefined && open.has(port)) return undefined;
      return found;
    },
    reached: (port) => (open.has(port) ? undefined : HOST),
  };
}

/** Whether `inner` lies wholly inside `outer`. */
const inside = (outer: CIDR, inner: CIDR): boolean =>
  outer.version === inner.version &&
  inner.prefixLength >= outer.prefixLength &&
  maskWords(inner.words, outer.prefixLength).every((word, i) => word === outer.words[i]);
