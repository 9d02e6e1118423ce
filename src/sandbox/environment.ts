import { formatHostPort, type HostPort } from '../net/index.js';
import type { SandboxEnvironment } from '../runtime/index.js';
import type { SandboxRecord } from './records.js';

/**
 * What every process of a sandbox finds in its environment: its create `envVars`, then the
 * egress proxy with its credential (both spellings: curl reads only the lower-case http_proxy).
 */
export function sandboxEnvironment(
  record: SandboxRecord,
  proxy: HostPort,
  trust: SandboxEnvironment,
): Record<string, string> {
  // Inside a namespace 127.0.0.1 is the sandbox's own; the proxy is on the gateway.
  const url = `http://${record.sandboxID}:${record.egressSecret}@${formatHostPort(proxy)}`;
  return {
    NO_PROXY: 'localhost,127.0.0.1,::1',
    no_proxy: 'localhost,127.0.0.1,::1',
    // Before envVars: a sandbox may name a bundle of its own.
    ...trust,
    ...record.envVars,
    HTTP_PROXY: url,
    HTTPS_PROXY: url,
    ALL_PROXY: url,
    http_proxy: url,
    https_proxy: url,
    all_proxy: url,
    E2B_SANDBOX: 'true',
    E2B_SANDBOX_ID: record.sandboxID,
  };
}
