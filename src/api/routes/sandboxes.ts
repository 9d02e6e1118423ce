/** The sandboxes themselves: create, list, get and kill. */
import {
  DEFAULT_TIMEOUT,
  IDENTITY_SETTING,
  JWT_SVID,
  MAX_AUDIENCE_LENGTH,
  MAX_IAM_TOKENS,
  type SandboxState,
  SandboxError,
} from '../../sandbox/index.js';
import { SANDBOX_API_PORT } from '../../e2b-wire/index.js';
import { bandwidthSchema, egressProxy, networkModeSchema, networkRulesSchema } from './network.js';
import { type PlatformRoute, route } from './route.js';
import {
  bodyObject,
  errors,
  noContent,
  sandboxParams,
  stringList,
  timeoutSeconds,
} from './schemas.js';
import { pageLimit, pageReply } from './pages.js';
import {
  createReplySchema,
  createReplyView,
  detailSchema,
  detailView,
  listedSchema,
  listedView,
} from '../views.js';

const createBody = bodyObject(
  {
    templateID: { type: 'string', minLength: 1, maxLength: 512 },
    timeout: {
      ...timeoutSeconds,
      description: `Seconds to live; default ${DEFAULT_TIMEOUT} (template network-only: no expiry)`,
    },
    autoPause: { type: 'boolean' },
    autoPauseMemory: {
      type: 'boolean',
      description:
        'false: the expiry pause keeps files only (needs autoPause; not with autoResume)',
    },
    autoResume: bodyObject({ enabled: { type: 'boolean' } }, []),
    secure: { type: 'boolean' },
    allow_internet_access: { type: 'boolean' },
    network: bodyObject(
      {
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
        rules: networkRulesSchema,
        bandwidth: { ...bandwidthSchema, description: 'Moat extension: Mbit/s each way' },
        mode: networkModeSchema,
      },
      [],
    ),
    iam: bodyObject(
      {
        tokens: {
          type: 'object',
          description: `Workload identity tokens by name (at most ${MAX_IAM_TOKENS}): ${JWT_SVID} minted per request where a rule names \${e2b.identity.tokens.NAME}; needs the operator's ${IDENTITY_SETTING}`,
          maxProperties: MAX_IAM_TOKENS,
          additionalProperties: bodyObject(
            {
              audience: { type: 'string', maxLength: MAX_AUDIENCE_LENGTH },
              tokenType: { type: 'string', maxLength: 256 },
            },
            ['audience', 'tokenType'],
          ),
        },
      },
      [],
    ),
    metadata: { type: 'object', additionalProperties: { type: 'string' } },
    envVars: { type: 'object', additionalProperties: { type: 'string' } },
    netns: {
      type: 'string',
      maxLength: 4096,
      description:
        'Moat extension, template network-only: the network namespace to adopt (/run/netns/<name> or /proc/<pid>/ns/net)',
    },
    ifname: {
      type: 'string',
      description: 'Moat extension, template network-only: Moat’s interface in it (default moat0)',
    },
    guestLink: {
      type: 'string',
      enum: ['routed', 'redirect'],
      description:
        'Moat extension, template network-only: "redirect" when a runtime joins ifname to a guest’s tap below the IP stack (tc-redirect-tap): ifname is then the end of a veth pair whose other end Moat routes (default "routed")',
    },
    mcp: { description: 'MCP gateways are not supported: any value but null is refused' },
    volumeMounts: { type: 'array', description: 'Volumes are not supported: must be empty' },
  },
  ['templateID'],
);

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
} as const;

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

const isState = (text: string): text is SandboxState => text === 'running' || text === 'paused';

function decodeStates(text: string | undefined): SandboxState[] {
  if (text === undefined || text === '') return ['running', 'paused'];
  const states = text.split(',');
  const unknown = states.find((s) => !isState(s));
  if (unknown !== undefined) {
    throw new SandboxError(
      400,
      `query.state has unknown state ${JSON.stringify(unknown)}; use running, paused`,
    );
  }
  return states.filter(isState);
}

