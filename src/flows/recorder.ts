import type { Logger } from 'pino';
import type { HotCount, MoatMetrics, ProxyKind } from '../metrics/index.js';
import {
  type FlowDestination,
  type FlowEnd,
  type FlowEvent,
  type FlowKind,
  type FlowRecord,
  type FlowRequest,
  type FlowWouldDeny,
  type FlowVerdict,
  flowView,
} from './record.js';
import type { FlowFileSink } from './file-sink.js';
import type { FlowStore } from './store.js';

/** What was asked of an enforcement point, by whom. */
export interface FlowAsk {
  readonly sandboxID: string;
  readonly kind: FlowKind;
  readonly destination: FlowDestination;
  /** The key of the header rule a connection is intercepted for (undefined: not intercepted). */
  readonly ruleKey?: string;
  /** The request asked, for a decision on one request (undefined: a connection's). */
  readonly request?: FlowRequest;
}

/** The decision's answer (the policy's Decision has this shape). */
export interface FlowDecision {
  readonly verdict: FlowVerdict;
  readonly list: string;
  readonly rule: string | null;
  readonly reason: string;
  /** Report mode: the denial the sandbox's rules made, not enforced. */
  readonly wouldDeny?: FlowWouldDeny;
}

/**
 * A record with every field present, in one order (close fields undefined on a decision): all
 * records share one shape, which keeps the recorder and the store monomorphic.
 */
function flowRecord(
  time: number,
  id: number,
  event: FlowEvent,
  sandboxID: string,
  node: string,
  kind: FlowKind,
  destination: FlowDestination,
  decision: FlowDecision,
  closed: { bytesUp: number; bytesDown: number; durationMs: number; end: FlowEnd } | undefined,
  injection: { ruleKey: string; injectedHeaders: readonly string[] } | undefined,
  request: FlowRequest | undefined,
): FlowRecord {
  return {
    time,
    id,
    event,
    sandboxID,
    node,
    kind,
    destination,
    verdict: decision.verdict,
    list: decision.list,
    rule: decision.rule,
    reason: decision.reason,
    bytesUp: closed?.bytesUp,
    bytesDown: closed?.bytesDown,
    durationMs: closed?.durationMs,
    end: closed?.end,
    ruleKey: injection?.ruleKey,
    injectedHeaders: injection?.injectedHeaders,
    request,
    wouldDeny: decision.wouldDeny,
  };
}

/** The kinds whose decisions the proxy's own counters have always counted, by their label. */
const PROXY_KINDS: Partial<Record<FlowKind, ProxyKind>> = {
  connect: 'connect',
  http: 'forward',
  transparent: 'transparent',
};

export interface FlowRecorderOptions {
  readonly store: FlowStore;
  readonly metrics: MoatMetrics;
  readonly logger: Logger;
  /** This node's name in records (the cluster's node ID, or the host name). */
  node: string;
  readonly now?: () => number;
}

/**
 * Builds every flow record, adds it to the store, counts it and logs it: one log message
 * ('flow') for every decision and close; denials and policy closes at info, the rest at debug.
 */
export class FlowRecorder {
  private lastID = 0;
  private readonly now: () => number;
  /** The file every record is also appended to (--flow-log), once it is open. */
  sink: FlowFileSink | undefined;
  /** moat_flows_total cells by kind and verdict, made on first use (added to per record). */
  private readonly flowCounts: Partial<Record<string, HotCount>> = {};
  private readonly byteCounts: Partial<Record<string, HotCount>> = {};

  constructor(private readonly options: FlowRecorderOptions) {
    this.now = options.now ?? Date.now;
  }

  get store(): FlowStore {
    return this.options.store;
  }

  /** Names this node in the records made from now on. */
  set node(node: string) {
    this.options.node = node;
  }

  /** Records a decision that opens nothing (a DNS query, a refusal). */
  decided(ask: FlowAsk, decision: FlowDecision): void {
    this.emit(this.decisionRecord(ask, decision));
  }

  /** Records an allowed connection; its close record is made when the returned flow ends. */
  opened(ask: FlowAsk, decision: FlowDecision): OpenFlow {
    const record = this.decisionRecord(ask, decision);
    this.emit(record);
    return new OpenFlow(this, record);
  }

