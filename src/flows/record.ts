/**
 * The one decision record every enforcement point Moat runs emits: who asked, what was asked,
 * what was dialled, the verdict and the rule that decided, and at close the bytes each way,
 * the duration and how it ended. Logs, metrics, the flow store and `GET /flows` all read it.
 */

export const FLOW_KINDS = ['dns', 'connect', 'http', 'transparent', 'direct', 'ingress'] as const;
export type FlowKind = (typeof FLOW_KINDS)[number];

export const FLOW_VERDICTS = ['allow', 'deny'] as const;
export type FlowVerdict = (typeof FLOW_VERDICTS)[number];

/** A decision opens a flow; an allowed connection also gets a close record when it ends. */
export const FLOW_EVENTS = ['decision', 'close'] as const;
export type FlowEvent = (typeof FLOW_EVENTS)[number];

export const FLOW_ENDS = ['closed', 'reset', 'policy', 'idle', 'error'] as const;
export type FlowEnd = (typeof FLOW_ENDS)[number];

/** The field names of a record as logs, the API and the file sink write it, in that order. */
export const FLOW_FIELDS = [
  'time',
  'id',
  'event',
  'sandboxID',
  'node',
  'kind',
  'destination',
  'verdict',
  'list',
  'rule',
  'reason',
  'bytesUp',
  'bytesDown',
  'durationMs',
  'end',
  'ruleKey',
  'injectedHeaders',
  'request',
  'wouldDeny',
] as const;

/** Fields only close records carry (undefined in decision records, left out of their views). */
export const CLOSE_FIELDS = ['bytesUp', 'bytesDown', 'durationMs', 'end'] as const;

/**
 * Fields only records of connections Moat intercepted to set a rule's headers carry (undefined
 * elsewhere, left out of their views): the rule's key, and the names (never the values) of the
 * headers set on the connection's requests so far (none on the decision record).
 */
export const INJECTION_FIELDS = ['ruleKey', 'injectedHeaders'] as const;

/**
 * The field only records of one request carry (a request a destination's `network.rules`
 * refused by its method or path): the method and the path it asked for, never the query.
 */
export const REQUEST_FIELDS = ['request'] as const;

/**
 * The field only records of a sandbox in report mode carry where its rules denied what was let
 * through: the list, rule and reason that would have denied it.
 */
export const REPORT_FIELDS = ['wouldDeny'] as const;

export interface FlowWouldDeny {
  readonly list: string;
  readonly rule: string | null;
  readonly reason: string;
}

export interface FlowRequest {
  readonly method: string;
  readonly path: string;
}

export const DESTINATION_FIELDS = ['name', 'address', 'port', 'protocol'] as const;

export interface FlowDestination {
  /** The host name as the sandbox asked for it (canonical); null for a bare address. */
  readonly name: string | null;
  /** The address dialled; null when none was (a DNS query, a refusal before dialling). */
  readonly address: string | null;
  readonly port: number | null;
  /** udp or tcp for DNS; tcp, http or tls for connections. */
  readonly protocol: string;
}

export interface FlowRecord {
  /** Milliseconds since the epoch (ISO 8601 in every view). */
  readonly time: number;
  /** Shared by a flow's decision and close records; unique per node and process. */
  readonly id: number;
  readonly event: FlowEvent;
  /** Empty when no sandbox was identified. */
  readonly sandboxID: string;
  readonly node: string;
  readonly kind: FlowKind;
  readonly destination: FlowDestination;
  readonly verdict: FlowVerdict;
  /** Where the deciding rule lives (allowOut, denyOut, internal, host, default, invalid...). */
  readonly list: string;
  readonly rule: string | null;
  readonly reason: string;
  readonly bytesUp?: number;
  readonly bytesDown?: number;
  readonly durationMs?: number;
  readonly end?: FlowEnd;
  readonly ruleKey?: string;
  readonly injectedHeaders?: readonly string[];
  readonly request?: FlowRequest;
  readonly wouldDeny?: FlowWouldDeny;
}

/** The record as JSON shows it: fields in FLOW_FIELDS order, time as ISO 8601. */
export function flowView(record: FlowRecord): Record<string, unknown> {
  const view: Record<string, unknown> = {
    time: new Date(record.time).toISOString(),
    id: record.id,
    event: record.event,
    sandboxID: record.sandboxID,
    node: record.node,
    kind: record.kind,
    destination: record.destination,
    verdict: record.verdict,
    list: record.list,
    rule: record.rule,
    reason: record.reason,
  };
  if (record.event === 'close') {
    view.bytesUp = record.bytesUp;
    view.bytesDown = record.bytesDown;
    view.durationMs = record.durationMs;
    view.end = record.end;
  }
  if (record.ruleKey !== undefined) {
    view.ruleKey = record.ruleKey;
    view.injectedHeaders = record.injectedHeaders;
  }
  if (record.request !== undefined) view.request = record.request;
  if (record.wouldDeny !== undefined) view.wouldDeny = record.wouldDeny;
  return view;
}
