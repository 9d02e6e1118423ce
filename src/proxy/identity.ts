import type { EnforcedSandbox, EnforcementTable } from '../enforce/index.js';
import { parseIP } from '../policy/index.js';

export type Identity =
  | { readonly ok: true; readonly sandbox: EnforcedSandbox }
  | { readonly ok: false; readonly reason: string };

/**
 * Ties a connection to a sandbox: by `Proxy-Authorization: Basic base64(<sandboxID>:<egress
 * secret>)` when present (a wrong secret is refused, never retried by address), else by the
 * connection's source address. Anything else is unidentified and refused (fail closed).
 */
export function identify(
  table: EnforcementTable,
  authorization: string | undefined,
  client: { readonly remoteAddress?: string | undefined },
): Identity {
  if (authorization !== undefined) {
    const match = /^basic\s+([A-Za-z0-9+/]+=*)\s*$/i.exec(authorization);
    if (!match)
      return {
        ok: false,
        reason: 'Proxy-Authorization must be Basic base64(<sandboxID>:<egress secret>)',
      };
    const decoded = Buffer.from(match[1]!, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    if (colon < 1)
      return {
        ok: false,
        reason: 'Proxy-Authorization must be Basic base64(<sandboxID>:<egress secret>)',
      };
    const sandbox = table.fromCredential(decoded.slice(0, colon), decoded.slice(colon + 1));
    return sandbox
      ? { ok: true, sandbox }
      : { ok: false, reason: 'unknown sandbox or wrong egress secret' };
  }
  // Read only when needed: a socket's address is a system call.
  const remoteAddress = client.remoteAddress;
  const source = remoteAddress === undefined ? undefined : parseIP(remoteAddress);
  const sandbox = source?.ok ? table.fromSource(source.value.text) : undefined;
  return sandbox
    ? { ok: true, sandbox }
    : { ok: false, reason: 'no Proxy-Authorization and the source address belongs to no sandbox' };
}
