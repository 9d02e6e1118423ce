/**
 * The one count of connections sandboxes hold open on Moat's listeners (explicit proxy,
 * transparent listener, DNS over TCP, sandbox listener), from accept to close, whatever state
 * each is in: accepted and silent, reading a head, idle between requests, tunnelling. A tunnel
 * or forwarded request rides on the client connection that carries it (one exchange at a time
 * per connection), so this count also bounds the sandbox's upstream connections: there is no
 * second count of tunnels.
 */
import { parseIP } from '../policy/index.js';
import type { EnforcementTable } from './table.js';

/** Moat's listeners a sandbox can connect to. */
export type BudgetedListener = 'proxy' | 'transparent' | 'dns_tcp' | 'ingress';

/** Why a connection was refused: its holder's budget, or the descriptors kept for Moat. */
export type ConnectionRefusalResource =
  | 'proxy_connections'
  | 'transparent_connections'
  | 'dns_tcp_connections'
  | 'ingress_connections'
  | 'file_descriptors';

export interface ConnectionRefusal {
  readonly resource: ConnectionRefusalResource;
  readonly listener: BudgetedListener;
  /** The sandbox charged, or undefined for a source that is no sandbox's (yet). */
  readonly sandboxID: string | undefined;
  readonly source: string | undefined;
  /** What its holder (or, for file_descriptors, all sandboxes) held, and the budget. */
  readonly held: number;
  readonly max: number;
  /** Refusals of this holder since its last logged one; 0: this one is not to be logged. */
  readonly log: number;
}

export interface ConnectionBudgetOptions {
  readonly table: EnforcementTable;
  /** Open connections per sandbox across every listener (and per unknown source address). */
  readonly perSandbox: number;
  /** A tighter budget of one listener within the sandbox's (DNS over TCP). */
  readonly perListener?: Partial<Record<BudgetedListener, number>>;
  /** Connections all sandboxes together may hold: the descriptors not kept for Moat itself. */
  readonly total: number;
  /** Told of every refusal (counted and, when `log` > 0, logged by the caller). */
  readonly refused: (refusal: ConnectionRefusal) => void;
  readonly now: () => number;
  /** A holder's refusals are logged at most once per this. */
  readonly logEveryMs?: number;
}

/** One admitted connection's charge. */
export interface ConnectionHold {
  /** The sandbox charged, or undefined while it is charged to its source address. */
  readonly sandboxID: string | undefined;
  /**
   * Charges it to `sandboxID` instead (a credential named the sandbox); false, and nothing
   * changes, when that sandbox is at its budget: the connection is then to be refused.
   */
  chargeTo(sandboxID: string): boolean;
  /** Gives the charge back (the connection closed); once only. */
  release(): void;
}

/** Who holds connections: a sandbox, or a source address that is no sandbox's (yet). */
interface Holder {
  readonly sandboxID: string | undefined;
  /** Its key in the map it is kept in (`within`), taken out when it holds nothing. */
  readonly key: string;
  readonly within: Map<string, Holder>;
  open: number;
  readonly byListener: Map<BudgetedListener, number>;
  lastLogged: number;
  unlogged: number;
}

/** The charge of a connection that is not a sandbox's (a client of the sandbox listener). */
const UNCOUNTED: ConnectionHold = {
  sandboxID: undefined,
  chargeTo: () => true,
  release: () => {},
};

const LISTENER_RESOURCE: Record<BudgetedListener, ConnectionRefusalResource> = {
  proxy: 'proxy_connections',
  transparent: 'transparent_connections',
  dns_tcp: 'dns_tcp_connections',
  ingress: 'ingress_connections',
};

/**
 * One admitted connection's charge: an object of fields, not closures, and no string made to
 * move it (it is taken and given back on every connection Moat accepts).
 */
class Hold implements ConnectionHold {
  private held = true;

  constructor(
    private readonly budget: ConnectionBudget,
    private holder: Holder,
    private readonly listener: BudgetedListener,
    private readonly source: string | undefined,
  ) {}

  get sandboxID(): string | undefined {
    return this.holder.sandboxID;
  }

  chargeTo(sandboxID: string): boolean {
    if (!this.held) return false;
    if (this.holder.sandboxID === sandboxID) return true;
    const next = this.budget.moved(this.holder, sandboxID, this.listener, this.source);
    if (next === undefined) return false;
    this.holder = next;
    return true;
  }

  release(): void {
    if (!this.held) return;
    this.held = false;
    this.budget.uncharge(this.holder, this.listener);
  }
}

export class ConnectionBudget {
  /** Holders by sandbox ID, and by source address for sources that are no sandbox's. */
  private readonly sandboxes = new Map<string, Holder>();
  private readonly sources = new Map<string, Holder>();
  private openTotal = 0;
  /** Refusals for descriptors are logged as one holder: they are everybody's. */
  private readonly descriptors: Holder = this.newHolder(undefined, '', new Map());
  /** The last address admitted and its canonical text: connections come in runs from one. */
  private lastAddress: string | undefined;
  private lastSource: string | undefined;

  constructor(private readonly options: ConnectionBudgetOptions) {}

  /** Connections held by one sandbox now. */
  held(sandboxID: string): number {
    return this.sandboxes.get(sandboxID)?.open ?? 0;
  }

  /** Connections all sandboxes and unknown sources hold now. */
  get total(): number {
    return this.openTotal;
  }

