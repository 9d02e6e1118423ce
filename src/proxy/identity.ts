import type { EnforcedSandbox, EnforcementTable } from '../enforce/index.js';
import { parseIP } from '../policy/index.js';

export type Identity =
  | { readonly ok: true; readonly sandbox: EnforcedSandbox }
  /** `sandbox`: the sandbox at the source, when it sent a credential that is not its own. */
  | { readonly ok: false; readonly reason: string; readonly sandbox?: EnforcedSandbox };

const BASIC = 'Proxy-Authorization must be Basic base64(<sandboxID>:<egress secret>)';

/**
 * Ties a connection to a sandbox. Where the source address is proof (namespace mode: a sandbox
 * cannot send from another's link), a connection from a sandbox's address is that sandbox's,
 * and a credential it carries must be that sandbox's own: another sandbox's is refused (a
 * sandbox must not borrow another's policy). Elsewhere, `Proxy-Authorization: Basic
 * base64(<sandboxID>:<egress secret>)` identifies when present (a wrong secret is refused,
 * never retried by address), else the source address does. Anything else is unidentified and
 * refused (fail closed).
 */
export function identify(
  table: EnforcementTable,
  authorization: string | undefined,
  client: { readonly remoteAddress?: string | undefined },
  sourceIsProof: boolean,
): Identity {
  const bySource = (): EnforcedSandbox | undefined => {
    // Read only when needed: a socket's address is a system call.
    const remoteAddress = client.remoteAddress;
    const source = remoteAddress === undefined ? undefined : parseIP(remoteAddress);
    return source?.ok ? table.fromSource(source.value.text) : undefined;
  };
  const atSource = sourceIsProof ? bySource() : undefined;
  if (authorization !== undefined) {
    const credential = credentialOf(authorization);
    if (credential === undefined) return { ok: false, reason: BASIC };
    const sandbox = table.fromCredential(credential.sandboxID, credential.secret);
    if (sandbox === undefined)
      return { ok: false, reason: 'unknown sandbox or wrong egress secret' };
    if (atSource !== undefined && atSource !== sandbox)
      return {
        ok: false,
        reason: `the credential of sandbox ${sandbox.sandboxID} came from the address of sandbox ${atSource.sandboxID}`,
        sandbox: atSource,
      };
    return { ok: true, sandbox };
  }
  const sandbox = atSource ?? (sourceIsProof ? undefined : bySource());
  return sandbox
    ? { ok: true, sandbox }
    : { ok: false, reason: 'no Proxy-Authorization and the source address belongs to no sandbox' };
}

function credentialOf(authorization: string): { sandboxID: string; secret: string } | undefined {
  const match = /^basic\s+([A-Za-z0-9+/]+=*)\s*$/i.exec(authorization);
  if (!match) return undefined;
  const decoded = Buffer.from(match[1]!, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  if (colon < 1) return undefined;
  return { sandboxID: decoded.slice(0, colon), secret: decoded.slice(colon + 1) };
}
