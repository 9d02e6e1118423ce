/**
 * Every platform route in one table: method, path, schemas, whether it needs the API key, and
 * the handler. Fastify validates with these schemas and /openapi.json is generated from them,
 * so the document cannot drift from what is enforced.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { MAX_DESCRIPTION_LENGTH } from '../policy/index.js';
import type { FlowStore } from '../flows/index.js';
import {
  type CreateRequest,
  DEFAULT_TIMEOUT,
  MAX_FORKS,
  type Order,
  type Page,
  type SandboxService,
  type SandboxState,
  SandboxError,
} from '../sandbox/index.js';
import {
  BASE_TEMPLATE_VIEW,
  createdSchema,
  createdView,
  detailSchema,
  detailView,
  type EgressInfo,
  errorSchema,
  forkResultsSchema,
  forkView,
  listedSchema,
  listedView,
  metricSchema,
  metricView,
  snapshotSchema,
  snapshotView,
  templatesSchema,
  templateView,
} from './views.js';
import { SANDBOX_API_PORT } from '../sandbox-api-port.js';
import { caRoute } from './ca.js';
import { flowSchema, flowsQuerySchema, listFlows } from './flows.js';

export interface RouteContext {
  readonly service: SandboxService;
  readonly egress: EgressInfo;
  /** This node's recent flow records. */
  readonly flows: FlowStore;
  /** This node's egress CA certificate (PEM), served at GET /ca.pem. */
  readonly caCertificatePem: string;
}

type Handler = (
  request: FastifyRequest,
  reply: FastifyReply,
  context: RouteContext,
) => Promise<unknown>;

export interface RouteSpec {
  readonly method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  readonly url: string;
  readonly summary: string;
  /** Needs X-API-Key. */
  readonly auth: boolean;
  /** The body may be left out; it then counts as `{}`. */
  readonly optionalBody?: boolean;
  readonly schema: {
    readonly params?: object;
    readonly querystring?: object;
    readonly body?: object;
    readonly response: Record<number, object>;
  };
  readonly handler: Handler;
  /**
   * Where it runs when many nodes share a store: `owner`, on the node that hosts the sandbox
   * (the request is forwarded there); `placement`, on the node the new sandbox goes to.
   * Unmarked routes run on any node (reads, and network changes, which the store and the
   * cluster channel carry to the owner).
   */
  readonly runsOn?: 'owner' | 'placement';
}

const timeoutSeconds = {
  type: 'integer',
  minimum: 0,
  maximum: 2_147_483_647,
  description: 'Seconds',
};
const stringList = { type: 'array', items: { type: 'string' } };
const sandboxParams = {
  type: 'object',
  properties: { sandboxID: { type: 'string' } },
  required: ['sandboxID'],
};
const noContent = { 204: { type: 'null', description: 'Done' } };
const errors = (...codes: number[]) =>
  Object.fromEntries(codes.map((code) => [code, errorSchema])) as Record<number, object>;
const bodyObject = (properties: Record<string, object>, required: string[] = []) => ({
  type: 'object',
  properties,
  required,
  additionalProperties: false,
});

/** E2B's SandboxEgressProxyConfig; null is "no proxy". Sizes and the address are checked later. */
const egressProxy = {
  ...bodyObject(
    {
      address: { type: 'string', maxLength: 1024, description: 'SOCKS5 proxy, host:port' },
      username: { type: 'string', description: 'RFC 1929, 1 to 255 bytes' },
      password: {
        type: 'string',
        description: 'RFC 1929, 1 to 255 bytes; never returned',
        writeOnly: true,
      },
    },
    ['address'],
  ),
  type: ['object', 'null'],
};

