/**
 * A sandbox's egress rules: `PUT /sandboxes/{id}/network`, and the schemas of the rules the
 * create body's `network` shares with it.
 */
import { MAX_DESCRIPTION_LENGTH, MAX_RULE_KEYS, NETWORK_MODES } from '../../policy/index.js';
import { MAX_BANDWIDTH_MBPS } from '../../runtime/index.js';
import { type PlatformRoute, route } from './route.js';
import { bodyObject, errors, noContent, sandboxParams, stringList } from './schemas.js';

/** E2B's SandboxEgressProxyConfig; null is "no proxy". Sizes and the address are checked later. */
export const egressProxy = {
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
} as const;

const mbps = (direction: string) =>
  ({
    type: 'integer',
    minimum: 0,
    maximum: MAX_BANDWIDTH_MBPS,
    description: `Mbit/s ${direction}; 0: unlimited; left out: the operator's default`,
  }) as const;

/** Moat's `network.bandwidth`, held in the kernel on the sandbox's link (namespace mode only). */
export const bandwidthSchema = bodyObject(
  { egressMbps: mbps('the sandbox sends'), ingressMbps: mbps('the sandbox receives') },
  [],
);

/** Moat's `network.mode`: enforce the policy, or only report what it would deny. */
export const networkModeSchema = {
  type: 'string',
  enum: [...NETWORK_MODES],
  description:
    'Moat extension: "enforce", or "report" (what the sandbox\'s rules deny is let through and recorded with wouldDeny; the host, internal addresses and other sandboxes stay closed); left out, the sandbox\'s mode stays (at create: the operator\'s default)',
} as const;

/**
 * `match` and `action` of a rule (a Moat extension), beside its transform or inside it (the
 * form E2B SDK 2.51 sends on). Their contents are checked by the policy parser, whose messages
 * name the rule.
 */
const requestAccess = {
  match: {
    type: 'object',
    description:
      'Moat extension: { "methods": ["GET", ...], "paths": ["/repos/acme/*", ...] }; the rule applies to requests that fit',
  },
  action: {
    type: 'string',
    description: 'Moat extension: "allow" or "deny"; the first fitting rule with an action decides',
  },
} as const;

/** E2B's `network.rules`; keys, headers and values are checked by the policy parser. */
export const networkRulesSchema = {
  type: 'object',
  maxProperties: MAX_RULE_KEYS,
  description:
    'Headers Moat sets on intercepted HTTPS requests to a destination: { "<name or *.name>": [ { "transform": { "headers": { "<Name>": "<value, may hold ${e2b.secrets.<name>}>" } } } ] }, and (a Moat extension) which methods and paths may be sent. Rules grant no access: allowOut decides',
  additionalProperties: {
    type: 'array',
    items: bodyObject(
      {
        transform: bodyObject(
          {
            headers: { type: 'object', additionalProperties: { type: 'string' } },
            ...requestAccess,
          },
          [],
        ),
        ...requestAccess,
      },
      [],
    ),
  },
} as const;

const networkBody = bodyObject(
  {
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
    rules: { ...networkRulesSchema, description: 'Replaces the rules; left out, they are cleared' },
    bandwidth: {
      ...bandwidthSchema,
      description: "Moat extension: replaces the bandwidth; left out, the operator's defaults",
    },
    mode: networkModeSchema,
  },
  [],
);

export const NETWORK_ROUTES: readonly PlatformRoute[] = [
  route({
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
      await service.updateNetwork(request.params.sandboxID, request.body);
      reply.code(204);
    },
  }),
];
