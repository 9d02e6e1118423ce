/**
 * Fair shares of Moat's one event loop between sandboxes, for its costly work: a rate of proxied
 * requests and new tunnels per sandbox while another sandbox is active too, and a round-robin
 * queue across sandboxes for minting leaf certificates. The accounting is a number or two per
 * request; a timer is only set for a request over its sandbox's rate.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { EnforcementTable } from '../enforce/index.js';
import type { MoatMetrics } from '../metrics/index.js';
import { type Destination, formatDestination } from '../policy/index.js';

export interface FairShareBudgets {
  /** Proxied requests and new tunnels a sandbox may start a second while another is active. */
  readonly requestsPerSecond: number;
  /** Leaf certificate mints a sandbox may have waiting for their turn; more are refused. */
  readonly leafMintsWaiting: number;
}

/** A sandbox alone on the proxy for this long is not held to its rate: it takes no one's share. */
const SHARED_FOR_MS = 1000;
/** Longest a request over its sandbox's rate is held before it is refused instead. */
const MAX_HOLD_MS = 250;
/** Leaves minted at once: each is JavaScript on the loop between its steps on libuv's threads. */
const MINTS_AT_ONCE = 2;
/** At most one log line per sandbox and budget in this time; the refusals between are counted. */
const LOG_EVERY_MS = 10_000;

/** Ends a leaf mint's turn (and starts the next sandbox's waiting one). */
export type EndTurn = () => void;

export class FairShare {
  /**
   * Per sandbox, when its next request is due at its rate (the virtual scheduling of the
   * generic cell rate algorithm): one number per sandbox, updated in place.
   */
  private readonly due = new Map<string, number>();
  private readonly intervalMs: number;
  /** A burst of a tenth of a second's requests goes through at once. */
  private readonly burstMs = 100;
  private lastSandbox = '';
  private sharedUntil = 0;
  private minting = 0;
  /** Sandboxes waiting to mint, in turn order, each with its waiting mints in arrival order. */
  private readonly mintQueues = new Map<string, (() => void)[]>();
  private readonly logged = new Map<string, { at: number; since: number }>();

  private readonly metrics: MoatMetrics;
  private readonly logger: Logger;
  private readonly now: () => number;

  constructor(
    readonly budgets: FairShareBudgets,
    parts: {
      readonly table: EnforcementTable;
      readonly metrics: MoatMetrics;
      readonly logger: Logger;
      readonly now?: () => number;
    },
  ) {
    this.intervalMs = 1000 / budgets.requestsPerSecond;
    this.metrics = parts.metrics;
    this.logger = parts.logger;
    this.now = parts.now ?? performance.now.bind(performance);
    // A sandbox that is gone takes no more room.
    parts.table.subscribe((event) => {
      if (event.type === 'removed') this.forget(event.sandboxID);
    });
  }

  /**
   * Admits one proxied request or new tunnel of `sandboxID`: 0 to go now, the milliseconds to
   * hold it first, or undefined when it is over its rate by more than a brief hold.
   */
  private admit(sandboxID: string): number | undefined {
    const now = this.now();
    if (sandboxID !== this.lastSandbox) {
      this.lastSandbox = sandboxID;
      this.sharedUntil = now + SHARED_FOR_MS;
    }
    if (now >= this.sharedUntil) return 0;
    const due = Math.max(this.due.get(sandboxID) ?? now, now);
    const hold = due - now - this.burstMs;
    if (hold > MAX_HOLD_MS) return undefined;
    this.due.set(sandboxID, due + this.intervalMs);
    return hold > 0 ? hold : 0;
  }

  /**
   * A turn to mint a leaf for `sandboxID`, in round robin with every other sandbox waiting to;
   * undefined when the sandbox already has its budget of mints waiting. End it once minted.
   */
  mintTurn(sandboxID: string): Promise<EndTurn> | undefined {
    if (this.minting < MINTS_AT_ONCE && this.mintQueues.size === 0) {
      this.minting++;
      return Promise.resolve(this.endTurn());
    }
    let queue = this.mintQueues.get(sandboxID);
    if (queue === undefined) this.mintQueues.set(sandboxID, (queue = []));
    if (queue.length >= this.budgets.leafMintsWaiting) return undefined;
    return new Promise((resolve) => queue.push(() => resolve(this.endTurn())));
  }

  private endTurn(): EndTurn {
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.minting--;
      const next = this.mintQueues.entries().next();
      if (next.done) return;
      const [sandboxID, queue] = next.value;
      // The sandbox goes to the back of the turn order, or out of it with nothing left waiting.
      this.mintQueues.delete(sandboxID);
      const start = queue.shift()!;
      if (queue.length > 0) this.mintQueues.set(sandboxID, queue);
      this.minting++;
      start();
    };
  }

  /**
   * Admits one proxied request or new tunnel of `sandboxID` (`what` and `target` name it in a
   * refusal): undefined to go on at once, which allocates nothing; else a promise that resolves
   * to undefined once the request has been held its time, or to the refusal the sandbox is told
   * (counted and logged) when it is over its rate.
   */
  wait(
    sandboxID: string,
    what: string,
    target: Destination,
  ): Promise<string | undefined> | undefined {
    const hold = this.admit(sandboxID);
    if (hold === 0) return undefined;
    if (hold === undefined)
      return Promise.resolve(
        this.refuse('proxied_requests', sandboxID, `${what} ${formatDestination(target)}`),
      );
    return sleep(hold).then(() => undefined);
  }

  /**
   * Admits one later request of a connection already admitted (a plain-HTTP tunnel's, read as
   * it passes: it cannot wait): undefined to go on, within a brief hold over the rate (its place
   * in the rate is taken, so a steady flood is over it soon); else the refusal, counted and
   * logged, that ends the connection. A number update, no promise, no timer.
   */
  admitNow(sandboxID: string, what: string, target: Destination): string | undefined {
    if (this.admit(sandboxID) !== undefined) return undefined;
    return this.refuse('proxied_requests', sandboxID, `${what} ${formatDestination(target)}`);
  }

  private forget(sandboxID: string): void {
    this.due.delete(sandboxID);
    this.logged.delete(`proxied_requests ${sandboxID}`);
    this.logged.delete(`leaf_mints ${sandboxID}`);
  }

  /**
   * Counts a refusal for being over a budget, logs it (at most once per sandbox and budget in
   * LOG_EVERY_MS), and returns what the sandbox is told.
   */
  refuse(resource: 'proxied_requests' | 'leaf_mints', sandboxID: string, what: string): string {
    this.metrics.budgetRefusals.inc({ resource });
    const message =
      resource === 'proxied_requests'
        ? `sandbox ${sandboxID} is over its budget of ${this.budgets.requestsPerSecond} proxied requests a second while other sandboxes are active (--proxy-requests-per-second); ${what} refused, retry later`
        : `sandbox ${sandboxID} already has ${this.budgets.leafMintsWaiting} leaf certificates waiting to be minted (--leaf-mints-waiting); ${what} refused`;
    const key = `${resource} ${sandboxID}`;
    const now = this.now();
    const last = this.logged.get(key);
    if (last === undefined || now - last.at >= LOG_EVERY_MS) {
      this.logged.set(key, { at: now, since: 0 });
      this.logger.warn(
        { sandboxID, resource, refusedSinceLastLine: last?.since ?? 0, reason: message },
        'sandbox over its budget',
      );
    } else last.since++;
    return message;
  }
}
