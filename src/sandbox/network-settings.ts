/** A sandbox's network settings between the wire, the store and the enforcement table. */
import type { Bandwidth, UpstreamProxy } from '../enforce/index.js';
import { canonicalRuleKeys, parseAuthority } from '../policy/index.js';
import type { EgressProxySettings, NetworkSettings, SandboxRecord } from './records.js';
import { type EgressRules, SandboxError } from './requests.js';

/** `network.rules` as stored: keys canonical, rules as written; nothing when there are none. */
export const storedRules = (
  rules: Readonly<Record<string, unknown>> | undefined,
): Pick<NetworkSettings, 'rules'> =>
  rules === undefined || Object.keys(rules).length === 0
    ? {}
    : { rules: canonicalRuleKeys(rules) as NetworkSettings['rules'] };

export const networkRules = (network: NetworkSettings): EgressRules => ({
  allowOut: network.allowOut,
  denyOut: network.denyOut,
  ...(network.rules === undefined ? {} : { rules: network.rules }),
  ...(network.allowInternetAccess === null
    ? {}
    : { allow_internet_access: network.allowInternetAccess }),
  ...(network.mode === undefined ? {} : { mode: network.mode }),
});

/** The bandwidth a sandbox is held to: what its settings name, the operator's default for the rest. */
export const bandwidthOf = (network: NetworkSettings, defaults: Bandwidth): Bandwidth => ({
  egressMbps: network.bandwidth?.egressMbps ?? defaults.egressMbps,
  ingressMbps: network.bandwidth?.ingressMbps ?? defaults.ingressMbps,
});

/** Each of a SOCKS5 username or password is one length byte's worth (RFC 1929). */
const MAX_CREDENTIAL_BYTES = 255;

/**
 * The upstream proxy of a create or PUT network body, checked (a 400 naming the field); null
 * or absent: none. Credentials are checked by size only and never quoted.
 */
export function upstreamProxy(
  settings: EgressProxySettings | null | undefined,
): UpstreamProxy | undefined {
  if (settings === null || settings === undefined) return undefined;
  const field = 'network.egressProxy';
  const at = parseAuthority(settings.address);
  if (!at.ok || at.value.port === undefined)
    throw new SandboxError(
      400,
      `${field}.address must be host:port or [ipv6]:port (e.g. proxy.example.com:1080): ${at.ok ? `${JSON.stringify(settings.address)} has no port` : at.error}`,
    );
  const { username, password } = settings;
  if (password !== undefined && username === undefined)
    throw new SandboxError(400, `${field}.password is only valid together with a username`);
  for (const [name, value] of [
    ['username', username],
    ['password', password],
  ] as const) {
    if (value === undefined) continue;
    const bytes = Buffer.byteLength(value);
    if (bytes === 0 || bytes > MAX_CREDENTIAL_BYTES)
      throw new SandboxError(
        400,
        `${field}.${name} must be 1 to ${MAX_CREDENTIAL_BYTES} bytes (it is ${bytes})`,
      );
  }
  return {
    address: settings.address,
    at: { ...at.value, port: at.value.port },
    ...(username === undefined ? {} : { username }),
    ...(password === undefined ? {} : { password }),
  };
}

/**
 * The upstream proxy a stored record names. It was checked when stored; one that no longer
 * parses is an error (the sandbox is not brought back), never a reason to go direct.
 */
export const storedUpstream = (record: SandboxRecord): UpstreamProxy | undefined =>
  upstreamProxy(record.network.egressProxy);
