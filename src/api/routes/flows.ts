/**
 * `GET /flows`: the node's recent flow records, filtered, newest first; with `follow=true`
 * every new one as it is recorded (NDJSON, or SSE for `Accept: text/event-stream`).
 */
import type { FastifyReply } from 'fastify';
import {
  FLOW_ENDS,
  FLOW_EVENTS,
  FLOW_KINDS,
  FLOW_VERDICTS,
  type FlowStore,
  flowView,
  matches,
  parseFlowQuery,
} from '../../flows/index.js';
import { SandboxError } from '../../sandbox/index.js';
import { type PlatformRoute, route, type SchemaRequest } from './route.js';
import { count, errors } from './schemas.js';

/** Bytes a follower may leave unread before it is cut: a slow reader never grows memory. */
export const MAX_FOLLOW_BACKLOG_BYTES = 1 << 20;

const text = { type: 'string' } as const;
const nullableText = { type: ['string', 'null'] };

const flowsQuerySchema = {
  type: 'object',
  properties: {
    sandboxID: { ...text, description: 'Only this sandbox’s flows' },
    verdict: { type: 'string', enum: [...FLOW_VERDICTS] },
    kind: { type: 'string', enum: [...FLOW_KINDS] },
    since: { ...text, description: 'ISO 8601 time, or a duration back from now: 30s, 5m, 2h, 1d' },
    destination: { ...text, description: 'Substring of the name asked for or the address dialled' },
    wouldDeny: {
      type: 'string',
      enum: ['true', 'false'],
      description:
        'true: only the decisions a report-mode sandbox’s rules would have denied (records with wouldDeny); false: only the others',
    },
    limit: { ...text, description: 'At most this many records (1 to 10000, default 100)' },
    nodes: {
      type: 'string',
      enum: ['self', 'all'],
      description:
        'self (default): this node’s records; all: every live node’s of a cluster, merged (not with follow)',
    },
    follow: {
      type: 'string',
      enum: ['true', 'false'],
      description:
        'Stream new records until the client leaves: NDJSON, or SSE with Accept: text/event-stream',
    },
  },
  additionalProperties: false,
} as const;

export const flowSchema = {
  type: 'object',
  properties: {
    time: { type: 'string', format: 'date-time' },
    id: count,
    event: { type: 'string', enum: [...FLOW_EVENTS] },
    sandboxID: text,
    node: text,
    kind: { type: 'string', enum: [...FLOW_KINDS] },
    destination: {
      type: 'object',
      properties: {
        name: nullableText,
        address: nullableText,
        port: { type: ['integer', 'null'] },
        protocol: text,
      },
      required: ['name', 'address', 'port', 'protocol'],
    },
    verdict: { type: 'string', enum: [...FLOW_VERDICTS] },
    list: text,
    rule: nullableText,
    reason: text,
    bytesUp: count,
    bytesDown: count,
    durationMs: count,
    end: { type: 'string', enum: [...FLOW_ENDS] },
    ruleKey: text,
    injectedHeaders: { type: 'array', items: text },
    request: {
      type: 'object',
      properties: { method: text, path: text },
      required: ['method', 'path'],
    },
    wouldDeny: {
      type: 'object',
      properties: { list: text, rule: nullableText, reason: text },
      required: ['list', 'rule', 'reason'],
    },
  },
  required: ['time', 'id', 'event', 'sandboxID', 'node', 'kind', 'destination', 'verdict'],
};

/** How long a fan-out waits for each other node. */
const PEER_TIMEOUT_MS = 10_000;

type FlowsRequest = SchemaRequest<{
  querystring: typeof flowsQuerySchema;
  response: Record<number, object>;
}>;

export const flowsRoute: PlatformRoute = route({
  method: 'GET',
  url: '/flows',
  summary:
    'Flow records of this node (nodes=all: of every node), newest first; follow=true streams new ones (NDJSON, or SSE)',
  auth: true,
  schema: {
    querystring: flowsQuerySchema,
    response: { 200: { type: 'array', items: flowSchema }, ...errors(400, 401) },
  },
  handler: (request, reply, { flows, peers }) => listFlows(request, reply, flows, peers),
});

async function listFlows(
  request: FlowsRequest,
  reply: FastifyReply,
  store: FlowStore,
  peers: () => readonly string[],
): Promise<unknown> {
  const { nodes, ...query } = request.query;
  const parsed = parseFlowQuery(query);
  if (!parsed.ok) throw new SandboxError(400, `query.${parsed.parameter}: ${parsed.error}`);
  const { filter, limit, follow } = parsed.value;
  if (nodes === 'all') {
    if (follow)
      throw new SandboxError(400, 'query.nodes: nodes=all cannot be followed; follow each node');
    return everyNode(request, reply, store.query(filter, limit).map(flowView), peers(), limit);
  }
  if (!follow) return store.query(filter, limit).map(flowView);
  const sse = (request.headers.accept ?? '').includes('text/event-stream');
  reply.hijack();
  const out = reply.raw;
  out.writeHead(200, {
    'Content-Type': sse ? 'text/event-stream' : 'application/x-ndjson',
    'Cache-Control': 'no-store',
  });
  // Headers go now: a client waiting for its first record knows the stream is open.
  out.flushHeaders();
  const stop = store.follow(
    (record) => {
      if (!matches(record, filter)) return true;
      if (out.writableLength > MAX_FOLLOW_BACKLOG_BYTES) return false;
      const json = JSON.stringify(flowView(record));
      out.write(sse ? `data: ${json}\n\n` : `${json}\n`);
      return true;
    },
    () => out.destroy(),
  );
  out.once('close', stop);
  return reply;
}

/**
 * This node's records and every other live node's for the same query (asked with the caller's
 * key), newest first, up to `limit`. Nodes that did not answer are named in a header rather
 * than failing the whole answer: the records of the others are still worth having.
 */
async function everyNode(
  request: FlowsRequest,
  reply: FastifyReply,
  own: ReadonlyArray<Record<string, unknown>>,
  peers: readonly string[],
  limit: number,
): Promise<unknown> {
  const query = new URLSearchParams(
    Object.entries(request.query).filter(([key]) => key !== 'nodes'),
  ).toString();
  const unreached: string[] = [];
  const answers = await Promise.all(
    peers.map(async (api) => {
      try {
        const response = await fetch(`http://${api}/flows?${query}`, {
          headers: { 'x-api-key': String(request.headers['x-api-key'] ?? '') },
          signal: AbortSignal.timeout(PEER_TIMEOUT_MS),
        });
        if (!response.ok) throw new Error(`it answered ${response.status}`);
        return (await response.json()) as Array<Record<string, unknown>>;
      } catch (error) {
        unreached.push(`${api} (${(error as Error).message})`);
        return [];
      }
    }),
  );
  if (unreached.length > 0) reply.header('X-Moat-Unreached-Nodes', unreached.join(', '));
  // ISO 8601 times in UTC order as text; ties stay in node order.
  return [...own, ...answers.flat()]
    .sort((a, b) => (a.time === b.time ? 0 : String(a.time) < String(b.time) ? 1 : -1))
    .slice(0, limit);
}
