import { allowedPorts, deniedPorts, type IPAddress, type Policy } from '../policy/index.js';
import {
  BUDGET_COUNTERS_QUERY,
  budgetRefusals,
  hostRuleset,
  type KernelBudget,
  type KernelLayout,
  type LearnedElement,
  learnedElements,
  lockdownSets,
  newGeneration,
  policySets,
  sandboxRuleset,
  tunnelRules,
} from './kernel-rules.js';
import { AddressPool } from './address-pool.js';
import type { EnforcementTable, UpstreamProxy } from './table.js';

export type KernelChange = 'install' | 'policy' | 'learned';

/** A link device name the firewall's rules can name (Linux allows more; Moat's links need no more). */
const DEVICE_NAME = /^[A-Za-z0-9_.-]{1,15}$/;

/** A sandbox's bandwidth each way, in Mbit/s; 0: unlimited. */
export interface Bandwidth {
  readonly egressMbps: number;
  readonly ingressMbps: number;
}

export interface KernelEnforcerOptions {
  readonly table: EnforcementTable;
  /** Runs nft commands inside the sandbox's namespace (the runtime's job). */
  readonly apply: (sandboxID: string, commands: string) => Promise<void>;
  /** What a listing nft command prints in the sandbox's namespace. */
  readonly list: (sandboxID: string, command: string) => Promise<string>;
  /** Holds the sandbox's link to `bandwidth` (the runtime's job). */
  readonly limitBandwidth: (sandboxID: string, bandwidth: Bandwidth) => Promise<void>;
  /** Runs nft commands in the host's namespace. */
  readonly applyHost: (commands: string) => Promise<void>;
  readonly now: () => number;
  /**
   * The port of Moat's listener inside the sandbox's namespace that takes the TCP of other ports
   * than the web's when the sandbox has an upstream proxy (opened on first use); undefined when
   * there is none, and such TCP is then refused.
   */
  readonly redirectPort?: (sandboxID: string) => Promise<number | undefined>;
  /**
   * Ends the sandbox's open connections that its new policy denies, after a publish is in: the
   * firewall already passes none of their packets, this tells their sockets now. Never rejects.
   */
  readonly endDenied?: (sandboxID: string) => Promise<void>;
  /** Each change written (or refused), with how long it took. */
  readonly onApplied?: (change: KernelChange, ok: boolean, seconds: number) => void;
}

/** A change the kernel refused; the message says what stays in force. */
export class KernelEnforcementError extends Error {
  override readonly name = 'KernelEnforcementError';
}

/**
 * Keeps each namespaced sandbox's firewall equal to its policy: the whole table when the
 * sandbox is set up, its sets on every publish, and learned addresses as the DNS interceptor
 * hands them out (before the answer is released).
 */
export class KernelEnforcer {
  /**
   * The policy generation last written, to any sandbox. Each write takes the next one, so two
   * generations of one sandbox never repeat; the start is random, so a restarted Moat's are not
   * the last run's.
   */
  private generation = newGeneration();

  constructor(
    private readonly layout: KernelLayout,
    private readonly options: KernelEnforcerOptions,
  ) {}

  /** The host's side of all sandbox links. */
  installHost(): Promise<void> {
    return this.options.applyHost(hostRuleset(this.layout));
  }

  /**
   * Writes the sandbox's whole firewall for `policy` (and its upstream proxy, which only Moat's
   * listeners reach); rejects when it could not be applied. `device` is the sandbox's end of
   * Moat's link inside its namespace: the only way out for what the namespace sends or forwards.
   */
  async install(
    sandboxID: string,
    address: IPAddress,
    policy: Policy,
    upstream?: UpstreamProxy,
    device = 'eth0',
  ): Promise<void> {
    // The name is written into nft's text: one a client chose must not be able to end a rule.
    if (!DEVICE_NAME.test(device))
      throw new KernelEnforcementError(
        `the firewall of sandbox ${sandboxID} was not written: its link device ${JSON.stringify(device)} is not a device name of 1 to 15 letters, digits, '.', '-' or '_'`,
      );
    const host = AddressPool.offset(address, -1);
    const tunnel = await this.tunnelRules(sandboxID, upstream);
    const commands = `${sandboxRuleset(this.layout, { host, address, device })}; ${policySets(policy, this.learnedOf(sandboxID, policy), this.options.now(), this.nextGeneration())}; ${tunnel}`;
    try {
      await this.timed('install', () => this.options.apply(sandboxID, commands));
    } catch (error) {
      throw new KernelEnforcementError(
        `the firewall of sandbox ${sandboxID} could not be written: ${(error as Error).message}`,
      );
    }
  }

