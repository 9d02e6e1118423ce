import type { EnforcedSandbox, EnforcementTable } from '../enforce/index.js';
import type { FlowAsk, FlowKind, OpenFlow } from '../flows/index.js';
import type { MoatMetrics } from '../metrics/index.js';
import { type Decision, destinationRulesFor } from '../policy/index.js';
import type { Dialled, Target } from './dial.js';
import type { Splice, SpliceOptions } from './splice.js';

/** An open connection through Moat, decided for one destination. */
export interface Tunnel {
  /** The sandbox record it was decided for (a paused and resumed sandbox is a new record). */
  readonly sandbox: EnforcedSandbox;
  readonly target: Dialled;
  /** Bytes pass unread (a splice): no request in it is decided by itself. */
  readonly opaque?: boolean;
  /** Closes both sides; `decision` says why when a policy change denied it. */
  close(decision?: Decision): void;
}

/**
 * Why an unread tunnel to `target` may not stay open under `sandbox`'s policy now: its name's
 * rules decide each request, which only a connection Moat reads can hold.
 */
export function unreadUnderRules(sandbox: EnforcedSandbox, target: Target): Decision | undefined {
  if (target.host === undefined) return undefined;
  const rules = destinationRulesFor(sandbox.policy, target.host);
  if (rules?.decidesRequests !== true) return undefined;
  return {
    verdict: 'deny',
    list: 'rules',
    rule: rules.ruleKey,
    reason: `${target.host} has rules (${rules.ruleKey}) that decide each request by method and path, which a tunnel Moat does not read cannot hold; reconnect`,
  };
}

/**
 * Every open tunnel and in-flight forwarded request, by sandbox. When a sandbox's policy is
 * republished each one is decided again on the spot (the swap and the check run in the same
 * tick, so a now-denied tunnel closes well within 100 ms); removing a sandbox closes them all.
 */
export class TunnelRegistry {
  private readonly bySandbox = new Map<string, Set<Tunnel>>();

  /**
   * `check` decides a tunnel's destination for its sandbox as a new one would be (the Dialer's
   * check: the host first, then the policy by the tunnel's name, or its address).
   */
  constructor(
    private readonly table: EnforcementTable,
    private readonly check: (sandbox: EnforcedSandbox, target: Dialled) => Decision,
  ) {
    table.subscribe((event) => {
      if (event.type === 'published') this.recheck(event.sandboxID);
      else this.closeAll(event.sandboxID);
    });
  }

  /**
   * Open tunnels and requests of a sandbox. Not a budget: what a sandbox may hold is counted
   * per client connection, from accept (ConnectionBudget), and each carries one at most.
   */
  count(sandboxID: string): number {
    return this.bySandbox.get(sandboxID)?.size ?? 0;
  }

  /** Sandboxes with open connections, and how many each has. */
  *countsBySandbox(): Iterable<[string, number]> {
    for (const [sandboxID, set] of this.bySandbox) yield [sandboxID, set.size];
  }

  get size(): number {
    let total = 0;
    for (const set of this.bySandbox.values()) total += set.size;
    return total;
  }

  /**
   * Adds a tunnel; returns the function that removes it (call it when the tunnel closes). A
   * tunnel decided for a sandbox record the table no longer holds (removed while it was being
   * dialled, after closeAll ran; or removed and registered again, whose republish it missed), or
   * dialled by a route (upstream proxy or direct) the sandbox no longer has, is closed at once
   * instead.
   */
  add(tunnel: Tunnel): () => void {
    const sandboxID = tunnel.sandbox.sandboxID;
    if (!this.table.holds(tunnel.sandbox) || tunnel.target.via !== tunnel.sandbox.upstream) {
      tunnel.close();
      return () => {};
    }
    let set = this.bySandbox.get(sandboxID);
    if (set === undefined) {
      set = new Set();
      this.bySandbox.set(sandboxID, set);
    }
    set.add(tunnel);
    return () => {
      set.delete(tunnel);
      if (set.size === 0 && this.bySandbox.get(sandboxID) === set) this.bySandbox.delete(sandboxID);
    };
  }

  all(): Tunnel[] {
    return [...this.bySandbox.values()].flatMap((set) => [...set]);
  }

  private recheck(sandboxID: string): void {
    const sandbox = this.table.get(sandboxID);
    const set = this.bySandbox.get(sandboxID);
    if (sandbox === undefined || set === undefined) return;
    for (const tunnel of [...set]) {
      // Another upstream proxy (or none) replaced the one it goes through (or its absence).
      if (tunnel.target.via !== sandbox.upstream) {
        tunnel.close();
        continue;
      }
      const decision = this.check(sandbox, tunnel.target);
      if (decision.verdict === 'deny') tunnel.close(decision);
      else if (tunnel.opaque === true) {
        const unread = unreadUnderRules(sandbox, tunnel.target);
        if (unread !== undefined) tunnel.close(unread);
      }
    }
  }

  private closeAll(sandboxID: string): void {
    for (const tunnel of [...(this.bySandbox.get(sandboxID) ?? [])]) tunnel.close();
  }
}

export interface TunnelContext {
  readonly tunnels: TunnelRegistry;
  readonly metrics: MoatMetrics;
  readonly idleTimeoutMs: number;
}

/** What a proxy was asked, for its flow record: the name asked for and the address dialled. */
export function flowAsk(
  kind: FlowKind,
  sandbox: EnforcedSandbox,
  target: Target,
  protocol: string,
): FlowAsk {
  return {
    sandboxID: sandbox.sandboxID,
    kind,
    destination: {
      name: target.host ?? null,
      address: target.ip?.text ?? null,
      port: target.port,
      protocol,
    },
  };
}

/**
 * Splices client and upstream (`join` does, with the options given) as a registered tunnel:
 * counted, closed when a policy change denies its destination or the sandbox goes, and
 * unregistered when either side closes, which ends its `flow`.
 */
export function spliceTunnel(
  context: TunnelContext,
  flow: OpenFlow,
  sandbox: EnforcedSandbox,
  target: Dialled,
  join: (options: SpliceOptions) => Splice,
): Splice {
  const { metrics, tunnels } = context;
  let remove = () => {};
  const spliced = join({
    idleTimeoutMs: context.idleTimeoutMs,
    onClose: (up, down, end) => {
      remove();
      metrics.proxyBytes.inc({ direction: 'up' }, up);
      metrics.proxyBytes.inc({ direction: 'down' }, down);
      flow.closed(up, down, end);
    },
  });
  remove = tunnels.add({
    sandbox,
    target,
    opaque: true,
    close: (decision?: Decision) => {
      if (decision !== undefined) flow.refused(decision);
      spliced.close();
    },
  });
  return spliced;
}