/** Create fields the SDK sends that name features Moat lacks: refused with their name. */
function refuseUnsupported(body: { mcp?: unknown; volumeMounts?: unknown[] }): void {
  if (body.mcp !== undefined && body.mcp !== null) {
    throw new SandboxError(400, 'MCP gateways are not supported by Moat');
  }
  if (body.volumeMounts !== undefined && body.volumeMounts.length > 0) {
    throw new SandboxError(400, 'volume mounts are not supported by Moat');
  }
}

export const SANDBOX_ROUTES: readonly PlatformRoute[] = [
  // v2 (what the SDK uses) always secures the sandbox API: the SDK no longer sends `secure` and
  // expects an envdAccessToken. The v1 path keeps the service specification's default (not secure).
  ...(
    [
      ['/sandboxes', false],
      ['/v2/sandboxes', true],
    ] as const
  ).map(([url, secureByDefault]) =>
    route({
      method: 'POST',
      url,
      runsOn: 'placement',
      summary: secureByDefault
        ? 'Create a sandbox (secure unless `secure: false`)'
        : 'Create a sandbox (not secure unless `secure: true`)',
      auth: true,
      schema: {
        body: createBody,
        response: { 201: createReplySchema, ...errors(400, 401, 404, 500, 501, 503) },
      },
      handler: async (request, reply, { service, egress }) => {
        const { mcp, volumeMounts, ...body } = request.body;
        refuseUnsupported({ mcp, volumeMounts });
        if (body.network?.httpsPorts?.includes(SANDBOX_API_PORT))
          throw new SandboxError(
            400,
            `body.network.httpsPorts cannot list ${SANDBOX_API_PORT}: it is the sandbox API's own port`,
          );
        const record = await service.create({ ...body, secure: body.secure ?? secureByDefault });
        reply.code(201);
        return createReplyView(record, egress);
      },
    }),
  ),
  route({
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
      const page = await service.list({
        states: ['running'],
        metadata: decodeMetadata(request.query.metadata),
        order: 'desc',
        limit: Number.MAX_SAFE_INTEGER,
      });
      return page.items.map(listedView);
    },
  }),
  route({
    method: 'GET',
    url: '/v2/sandboxes',
    summary: 'List sandboxes, filtered and paginated (cursor in X-Next-Token)',
    auth: true,
    schema: { querystring: listQuery, response: { 200: listedSchema, ...errors(400, 401) } },
    handler: async (request, reply, { service }) => {
      const { query } = request;
      const page = await service.list({
        states: decodeStates(query.state),
        metadata: decodeMetadata(query.metadata),
        template: query.template,
        startedAfter: query.startedAfter === undefined ? undefined : Date.parse(query.startedAfter),
        order: query.order ?? 'desc',
        limit: pageLimit(query.limit),
        nextToken: query.nextToken,
      });
      return pageReply(reply, page, listedView);
    },
  }),
  route({
    method: 'GET',
    url: '/sandboxes/:sandboxID',
    // The owner answers: the egress block describes its proxy, DNS and enforcement.
    runsOn: 'owner',
    summary: 'Get a running or paused sandbox',
    auth: true,
    schema: { params: sandboxParams, response: { 200: detailSchema, ...errors(400, 401, 404) } },
    handler: async (request, _reply, { service, egress, flows }) => {
      const record = await service.get(request.params.sandboxID);
      return detailView(
        record,
        egress,
        flows.totalsOf(record.sandboxID),
        service.presetsOf(record),
      );
    },
  }),
  route({
    method: 'DELETE',
    url: '/sandboxes/:sandboxID',
    runsOn: 'owner',
    summary: 'Kill a running sandbox or remove a paused one',
    auth: true,
    schema: { params: sandboxParams, response: { ...noContent, ...errors(400, 401, 404, 503) } },
    handler: async (request, reply, { service }) => {
      await service.kill(request.params.sandboxID);
      reply.code(204);
    },
  }),
];
