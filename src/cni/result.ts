/**
 * The ADD result: Moat's link as the CNI runtime should see it (the interface in the
 * container's namespace, its address, the default route through Moat and Moat's DNS), after
 * whatever a previous plugin of the chain reported.
 */
import type { Invocation, PluginConf } from './conf.js';
import type { CniResult } from './spec.js';

/** What a network-only create answer (and GET) says about the sandbox's link and egress. */
export interface AttachedSandbox {
  readonly sandboxID: string;
  readonly link: {
    netns: string;
    ifname: string;
    address: string;
    router: string;
    /** "redirect": ifname holds no address; the guest joined to it below the IP stack does. */
    guestLink?: string;
  };
  readonly egress?: { dns?: string; gateway?: string };
}

/** The link of a create or GET answer, or why the answer has none Moat's contract promises. */
export function attachedFrom(body: unknown): AttachedSandbox | string {
  const answer = body as Partial<AttachedSandbox> | undefined;
  const link = answer?.link;
  if (typeof answer?.sandboxID !== 'string') return 'the answer has no sandboxID';
  if (
    typeof link !== 'object' ||
    link === null ||
    ![link.netns, link.ifname, link.address, link.router].every((v) => typeof v === 'string')
  )
    return `the answer for sandbox ${answer.sandboxID} has no link {netns, ifname, address, router}`;
  return answer as AttachedSandbox;
}

/** The address part of `host:port` or `[v6]:port`. */
const hostOf = (hostPort: string): string =>
  hostPort.startsWith('[')
    ? hostPort.slice(1, hostPort.indexOf(']'))
    : hostPort.replace(/:\d+$/, '');

const loopback = (address: string) => address.startsWith('127.') || address === '::1';

/**
 * Where the container should send DNS: Moat's DNS address when the sandbox can reach it as
 * given, else the link's far end (Moat redirects DNS to any address to its interceptor).
 */
function nameserver(attached: AttachedSandbox): string {
  const candidates = [attached.egress?.dns, attached.egress?.gateway]
    .filter((v): v is string => typeof v === 'string' && v !== '')
    .map(hostOf)
    .filter((address) => !loopback(address));
  return candidates[0] ?? attached.link.router;
}

/** `mac`: the interface's hardware address, when it could be read. */
export function addResult(
  conf: PluginConf,
  invocation: Invocation,
  attached: AttachedSandbox,
  mac: string | undefined,
): CniResult {
  const prev = conf.prevResult ?? { cniVersion: conf.cniVersion };
  const interfaces = [
    ...(prev.interfaces ?? []),
    {
      name: attached.link.ifname,
      ...(mac === undefined ? {} : { mac }),
      sandbox: invocation.netns,
    },
  ];
  const ours = {
    address: attached.link.address,
    gateway: attached.link.router,
    interface: interfaces.length - 1,
    // Results before 1.0.0 say which IP version each address is.
    ...(conf.cniVersion === '1.0.0' ? {} : { version: '4' as const }),
  };
  return {
    cniVersion: conf.cniVersion,
    interfaces,
    ips: [...(prev.ips ?? []), ours],
    routes: [...(prev.routes ?? []), { dst: '0.0.0.0/0', gw: attached.link.router }],
    // Moat's DNS is the only one the sandbox may use: it replaces any earlier plugin's.
    dns: { nameservers: [nameserver(attached)] },
  };
}