  /**
   * Rewrites the sandbox's sets for its current policy. When that fails, every destination is
   * denied instead (stricter than any policy), and the error says so.
   */
  async enforce(sandboxID: string, policy: Policy, upstream?: UpstreamProxy): Promise<void> {
    // One transaction: the new sets and where allowed TCP goes change together.
    const tunnel = await this.tunnelRules(sandboxID, upstream);
    const commands = `${policySets(
      policy,
      this.learnedOf(sandboxID, policy),
      this.options.now(),
      this.nextGeneration(),
    )}; ${tunnel}`;
    try {
      await this.timed('policy', () => this.options.apply(sandboxID, commands));
      await this.options.endDenied?.(sandboxID);
    } catch (error) {
      const locked = await this.options.apply(sandboxID, lockdownSets(this.nextGeneration())).then(
        async () => {
          // The lockdown emptied learned4, but the learned table still holds what DNS handed
          // out for names the stored policy allows: put those back, or later answers for them
          // would not open anything until their expiry moves. Best effort: on failure they
          // stay closed, which is stricter.
          const learned = learnedElements(this.learnedOf(sandboxID), this.options.now());
          if (learned !== '') await this.options.apply(sandboxID, learned).catch(() => {});
          return 'its firewall now denies every direct destination (except addresses DNS hands out for names the stored policy allows) until a later change succeeds';
        },
        (lockError: Error) =>
          `denying everything failed too (${lockError.message}); the previous firewall stays`,
      );
      throw new KernelEnforcementError(
        `the firewall of sandbox ${sandboxID} could not be updated (${(error as Error).message}); ${locked}`,
      );
    }
  }

  /** Holds the sandbox's link to `bandwidth`, replacing its earlier limits. */
  async limitBandwidth(sandboxID: string, bandwidth: Bandwidth): Promise<void> {
    try {
      await this.options.limitBandwidth(sandboxID, bandwidth);
    } catch (error) {
      throw new KernelEnforcementError(
        `the bandwidth limits of sandbox ${sandboxID} could not be written: ${(error as Error).message}`,
      );
    }
  }

  /** The new connections the sandbox's firewall refused so far, by budget. */
  async refusals(sandboxID: string): Promise<Record<KernelBudget, number>> {
    return budgetRefusals(await this.options.list(sandboxID, BUDGET_COUNTERS_QUERY));
  }

  /** Opens addresses the interceptor is about to hand out; resolves once they are live. */
  learn(sandboxID: string, learned: readonly LearnedElement[]): Promise<void> {
    const commands = learnedElements(learned, this.options.now());
    if (commands === '') return Promise.resolve();
    return this.timed('learned', () => this.options.apply(sandboxID, commands));
  }

  /** 1 to 2^32 - 1, then 1 again: a conntrack mark of 0 is a connection nothing marked. */
  private nextGeneration(): number {
    this.generation = (this.generation % 0xffff_ffff) + 1;
    return this.generation;
  }

  /**
   * The sandbox's learned addresses, each opening the ports its names are allowed on and
   * closing those they are denied on.
   */
  private learnedOf(sandboxID: string, policy?: Policy): LearnedElement[] {
    const sandbox = this.options.table.get(sandboxID);
    if (sandbox === undefined) return [];
    const current = policy ?? sandbox.policy;
    return sandbox.learned.entries().map(({ address, expiresAt, names }) => ({
      address,
      expiresAt,
      ports: allowedPorts(current, names),
      denied: deniedPorts(current, names),
    }));
  }

  /** The tunnel chains for `upstream`, with the listener inside when one can be had. */
  private async tunnelRules(sandboxID: string, upstream?: UpstreamProxy): Promise<string> {
    if (upstream === undefined) return tunnelRules(this.layout, false);
    // Without the listener, other TCP is refused (stricter), never sent around the proxy.
    const port = await this.options.redirectPort?.(sandboxID).catch(() => undefined);
    return tunnelRules(this.layout, true, port);
  }

  private async timed(change: KernelChange, work: () => Promise<void>): Promise<void> {
    const started = performance.now();
    let ok = false;
    try {
      await work();
      ok = true;
    } finally {
      this.options.onApplied?.(change, ok, (performance.now() - started) / 1000);
    }
  }
}
