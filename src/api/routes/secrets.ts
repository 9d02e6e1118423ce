/**
 * The E2B secrets API: `/secrets` and `/secrets/{secretID}` (an ID or a name). Values are
 * write-only: a reply is a secret's metadata, and its schema has no field a value could leak
 * through (Fastify serialises replies with these schemas, dropping anything else).
 */
import {
  MAX_METADATA_ENTRIES,
  MAX_METADATA_KEY_BYTES,
  MAX_METADATA_VALUE_BYTES,
  MAX_NAME_LENGTH,
  MAX_VALUE_BYTES,
  type SecretInfo,
  SecretsError,
} from '../../secrets/index.js';
import { paginate, SandboxError } from '../../sandbox/index.js';
import { pageLimit, pageReply } from './pages.js';
import { type PlatformRoute, route } from './route.js';
import { errors, noContent } from './schemas.js';

const secretParams = {
  type: 'object',
  properties: { secretID: { type: 'string', description: 'A secret ID (sec_...) or name' } },
  required: ['secretID'],
} as const;

const metadata = {
  type: 'object',
  maxProperties: MAX_METADATA_ENTRIES,
  additionalProperties: { type: 'string' },
  description: `At most ${MAX_METADATA_ENTRIES} entries; keys up to ${MAX_METADATA_KEY_BYTES} bytes, values up to ${MAX_METADATA_VALUE_BYTES}, 8192 in all`,
} as const;
const value = {
  type: 'string',
  minLength: 1,
  maxLength: MAX_VALUE_BYTES,
  writeOnly: true,
  description: `Write-only: never returned. Up to ${MAX_VALUE_BYTES} bytes, no control characters (it is sent in HTTP headers)`,
} as const;

export const secretSchema = {
  type: 'object',
  description: 'A secret’s metadata; never its value',
  properties: {
    secretID: { type: 'string' },
    name: { type: 'string' },
    currentVersion: { type: 'integer' },
    metadata: { type: 'object', additionalProperties: { type: 'string' } },
    createdAt: { type: 'string', format: 'date-time' },
    updatedAt: { type: 'string', format: 'date-time' },
  },
  required: ['secretID', 'name', 'currentVersion', 'metadata', 'createdAt', 'updatedAt'],
};

const secretView = (s: SecretInfo) => ({
  secretID: s.secretID,
  name: s.name,
  currentVersion: s.currentVersion,
  metadata: s.metadata,
  createdAt: new Date(s.createdAt).toISOString(),
  updatedAt: new Date(s.updatedAt).toISOString(),
});

/** The vault's refusals answered as the API's own errors (same body, same status). */
async function answer<T>(work: Promise<T>): Promise<T> {
  try {
    return await work;
  } catch (error) {
    if (error instanceof SecretsError) throw new SandboxError(error.status, error.message);
    throw error;
  }
}

export const SECRET_ROUTES: readonly PlatformRoute[] = [
  route({
    method: 'GET',
    url: '/secrets',
    summary: 'List secrets, oldest first (cursor in X-Next-Token); never their values',
    auth: true,
    schema: {
      querystring: {
        type: 'object',
        properties: {
          limit: { type: 'integer', description: '1..100 (clamped), default 100' },
          nextToken: { type: 'string' },
        },
        additionalProperties: false,
      },
      response: { 200: { type: 'array', items: secretSchema }, ...errors(400, 401, 503) },
    },
    handler: async (request, reply, { secrets }) => {
      const { query } = request;
      const page = paginate(await answer(secrets.list()), (s) => [s.createdAt, s.secretID], {
        order: 'asc',
        limit: pageLimit(query.limit),
        nextToken: query.nextToken,
      });
      return pageReply(reply, page, secretView);
    },
  }),
  route({
    method: 'POST',
    url: '/secrets',
    summary: `Create a secret (names: 1 to ${MAX_NAME_LENGTH} of letters, digits, "_", "-", stored lower-case; "sec_" is reserved)`,
    auth: true,
    schema: {
      body: {
        type: 'object',
        properties: { name: { type: 'string', minLength: 1 }, value, metadata },
        required: ['name', 'value'],
        additionalProperties: false,
      },
      response: { 201: secretSchema, ...errors(400, 401, 409, 503) },
    },
    handler: async (request, reply, { secrets }) => {
      const { body } = request;
      const info = await answer(secrets.create(body.name, body.value, body.metadata));
      reply.code(201);
      return secretView(info);
    },
  }),
  route({
    method: 'GET',
    url: '/secrets/:secretID',
    summary: 'Get a secret’s metadata by ID or name',
    auth: true,
    schema: { params: secretParams, response: { 200: secretSchema, ...errors(401, 404, 503) } },
    handler: async (request, _reply, { secrets }) =>
      secretView(await answer(secrets.info(request.params.secretID))),
  }),
  route({
    method: 'POST',
    url: '/secrets/:secretID',
    summary:
      'Store a new value (the next version) of a secret; metadata, when given, replaces the old',
    auth: true,
    schema: {
      params: secretParams,
      body: {
        type: 'object',
        properties: { value, metadata },
        required: ['value'],
        additionalProperties: false,
      },
      response: { 200: secretSchema, ...errors(400, 401, 404, 503) },
    },
    handler: async (request, _reply, { secrets }) => {
      const { params, body } = request;
      return secretView(await answer(secrets.update(params.secretID, body.value, body.metadata)));
    },
  }),
  route({
    method: 'DELETE',
    url: '/secrets/:secretID',
    summary: 'Delete a secret: requests whose rules name it are no longer given it',
    auth: true,
    schema: {
      params: secretParams,
      response: { ...noContent, ...errors(401, 404, 503) },
    },
    handler: async (request, reply, { secrets }) => {
      await answer(secrets.delete(request.params.secretID));
      reply.code(204);
    },
  }),
];