  /**
   * Charges a connection just accepted on `listener` from `remoteAddress` to the sandbox at that
   * address (or to the address itself when it is no sandbox's, unless `sandboxesOnly`: then it
   * is not counted); undefined when it is refused (then `refused` was told, and the caller
   * closes it at once).
   */
  admit(
    listener: BudgetedListener,
    remoteAddress: string | undefined,
    sandboxesOnly = false,
  ): ConnectionHold | undefined {
    const source = this.canonical(remoteAddress);
    const sandboxID =
      source === undefined ? undefined : this.options.table.fromSource(source)?.sandboxID;
    if (sandboxID === undefined && sandboxesOnly) return UNCOUNTED;
    const within = sandboxID !== undefined ? this.sandboxes : this.sources;
    const key = sandboxID ?? source ?? '';
    const refusal = this.check(within, key, sandboxID, listener);
    if (refusal !== undefined) {
      this.refuse(refusal.holder, {
        resource: refusal.resource,
        listener,
        sandboxID,
        source,
        held: refusal.held,
        max: refusal.max,
      });
      return undefined;
    }
    return new Hold(this, this.charge(within, key, sandboxID, listener), listener, source);
  }

  /**
   * Moves a connection's charge on `listener` from `from` to sandbox `to` (for its Hold);
   * undefined, and nothing changes, when that sandbox is at its budget.
   */
  moved(
    from: Holder,
    to: string,
    listener: BudgetedListener,
    source: string | undefined,
  ): Holder | undefined {
    const over = this.overBudget(this.sandboxes.get(to), listener);
    if (over !== undefined) {
      this.refuse(this.holderFor(this.sandboxes, to, to), {
        resource: LISTENER_RESOURCE[listener],
        listener,
        sandboxID: to,
        source,
        held: over.held,
        max: over.max,
      });
      return undefined;
    }
    this.uncharge(from, listener);
    return this.charge(this.sandboxes, to, to, listener);
  }

  /** Gives back a connection's charge on `listener` (for its Hold). */
  uncharge(holder: Holder, listener: BudgetedListener): void {
    holder.open--;
    this.openTotal--;
    const left = (holder.byListener.get(listener) ?? 1) - 1;
    if (left > 0) holder.byListener.set(listener, left);
    else holder.byListener.delete(listener);
    // A holder with nothing open is forgotten (with its log limit: it floods no more).
    if (holder.open === 0) holder.within.delete(holder.key);
  }

  /** The address as the enforcement table keys sources (an IPv4-mapped IPv6 one as IPv4). */
  private canonical(remoteAddress: string | undefined): string | undefined {
    if (remoteAddress === undefined) return undefined;
    if (remoteAddress !== this.lastAddress) {
      const parsed = parseIP(remoteAddress);
      this.lastSource = parsed.ok ? parsed.value.text : remoteAddress;
      this.lastAddress = remoteAddress;
    }
    return this.lastSource;
  }

  private check(
    within: Map<string, Holder>,
    key: string,
    sandboxID: string | undefined,
    listener: BudgetedListener,
  ):
    { holder: Holder; resource: ConnectionRefusalResource; held: number; max: number } | undefined {
    if (this.openTotal >= this.options.total)
      return {
        holder: this.descriptors,
        resource: 'file_descriptors',
        held: this.openTotal,
        max: this.options.total,
      };
    const over = this.overBudget(within.get(key), listener);
    if (over === undefined) return undefined;
    return {
      holder: this.holderFor(within, key, sandboxID),
      resource: LISTENER_RESOURCE[listener],
      ...over,
    };
  }

  /** What is over, if the holder cannot take one more connection on `listener`. */
  private overBudget(
    holder: Holder | undefined,
    listener: BudgetedListener,
  ): { held: number; max: number } | undefined {
    if (holder === undefined) return undefined;
    const { perSandbox, perListener } = this.options;
    if (holder.open >= perSandbox) return { held: holder.open, max: perSandbox };
    const cap = perListener?.[listener];
    const onListener = holder.byListener.get(listener) ?? 0;
    return cap !== undefined && onListener >= cap ? { held: onListener, max: cap } : undefined;
  }

  private refuse(holder: Holder, refusal: Omit<ConnectionRefusal, 'log'>): void {
    const now = this.options.now();
    holder.unlogged++;
    let log = 0;
    if (now - holder.lastLogged >= (this.options.logEveryMs ?? 10_000)) {
      log = holder.unlogged;
      holder.unlogged = 0;
      holder.lastLogged = now;
    }
    this.options.refused({ ...refusal, log });
  }

  private newHolder(
    sandboxID: string | undefined,
    key: string,
    within: Map<string, Holder>,
  ): Holder {
    return {
      sandboxID,
      key,
      within,
      open: 0,
      byListener: new Map(),
      lastLogged: -Infinity,
      unlogged: 0,
    };
  }

  private holderFor(
    within: Map<string, Holder>,
    key: string,
    sandboxID: string | undefined,
  ): Holder {
    let holder = within.get(key);
    if (holder === undefined) {
      holder = this.newHolder(sandboxID, key, within);
      within.set(key, holder);
    }
    return holder;
  }

  private charge(
    within: Map<string, Holder>,
    key: string,
    sandboxID: string | undefined,
    listener: BudgetedListener,
  ): Holder {
    const holder = this.holderFor(within, key, sandboxID);
    holder.open++;
    holder.byListener.set(listener, (holder.byListener.get(listener) ?? 0) + 1);
    this.openTotal++;
    return holder;
  }
}
