/** Moat's listeners: where each ended up, binding with errors that name it, and their guard. */
import type { MoatConfig } from '../config.js';
import {
  listenerGuardRuleset,
  listenerGuardTable,
  overlappingListenerGuards,
  removeListenerGuard,
} from '../enforce/index.js';
import { formatHostPort, type HostPort, listenFailure } from '../net/index.js';
import { listNftTables, NftSession, type SandboxRuntime } from '../runtime/index.js';

export interface Listening {
  dns: HostPort;
  proxy: HostPort;
  transparent: HostPort | undefined;
  api: HostPort;
  sandbox: HostPort;
  /** The separate GET /metrics listener; undefined when switched off. */
  metrics: HostPort | undefined;
  /** Where namespaced sandboxes reach Moat; undefined when sandboxes share the host network. */
  gateway: { dns: HostPort; proxy: HostPort; transparent: HostPort } | undefined;
}

export const UNSPECIFIED = new Set(['0.0.0.0', '::']);

/** Binds one listener; a failure names the listener and its address (`cannot start:` says which). */
export const bindListener = <T>(
  listener: string,
  at: HostPort,
  bind: () => Promise<T>,
): Promise<T> =>
  bind().catch((error: unknown) => {
    throw listenFailure(listener, at, error);
  });

/** Every listener of Moat's. */
export const ownListeners = (listening: Listening): HostPort[] =>
  [
    listening.dns,
    listening.proxy,
    listening.api,
    listening.sandbox,
    listening.transparent,
    listening.metrics,
    ...Object.values(listening.gateway ?? {}),
  ].flatMap((at) => (at === undefined ? [] : [at]));

/**
 * A host port the operator opened must not be one of Moat's own listeners: nothing a sandbox
 * does reaches Moat through Moat (ports asked as 0 are known only once bound).
 */
export function checkHostPorts(config: MoatConfig, listening: Listening): void {
  const taken = ownListeners(listening).find((at) => config.allowHostPorts.has(at.port));
  if (taken !== undefined)
    throw new Error(
      `--allow-host-ports names ${taken.port}, where Moat itself listens (${formatHostPort(taken)}); Moat's own listeners are never opened to sandboxes`,
    );
}

/**
 * Sharing the host's network, sandbox processes could call Moat's platform API, any sandbox's
 * API and the metrics listener directly: a host nftables table refuses them by their host ids
 * (enforce/listener-guard.ts). Undefined when sandboxes are unconfined (they have no ids of
 * their own: `--unconfined-sandboxes` says so at start-up).
 */
export function guardListeners(runtime: SandboxRuntime):
  | {
      update(listeners: ReadonlyArray<HostPort | undefined>): Promise<void>;
      remove(): Promise<void>;
    }
  | undefined {
  const ids = runtime.sandboxHostIds;
  if (ids === undefined) return undefined;
  const table = listenerGuardTable(ids);
  const session = new NftSession(undefined, 'the host namespace');
  // Read once: tables a killed Moat left over (part of) this range go with the first change.
  let stale: Promise<string[]> | undefined;
  return {
    async update(listeners) {
      const ports = listeners.flatMap((l) => (l && l.port !== 0 ? [l.port] : []));
      if (ports.length === 0) return;
      stale ??= listNftTables('inet').then((listing) => overlappingListenerGuards(listing, ids));
      await session.run(listenerGuardRuleset({ ids, ports, stale: await stale }));
    },
    async remove() {
      await session.run(removeListenerGuard(table)).catch(() => undefined);
      session.close();
    },
  };
}
