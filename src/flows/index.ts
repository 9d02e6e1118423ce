/**
 * Flows: the one decision record every enforcement point emits, the node's bounded store of
 * recent records with its followers, and the filters `GET /flows` reads them with.
 */
export {
  CLOSE_FIELDS,
  DESTINATION_FIELDS,
  FLOW_ENDS,
  FLOW_EVENTS,
  FLOW_FIELDS,
  FLOW_KINDS,
  FLOW_VERDICTS,
  INJECTION_FIELDS,
  REPORT_FIELDS,
  REQUEST_FIELDS,
  type FlowDestination,
  type FlowEnd,
  type FlowKind,
  type FlowRecord,
  type FlowRequest,
  type FlowWouldDeny,
  type FlowVerdict,
  flowView,
} from './record.js';
export {
  type FlowAsk,
  type FlowDecision,
  FlowRecorder,
  type FlowRecorderOptions,
  OpenFlow,
} from './recorder.js';
export { type FlowFilter, FlowStore, type FlowTotals, type Follower, matches } from './store.js';
export { FlowFileSink, MAX_PENDING_BYTES } from './file-sink.js';
export { parseFlowQuery, parseSince, type FlowQuery } from './query.js';
