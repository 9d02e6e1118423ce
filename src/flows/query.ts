import { FLOW_KINDS, FLOW_VERDICTS, type FlowVerdict } from './record.js';
import { SANDBOX_ID } from '../e2b-wire/index.js';
import type { FlowFilter } from './store.js';

export interface FlowQuery {
  readonly filter: FlowFilter;
  readonly limit: number;
  readonly follow: boolean;
}

const DEFAULT_LIMIT = 100;
const MAX_LIMIT = 10_000;
const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

type Parsed = { ok: true; value: FlowQuery } | { ok: false; parameter: string; error: string };

/** `since` as an instant: an ISO 8601 time, or a duration back from now (30s, 5m, 2h, 1d). */
export function parseSince(text: string, now: number): number | undefined {
  const duration = /^(\d{1,9})(ms|s|m|h|d)$/.exec(text);
  if (duration) return now - Number(duration[1]) * UNITS[duration[2]!]!;
  if (!/^\d{4}-\d{2}-\d{2}T/.test(text)) return undefined;
  const time = Date.parse(text);
  return Number.isNaN(time) ? undefined : time;
}

/**
 * The filters of `GET /flows` from its query parameters; an unknown parameter or a bad value
 * is an error naming the parameter.
 */
export function parseFlowQuery(params: Record<string, unknown>, now: number = Date.now()): Parsed {
  const filter: { -readonly [K in keyof FlowFilter]: FlowFilter[K] } = {};
  let limit = DEFAULT_LIMIT;
  let follow = false;
  const bad = (parameter: string, error: string): Parsed => ({ ok: false, parameter, error });
  for (const [key, raw] of Object.entries(params)) {
    if (typeof raw !== 'string') return bad(key, `${key} must be given once`);
    switch (key) {
      case 'sandboxID':
        if (!SANDBOX_ID.test(raw))
          return bad(key, `sandboxID ${JSON.stringify(raw)} is not a sandbox ID`);
        filter.sandboxID = raw;
        break;
      case 'verdict':
        if (!(FLOW_VERDICTS as readonly string[]).includes(raw))
          return bad(key, `verdict must be allow or deny, not ${JSON.stringify(raw)}`);
        filter.verdict = raw as FlowVerdict;
        break;
      case 'kind':
        if (!(FLOW_KINDS as readonly string[]).includes(raw))
          return bad(
            key,
            `kind must be one of ${FLOW_KINDS.join(', ')}, not ${JSON.stringify(raw)}`,
          );
        filter.kind = raw;
        break;
      case 'since': {
        const since = parseSince(raw, now);
        if (since === undefined)
          return bad(
            key,
            `since must be an ISO 8601 time or a duration like 5m, not ${JSON.stringify(raw)}`,
          );
        filter.since = since;
        break;
      }
      case 'destination':
        if (raw.length === 0 || raw.length > 255)
          return bad(key, 'destination must be 1 to 255 characters');
        filter.destination = raw.toLowerCase();
        break;
      case 'wouldDeny':
        if (raw !== 'true' && raw !== 'false')
          return bad(key, `wouldDeny must be true or false, not ${JSON.stringify(raw)}`);
        filter.wouldDeny = raw === 'true';
        break;
      case 'limit':
        if (!/^\d{1,6}$/.test(raw) || Number(raw) < 1 || Number(raw) > MAX_LIMIT)
          return bad(
            key,
            `limit must be an integer from 1 to ${MAX_LIMIT}, not ${JSON.stringify(raw)}`,
          );
        limit = Number(raw);
        break;
      case 'follow':
        if (raw !== 'true' && raw !== 'false')
          return bad(key, `follow must be true or false, not ${JSON.stringify(raw)}`);
        follow = raw === 'true';
        break;
      default:
        return bad(key, `unknown parameter ${JSON.stringify(key)}`);
    }
  }
  return { ok: true, value: { filter, limit, follow } };
}