const createBody = bodyObject(
  {
    templateID: { type: 'string', minLength: 1, maxLength: 512 },
    timeout: { ...timeoutSeconds, description: `Seconds to live; default ${DEFAULT_TIMEOUT}` },
    autoPause: { type: 'boolean' },
    autoPauseMemory: {
      type: 'boolean',
      description:
        'false: the expiry pause keeps files only (needs autoPause; not with autoResume)',
    },
    autoResume: bodyObject({ enabled: { type: 'boolean' } }),
    secure: { type: 'boolean' },
    allow_internet_access: { type: 'boolean' },
    network: bodyObject({
      allowPublicTraffic: { type: 'boolean' },
      allowOut: stringList,
      denyOut: stringList,
      maskRequestHost: { type: 'string', maxLength: 255 },
      egressProxy,
      httpsPorts: {
        type: 'array',
        maxItems: 1024,
        items: { type: 'integer', minimum: 1, maximum: 65535 },
        description: `Sandbox ports that serve TLS; not ${SANDBOX_API_PORT}`,
      },
    }),
    metadata: { type: 'object', additionalProperties: { type: 'string' } },
    envVars: { type: 'object', additionalProperties: { type: 'string' } },
    mcp: { description: 'MCP gateways are not supported: any value but null is refused' },
    volumeMounts: { type: 'array', description: 'Volumes are not supported: must be empty' },
  },
  ['templateID'],
);

const networkBody = bodyObject({
  allowOut: stringList,
  denyOut: stringList,
  allow_internet_access: { type: 'boolean' },
  // What policy files say about themselves: accepted (so a file is a body as it is), not kept.
  description: {
    type: 'string',
    maxLength: MAX_DESCRIPTION_LENGTH,
    description: 'Accepted and ignored: what a policy file is for',
  },
  egressProxy,
});

const listQuery = {
  type: 'object',
  properties: {
    metadata: { type: 'string', description: 'URL-encoded key=value pairs, all must match' },
    state: { type: 'string', description: 'Comma list of running, paused' },
    order: { type: 'string', enum: ['asc', 'desc'] },
    startedAfter: { type: 'string', format: 'date-time' },
    template: { type: 'string' },
    limit: { type: 'integer', description: '1..100 (clamped), default 100' },
    nextToken: { type: 'string' },
  },
  additionalProperties: false,
};

/** The SDK encodes each key and value, then the whole `k=v&...` string, then the query. */
function decodeMetadata(text: string | undefined): Record<string, string> {
  if (text === undefined || text === '') return {};
  try {
    return Object.fromEntries(
      [...new URLSearchParams(text)].map(([k, v]) => [
        decodeURIComponent(k),
        decodeURIComponent(v),
      ]),
    );
  } catch {
    throw new SandboxError(400, `query.metadata is not a valid encoded key=value list: ${text}`);
  }
}

function decodeStates(text: string | undefined): SandboxState[] {
  if (text === undefined || text === '') return ['running', 'paused'];
  const states = text.split(',');
  const unknown = states.find((s) => s !== 'running' && s !== 'paused');
  if (unknown !== undefined) {
    throw new SandboxError(
      400,
      `query.state has unknown state ${JSON.stringify(unknown)}; use running, paused`,
    );
  }
  return states as SandboxState[];
}

interface ListQuery {
  metadata?: string;
  state?: string;
  order?: Order;
  startedAfter?: string;
  template?: string;
  limit?: number;
  nextToken?: string;
}

/** One page of a list: the items, and the cursor of the next page (absent on the last). */
function pageReply<T, V>(reply: FastifyReply, page: Page<T>, view: (item: T) => V): V[] {
  if (page.nextToken !== undefined) reply.header('X-Next-Token', page.nextToken);
  return page.items.map(view);
}

/** Create fields the SDK sends that name features Moat lacks: refused with their name. */
interface UnsupportedFields {
  mcp?: unknown;
  volumeMounts?: unknown[];
}

function refuseUnsupported(body: UnsupportedFields): void {
  if (body.mcp !== undefined && body.mcp !== null) {
    throw new SandboxError(400, 'MCP gateways are not supported by Moat');
  }
  if (body.volumeMounts !== undefined && body.volumeMounts.length > 0) {
    throw new SandboxError(400, 'volume mounts are not supported by Moat');
  }
}

const idOf = (request: FastifyRequest) => (request.params as { sandboxID: string }).sandboxID;

