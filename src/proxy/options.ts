/**
 * What the composition root hands the egress proxy and its listeners (a file of its own, below
 * egress.ts, connect.ts and intercept.ts, so that each of them can name the options).
 */
import type tls from 'node:tls';
import type { Logger } from 'pino';
import type { ConnectionBudget, EnforcementTable } from '../enforce/index.js';
import type { FlowRecorder } from '../flows/index.js';
import type { MoatMetrics } from '../metrics/index.js';
import type { CanonicalName, DestinationRules } from '../policy/index.js';
import type { Dialer } from './dial.js';
import type { FairShare } from './fair-share.js';
import type { TcpIoSetting } from './native-tcp.js';
import type { TunnelRegistry } from './tunnels.js';

export interface ProxyOptions {
  readonly table: EnforcementTable;
  readonly dialer: Dialer;
  readonly tunnels: TunnelRegistry;
  readonly metrics: MoatMetrics;
  readonly logger: Logger;
  /** Where every decision, and the close of every allowed connection, is recorded. */
  readonly flows: FlowRecorder;
  /** Close CONNECT tunnels whose TLS SNI (or port-80 Host) names another host than CONNECT did. */
  readonly checkServerName: boolean;
  readonly maxTunnelsPerSandbox: number;
  /** Sandboxes' shares of the event loop's costly work (requests, leaf mints); undefined: none. */
  readonly fairShare?: FairShare;
  /** Every connection to a listener is charged to its sandbox here, from accept to close. */
  readonly connections: ConnectionBudget;
  /**
   * A sandbox's source address proves who it is (namespace mode): a credential must be that
   * sandbox's own. Otherwise (sandboxes share the host network) the credential identifies.
   */
  readonly sourceIsProof: boolean;
  /** Time a client has to send its request head, or its first tunnel bytes when they are checked. */
  readonly handshakeTimeoutMs: number;
  /** Time a client has, after connecting, to send its first byte. */
  readonly firstByteTimeoutMs: number;
  /** Time a client connection may wait between two requests. */
  readonly keepAliveTimeoutMs: number;
  readonly idleTimeoutMs: number;
  /** Destination ports of traffic the kernel redirects to the transparent listener (443, 80). */
  readonly transparentPorts?: { readonly tls: number; readonly http: number };
  /** `auto` (default): the native relay where it loads; `node`: net.Server and net.Socket. */
  readonly tcpIo?: TcpIoSetting;
  /**
   * Secretless egress: TLS to a destination with a header rule is intercepted and the rule's
   * headers set on its requests. Undefined: every flow is a tunnel.
   */
  readonly injection?: HeaderInjection;
  /** PEM text of CAs trusted for origins of intercepted TLS, beside Node's roots. */
  readonly upstreamCa?: string;
  /**
   * Replace the secret values injected into a request by their placeholders in its response
   * (an echoing origin would otherwise hand them to the sandbox); asks origins for uncoded bodies.
   */
  readonly redactSecretsInResponses?: boolean;
}

/**
 * What secretless egress needs from the parts that own rules, secrets and Moat's CA (the
 * composition root passes them): the header rule of a destination, the certificate Moat
 * serves the sandbox for a name, and a secret's current value.
 */
export interface HeaderInjection {
  /** The header rule a sandbox has for a destination name; undefined: none (no interception). */
  transformFor(sandboxID: string, name: CanonicalName): DestinationRules | undefined;
  /** A TLS server context holding a leaf certificate for `name`, issued by Moat's CA. */
  leafContext(name: CanonicalName): Promise<tls.SecureContext>;
  /** A stored secret's current value, read for every request; undefined when none is stored. */
  secretValue(name: string): Promise<string | undefined>;
  /**
   * Every stored secret's name and current value, for the leak guard (a request Moat reads that
   * carries one to a destination not bound to it is refused). Undefined: no leak guard.
   */
  secretValues?(): Promise<ReadonlyMap<string, string>>;
  /**
   * The sandbox's workload identity token `name`, minted for a request now (or a cached one still
   * fresh); undefined when the sandbox defines no token of that name. Absent: identity is off.
   */
  identityToken?(sandboxID: string, name: string): Promise<string | undefined>;
}