  private decisionRecord(ask: FlowAsk, decision: FlowDecision): FlowRecord {
    return flowRecord(
      this.now(),
      ++this.lastID,
      'decision',
      ask.sandboxID,
      this.options.node,
      ask.kind,
      ask.destination,
      decision,
      undefined,
      ask.ruleKey === undefined ? undefined : { ruleKey: ask.ruleKey, injectedHeaders: [] },
      ask.request,
    );
  }

  /** Records the end of an open flow, `refusal` when a policy change or a guard ended it. */
  close(
    opened: FlowRecord,
    destination: FlowDestination,
    counts: {
      up: number;
      down: number;
      end: FlowEnd;
      refusal?: FlowDecision;
      injectedHeaders: readonly string[];
    },
  ): void {
    const time = this.now();
    const { up, down, end, refusal } = counts;
    this.emit(
      flowRecord(
        time,
        opened.id,
        'close',
        opened.sandboxID,
        opened.node,
        opened.kind,
        destination,
        refusal ?? opened,
        { bytesUp: up, bytesDown: down, durationMs: time - opened.time, end },
        opened.ruleKey === undefined
          ? undefined
          : { ruleKey: opened.ruleKey, injectedHeaders: counts.injectedHeaders },
        undefined,
      ),
    );
  }

  private emit(record: FlowRecord): void {
    const { metrics, logger, store } = this.options;
    this.hot(this.flowCounts, metrics.flows, record.kind, record.verdict, 'verdict').count++;
    const proxyKind = PROXY_KINDS[record.kind];
    const denied = record.verdict === 'deny';
    if (record.event === 'close') {
      this.hot(this.byteCounts, metrics.flowBytes, record.kind, 'up', 'direction').count +=
        record.bytesUp!;
      this.hot(this.byteCounts, metrics.flowBytes, record.kind, 'down', 'direction').count +=
        record.bytesDown!;
    } else if (proxyKind !== undefined) {
      const verdict = denied ? (record.list === 'invalid' ? 'invalid' : 'denied') : 'allowed';
      metrics.proxyConnections.inc({ kind: proxyKind, verdict });
    }
    if (denied && proxyKind !== undefined)
      metrics.proxyDenials.inc({ kind: proxyKind, list: record.list });
    if (record.wouldDeny !== undefined && record.event === 'decision')
      metrics.flowsWouldDeny.inc({ kind: record.kind, list: record.wouldDeny.list });
    store.add(record);
    this.sink?.add(record);
    // The view is built only for a line that is written.
    const level = denied ? 'info' : 'debug';
    if (logger.isLevelEnabled(level)) logger[level](flowView(record), 'flow');
  }

  private hot(
    cells: Partial<Record<string, HotCount>>,
    counter: MoatMetrics['flows'],
    kind: FlowKind,
    value: string,
    label: 'verdict' | 'direction',
  ): HotCount {
    return (cells[kind + value] ??= this.options.metrics.hotCount(counter, {
      kind,
      [label]: value,
    }));
  }
}

/** An allowed connection, open until `closed` (once; later calls do nothing). */
export class OpenFlow {
  private refusal: FlowDecision | undefined;
  private address: string | undefined;
  private done = false;
  /** Names of the headers set on its requests (lower case, each once). */
  private readonly injected = new Set<string>();

  constructor(
    private readonly recorder: FlowRecorder,
    readonly record: FlowRecord,
  ) {}

  /** The address dialled, when it was chosen after the decision (a forwarded request). */
  dialled(address: string): void {
    this.address = address;
  }

  /** Headers (their names) were set on one of its requests. */
  injectedHeaders(names: readonly string[]): void {
    for (const name of names) this.injected.add(name.toLowerCase());
  }

  /** A policy change (or a check of the flow's bytes) denies it now; it is about to close. */
  refused(decision: FlowDecision): void {
    this.refusal ??= decision;
  }

  closed(up: number, down: number, end: FlowEnd = 'closed'): void {
    if (this.done) return;
    this.done = true;
    const refusal = this.refusal;
    const { record, address } = this;
    const destination =
      address === undefined || address === record.destination.address
        ? record.destination
        : { ...record.destination, address };
    this.recorder.close(record, destination, {
      up,
      down,
      end: refusal === undefined ? end : 'policy',
      refusal,
      injectedHeaders: [...this.injected],
    });
  }
}