export const ROUTES: readonly RouteSpec[] = [
  // v2 (what the SDK uses) always secures the sandbox API: the SDK no longer sends `secure` and
  // expects an envdAccessToken. The v1 path keeps the seed's default (not secure).
  ...(
    [
      ['/sandboxes', false],
      ['/v2/sandboxes', true],
    ] as const
  ).map(([url, secureByDefault]): RouteSpec => ({
    method: 'POST',
    url,
    runsOn: 'placement',
    summary: secureByDefault
      ? 'Create a sandbox (secure unless `secure: false`)'
      : 'Create a sandbox (not secure unless `secure: true`)',
    auth: true,
    schema: {
      body: createBody,
      response: { 201: createdSchema, ...errors(400, 401, 404, 500, 503) },
    },
    handler: async (request, reply, { service }) => {
      const body = request.body as CreateRequest & UnsupportedFields;
      refuseUnsupported(body);
      if (body.network?.httpsPorts?.includes(SANDBOX_API_PORT))
        throw new SandboxError(
          400,
          `body.network.httpsPorts cannot list ${SANDBOX_API_PORT}: it is the sandbox API's own port`,
        );
      const record = await service.create({ ...body, secure: body.secure ?? secureByDefault });
      reply.code(201);
      return createdView(record);
    },
  })),
  {
    method: 'GET',
    url: '/sandboxes',
    summary: 'List running sandboxes',
    auth: true,
    schema: {
      querystring: {
        type: 'object',
        properties: { metadata: listQuery.properties.metadata },
        additionalProperties: false,
      },
      response: { 200: listedSchema, ...errors(400, 401) },
    },
    handler: async (request, _reply, { service }) => {
      const query = request.query as ListQuery;
      const page = await service.list({
        states: ['running'],
        metadata: decodeMetadata(query.metadata),
        order: 'desc',
        limit: Number.MAX_SAFE_INTEGER,
      });
      return page.items.map(listedView);
    },
  },
  {
    method: 'GET',
    url: '/v2/sandboxes',
    summary: 'List sandboxes, filtered and paginated (cursor in X-Next-Token)',
    auth: true,
    schema: { querystring: listQuery, response: { 200: listedSchema, ...errors(400, 401) } },
    handler: async (request, reply, { service }) => {
      const query = request.query as ListQuery;
      const page = await service.list({
        states: decodeStates(query.state),
        metadata: decodeMetadata(query.metadata),
        template: query.template,
        startedAfter: query.startedAfter === undefined ? undefined : Date.parse(query.startedAfter),
        order: query.order ?? 'desc',
        limit: Math.min(100, Math.max(1, query.limit ?? 100)),
        nextToken: query.nextToken,
      });
      return pageReply(reply, page, listedView);
    },
  },
  {
    method: 'GET',
    url: '/sandboxes/:sandboxID',
    // The owner answers: the egress block describes its proxy, DNS and enforcement.
    runsOn: 'owner',
    summary: 'Get a running or paused sandbox',
    auth: true,
    schema: { params: sandboxParams, response: { 200: detailSchema, ...errors(400, 401, 404) } },
    handler: async (request, _reply, { service, egress, flows }) => {
      const record = await service.get(idOf(request));
      return detailView(record, egress, flows.totalsOf(record.sandboxID));
    },
  },
  {
    method: 'GET',
    url: '/flows',
    summary:
      'Flow records of this node, newest first; follow=true streams new ones (NDJSON, or SSE)',
    auth: true,
    schema: {
      querystring: flowsQuerySchema,
      response: { 200: { type: 'array', items: flowSchema }, ...errors(400, 401) },
    },
    handler: (request, reply, { flows }) => listFlows(request, reply, flows),
  },
  caRoute,
  {
    method: 'DELETE',
    url: '/sandboxes/:sandboxID',
    runsOn: 'owner',
    summary: 'Kill a running sandbox or remove a paused one',
    auth: true,
    schema: { params: sandboxParams, response: { ...noContent, ...errors(400, 401, 404, 503) } },
    handler: async (request, reply, { service }) => {
      await service.kill(idOf(request));
      reply.code(204);
    },
  },
  {
    method: 'POST',
    url: '/sandboxes/:sandboxID/timeout',
    runsOn: 'owner',
    summary: 'Expire the sandbox `timeout` seconds from now (may shorten)',
    auth: true,
    schema: {
      params: sandboxParams,
      body: bodyObject({ timeout: timeoutSeconds }, ['timeout']),
      response: { ...noContent, ...errors(400, 401, 404, 503) },
    },
    handler: async (request, reply, { service }) => {
      await service.setTimeout(idOf(request), (request.body as { timeout: number }).timeout);
      reply.code(204);
    },
  },
  {
    method: 'POST',
    url: '/sandboxes/:sandboxID/refreshes',
    runsOn: 'owner',
    summary: 'Keep the sandbox alive at least `duration` seconds more (never shortens)',
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: bodyObject({ duration: { type: 'integer', minimum: 0, maximum: 3600 } }),
      response: { ...noContent, ...errors(400, 401, 404, 503) },
    },
    handler: async (request, reply, { service }) => {
      const { duration } = request.body as { duration?: number };
      await service.refresh(idOf(request), duration ?? DEFAULT_TIMEOUT);
      reply.code(204);
    },
  },
  {
    method: 'POST',
    url: '/sandboxes/:sandboxID/pause',
    runsOn: 'owner',
    summary: 'Pause a running sandbox (409 when already paused)',
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: bodyObject({
        memory: {
          type: 'boolean',
          description: 'false: end its processes and keep its files; resuming cold-boots it',
        },
      }),
      response: { ...noContent, ...errors(400, 401, 404, 409, 503) },
    },
    handler: async (request, reply, { service }) => {
      const { memory } = request.body as { memory?: boolean };
      await service.pause(idOf(request), memory ?? true);
      reply.code(204);
    },
  },
  {
    method: 'POST',
    url: '/sandboxes/:sandboxID/resume',
    runsOn: 'owner',
    summary: 'Resume a paused sandbox (deprecated; use connect)',
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: bodyObject({ timeout: timeoutSeconds, autoPause: { type: 'boolean' } }),
      response: { 201: createdSchema, ...errors(400, 401, 404, 409, 503) },
    },
    handler: async (request, reply, { service }) => {
      const { timeout } = request.body as { timeout?: number };
      const record = await service.resume(idOf(request), timeout ?? DEFAULT_TIMEOUT);
      reply.code(201);
      return createdView(record);
    },
  },
  ...['/sandboxes/:sandboxID/connect', '/v2/sandboxes/:sandboxID/connect'].map(
    (url): RouteSpec => ({
      method: 'POST',
      url,
      runsOn: 'owner',
      summary:
        'Connect: resume a paused sandbox (201) or extend a running one, never shortening (200)',
      auth: true,
      optionalBody: true,
      schema: {
        params: sandboxParams,
        body: bodyObject({
          timeout: timeoutSeconds,
          memory: {
            type: 'boolean',
            description: 'false: a paused sandbox starts again from its files (a cold boot)',
          },
        }),
        response: { 200: createdSchema, 201: createdSchema, ...errors(400, 401, 404, 503) },
      },
      handler: async (request, reply, { service }) => {
        const { timeout, memory } = request.body as { timeout?: number; memory?: boolean };
        const { record, resumed } = await service.connect(
          idOf(request),
          timeout ?? DEFAULT_TIMEOUT,
          memory ?? true,
        );
        reply.code(resumed ? 201 : 200);
        return createdView(record);
      },
    }),
  ),
  {
    method: 'PUT',
    url: '/sandboxes/:sandboxID/network',
    summary: 'Replace the egress rules of a running sandbox ({} clears them)',
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: networkBody,
      response: { ...noContent, ...errors(400, 401, 404, 503) },
    },
    handler: async (request, reply, { service }) => {
      await service.updateNetwork(idOf(request), request.body as object);
      reply.code(204);
    },
  },
  {
    method: 'POST',
    url: '/sandboxes/:sandboxID/snapshots',
    runsOn: 'owner',
    summary: 'Snapshot the sandbox’s files as a template; the sandbox keeps running',
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: bodyObject({ name: { type: 'string', minLength: 1, maxLength: 200 } }),
      response: { 201: snapshotSchema, ...errors(400, 401, 404, 503) },
    },
    handler: async (request, reply, { service }) => {
      const { name } = request.body as { name?: string };
      reply.code(201);
      return snapshotView(await service.createSnapshot(idOf(request), name));
    },
  },
  {
    method: 'POST',
    url: '/sandboxes/:sandboxID/fork',
    runsOn: 'owner',
    summary: `Make \`count\` (1..${MAX_FORKS}) sandboxes from a copy of this one’s files and network config; processes are not carried, the source keeps running`,
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: bodyObject({
        count: { type: 'integer', minimum: 1, maximum: MAX_FORKS, description: 'Default 1' },
        timeout: {
          ...timeoutSeconds,
          description: `Seconds the forks live; default ${DEFAULT_TIMEOUT}`,
        },
      }),
      response: { 201: forkResultsSchema, ...errors(400, 401, 404, 503) },
    },
    handler: async (request, reply, { service }) => {
      const { count, timeout } = request.body as { count?: number; timeout?: number };
      const results = await service.fork(idOf(request), count ?? 1, timeout ?? DEFAULT_TIMEOUT);
      reply.code(201);
      return results.map(forkView);
    },
  },
  {
    method: 'GET',
    url: '/sandboxes/:sandboxID/metrics',
    runsOn: 'owner',
    summary: 'CPU, memory and disk use of the sandbox, sampled every 5 s (the last hour kept)',
    auth: true,
    schema: {
      params: sandboxParams,
      querystring: {
        type: 'object',
        properties: {
          start: { type: 'integer', minimum: 0, description: 'Unix seconds; samples from then' },
          end: { type: 'integer', minimum: 0, description: 'Unix seconds; samples until then' },
        },
        additionalProperties: false,
      },
      response: { 200: { type: 'array', items: metricSchema }, ...errors(400, 401, 404) },
    },
    handler: async (request, _reply, { service }) => {
      const { start, end } = request.query as { start?: number; end?: number };
      if (start !== undefined && end !== undefined && start > end) {
        throw new SandboxError(400, `query.start (${start}) is after query.end (${end})`);
      }
      const samples = await service.metrics(
        idOf(request),
        start === undefined ? undefined : start * 1000,
        end === undefined ? undefined : end * 1000,
      );
      return samples.map(metricView);
    },
  },
  {
    method: 'GET',
    url: '/sandboxes/metrics',
    summary: 'The newest metrics sample of each listed sandbox (unknown IDs are left out)',
    auth: true,
    schema: {
      querystring: {
        type: 'object',
        properties: {
          sandbox_ids: { type: 'string', minLength: 1, description: 'Comma list, at most 100' },
        },
        required: ['sandbox_ids'],
        additionalProperties: false,
      },
      response: {
        200: {
          type: 'object',
          properties: { sandboxes: { type: 'object', additionalProperties: metricSchema } },
          required: ['sandboxes'],
        },
        ...errors(400, 401),
      },
    },
    handler: async (request, _reply, { service }) => {
      const ids = (request.query as { sandbox_ids: string }).sandbox_ids.split(',');
      if (ids.length > 100) {
        throw new SandboxError(400, `query.sandbox_ids lists ${ids.length} sandboxes; at most 100`);
      }
      const latest = service.latestMetrics(ids);
      return { sandboxes: Object.fromEntries([...latest].map(([id, m]) => [id, metricView(m)])) };
    },
  },
  {
    method: 'GET',
    url: '/snapshots',
    summary: 'List snapshots, newest first (cursor in X-Next-Token)',
    auth: true,
    schema: {
      querystring: {
        type: 'object',
        properties: {
          sandboxID: { type: 'string' },
          name: { type: 'string' },
          limit: { type: 'integer', minimum: 1, maximum: 100 },
          nextToken: { type: 'string' },
        },
        additionalProperties: false,
      },
      response: { 200: { type: 'array', items: snapshotSchema }, ...errors(400, 401) },
    },
    handler: async (request, reply, { service }) => {
      const query = request.query as {
        sandboxID?: string;
        name?: string;
        limit?: number;
        nextToken?: string;
      };
      const page = await service.listSnapshots({ ...query, limit: query.limit ?? 100 });
      return pageReply(reply, page, snapshotView);
    },
  },
  {
    method: 'GET',
    url: '/templates',
    summary: 'List templates: the built-in base and every snapshot',
    auth: true,
    schema: { response: { 200: templatesSchema, ...errors(401) } },
    handler: async (_request, _reply, { service }) => [
      BASE_TEMPLATE_VIEW,
      ...(await service.snapshots()).sort((a, b) => b.createdAt - a.createdAt).map(templateView),
    ],
  },
  {
    method: 'DELETE',
    url: '/templates/:templateID',
    summary: 'Delete a snapshot (or every tag of a template); refused while sandboxes use it',
    auth: true,
    schema: {
      params: {
        type: 'object',
        properties: { templateID: { type: 'string', minLength: 1 } },
        required: ['templateID'],
      },
      response: { ...noContent, ...errors(400, 401, 404, 409, 503) },
    },
    handler: async (request, reply, { service }) => {
      await service.deleteTemplate((request.params as { templateID: string }).templateID);
      reply.code(204);
    },
  },
];
