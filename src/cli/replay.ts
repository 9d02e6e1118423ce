/**
 * What-if replay for `moat check --replay`: every recorded decision of a flow log, decided
 * again under a candidate policy, and what would change. Records carry what the sandbox asked
 * for (the name, the address dialled, the port), so each is decided as the proxy and DNS
 * interceptor would decide it now; a bare address is matched to the names the same records show
 * it was given for (Moat's learned addresses), as the kernel and proxy would.
 */
import {
  type CanonicalName,
  canonicalName,
  type Decision,
  decide,
  destinationRulesFor,
  type IPAddress,
  type LearnedAddresses,
  type Policy,
  parseIP,
  requestDecision,
} from '../policy/index.js';

/** The fields of a flow record (its JSON view) that replay reads. */
export interface RecordedDecision {
  readonly sandboxID: string;
  readonly destination: {
    readonly name: string | null;
    readonly address: string | null;
    readonly port: number | null;
  };
  readonly verdict: 'allow' | 'deny';
  readonly list: string;
  readonly rule: string | null;
  /** When it was decided (ms since the epoch), where the record says. */
  readonly time: number | null;
  /** The request a destination's rules decided (a refused request's record). */
  readonly request?: { readonly method: string; readonly path: string };
}

export type Change = 'newly-denied' | 'newly-allowed';

export interface ReplayChange {
  readonly change: Change;
  readonly destination: RecordedDecision['destination'];
  /** The request, for a change in how a destination's rules decide one. */
  readonly request?: RecordedDecision['request'];
  /** How many recorded decisions this destination had, and in which sandboxes. */
  readonly flows: number;
  readonly sandboxes: readonly string[];
  readonly was: { readonly list: string; readonly rule: string | null };
  readonly now: Decision;
}

export interface ReplayResult {
  readonly changes: readonly ReplayChange[];
  readonly unchanged: number;
  /** Decided by something no policy changes: host protection, or a request that named nothing. */
  readonly notReplayable: number;
}

/** Lists whose verdicts do not come from a sandbox's policy. */
const NOT_FROM_POLICY = new Set(['host', 'invalid']);

/**
 * A flow log line as a recorded decision, or why it is not one. Close records and lines of
 * other shapes are skipped by the caller (undefined).
 */
export function readRecord(value: unknown): RecordedDecision | undefined | string {
  if (typeof value !== 'object' || value === null) return 'not a JSON object';
  const record = value as Record<string, unknown>;
  if (record.event !== 'decision') return undefined;
  const destination = record.destination as Record<string, unknown> | null | undefined;
  const nullable = (v: unknown, type: string) => v === null || typeof v === type;
  if (
    typeof record.sandboxID !== 'string' ||
    (record.verdict !== 'allow' && record.verdict !== 'deny') ||
    typeof record.list !== 'string' ||
    !nullable(record.rule, 'string') ||
    typeof destination !== 'object' ||
    destination === null ||
    !nullable(destination.name, 'string') ||
    !nullable(destination.address, 'string') ||
    !nullable(destination.port, 'number')
  )
    return 'not a flow record (sandboxID, verdict, list, rule and destination are required)';
  return {
    sandboxID: record.sandboxID,
    verdict: record.verdict,
    list: record.list,
    rule: record.rule as string | null,
    time:
      typeof record.time === 'string' && !Number.isNaN(Date.parse(record.time))
        ? Date.parse(record.time)
        : null,
    destination: {
      name: destination.name as string | null,
      address: destination.address as string | null,
      port: destination.port as number | null,
    },
    ...requestOf(record.request),
  };
}

/** A record's `request`, where it is one. */
function requestOf(request: unknown): { request?: RecordedDecision['request'] } {
  if (typeof request !== 'object' || request === null) return {};
  const { method, path } = request as Record<string, unknown>;
  return typeof method === 'string' && typeof path === 'string'
    ? { request: { method, path } }
    : {};
}

/** Address -> the names records show it was given for, per sandbox. */
function learnedFrom(records: readonly RecordedDecision[]): Map<string, LearnedAddresses> {
  const names = new Map<string, Map<string, Set<CanonicalName>>>();
  const add = (sandboxID: string, address: string, name: string) => {
    const canonical = canonicalName(name);
    if (!canonical.ok) return;
    let bySandbox = names.get(sandboxID);
    if (bySandbox === undefined) names.set(sandboxID, (bySandbox = new Map()));
    let set = bySandbox.get(address);
    if (set === undefined) bySandbox.set(address, (set = new Set()));
    set.add(canonical.value);
  };
  for (const record of records) {
    const { name, address } = record.destination;
    if (address === null) continue;
    if (name !== null) add(record.sandboxID, address, name);
    else if (record.list === 'learned' && record.rule !== null)
      add(record.sandboxID, address, record.rule);
  }
  return new Map(
    [...names].map(([sandboxID, byAddress]) => [
      sandboxID,
      { names: (ip: IPAddress) => [...(byAddress.get(ip.text) ?? [])] },
    ]),
  );
}

/** Decides every recorded decision under `policy`; groups what changes by destination. */
export function replay(records: readonly RecordedDecision[], policy: Policy): ReplayResult {
  const learned = learnedFrom(records);
  const changes = new Map<string, ReplayChange & { sandboxes: string[]; flows: number }>();
  let unchanged = 0;
  let notReplayable = 0;
  for (const record of records) {
    const { name, address, port } = record.destination;
    const host = name === null ? undefined : canonicalName(name);
    const ip = address === null ? undefined : parseIP(address);
    if (
      NOT_FROM_POLICY.has(record.list) ||
      (host === undefined && ip === undefined) ||
      host?.ok === false ||
      ip?.ok === false
    ) {
      notReplayable++;
      continue;
    }
    const connection = decide(
      policy,
      { host: host?.value, ip: ip?.value, port: port ?? undefined },
      host === undefined ? learned.get(record.sandboxID) : undefined,
    );
    // A request the destination's rules decided is decided again by them where they still do.
    const rules =
      record.request !== undefined && host?.ok === true && connection.verdict === 'allow'
        ? destinationRulesFor(policy, host.value)
        : undefined;
    const now =
      rules?.decidesRequests === true
        ? requestDecision(
            policy,
            rules,
            host!.value!,
            record.request!.method,
            record.request!.path,
            connection,
          )
        : connection;
    if (now.verdict === record.verdict) {
      unchanged++;
      continue;
    }
    const change: Change = now.verdict === 'deny' ? 'newly-denied' : 'newly-allowed';
    const key = JSON.stringify([change, name, address, port, record.request]);
    const seen = changes.get(key);
    if (seen === undefined) {
      changes.set(key, {
        change,
        destination: { name, address, port },
        ...(record.request === undefined ? {} : { request: record.request }),
        flows: 1,
        sandboxes: [record.sandboxID],
        was: { list: record.list, rule: record.rule },
        now,
      });
    } else {
      seen.flows++;
      if (!seen.sandboxes.includes(record.sandboxID)) seen.sandboxes.push(record.sandboxID);
    }
  }
  // Newly denied first (what a tightening breaks), then by how often it was seen.
  const ordered = [...changes.values()].sort((a, b) =>
    a.change === b.change ? b.flows - a.flows : a.change === 'newly-denied' ? -1 : 1,
  );
  return { changes: ordered, unchanged, notReplayable };
}
