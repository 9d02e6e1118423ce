/**
 * Copies of a sandbox's files: snapshots (kept as templates, listed and deleted) and forks (new
 * sandboxes from a copy).
 */
import { DEFAULT_TIMEOUT, MAX_FORKS } from '../../sandbox/index.js';
import { pageReply } from './pages.js';
import { type PlatformRoute, route } from './route.js';
import { bodyObject, errors, noContent, sandboxParams, timeoutSeconds } from './schemas.js';
import {
  BASE_TEMPLATE_VIEW,
  forkResultsSchema,
  forkView,
  snapshotSchema,
  snapshotView,
  templatesSchema,
  templateView,
} from '../views.js';

export const SNAPSHOT_ROUTES: readonly PlatformRoute[] = [
  route({
    method: 'POST',
    url: '/sandboxes/:sandboxID/snapshots',
    runsOn: 'owner',
    summary: 'Snapshot the sandbox’s files as a template; the sandbox keeps running',
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: bodyObject({ name: { type: 'string', minLength: 1, maxLength: 200 } }, []),
      response: { 201: snapshotSchema, ...errors(400, 401, 404, 501, 503) },
    },
    handler: async (request, reply, { service }) => {
      const snapshot = await service.createSnapshot(request.params.sandboxID, request.body.name);
      reply.code(201);
      return snapshotView(snapshot);
    },
  }),
  route({
    method: 'POST',
    url: '/sandboxes/:sandboxID/fork',
    runsOn: 'owner',
    summary: `Make \`count\` (1..${MAX_FORKS}) sandboxes from a copy of this one’s files and network config; processes are not carried, the source keeps running`,
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: bodyObject(
        {
          count: { type: 'integer', minimum: 1, maximum: MAX_FORKS, description: 'Default 1' },
          timeout: {
            ...timeoutSeconds,
            description: `Seconds the forks live; default ${DEFAULT_TIMEOUT}`,
          },
        },
        [],
      ),
      response: { 201: forkResultsSchema, ...errors(400, 401, 404, 501, 503) },
    },
    handler: async (request, reply, { service }) => {
      const { count, timeout } = request.body;
      const results = await service.fork(
        request.params.sandboxID,
        count ?? 1,
        timeout ?? DEFAULT_TIMEOUT,
      );
      reply.code(201);
      return results.map(forkView);
    },
  }),
  route({
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
      const { query } = request;
      const page = await service.listSnapshots({ ...query, limit: query.limit ?? 100 });
      return pageReply(reply, page, snapshotView);
    },
  }),
  route({
    method: 'GET',
    url: '/templates',
    summary: 'List templates: the built-in base and every snapshot',
    auth: true,
    schema: { response: { 200: templatesSchema, ...errors(401) } },
    handler: async (_request, _reply, { service }) => [
      BASE_TEMPLATE_VIEW,
      ...(await service.snapshots()).sort((a, b) => b.createdAt - a.createdAt).map(templateView),
    ],
  }),
  route({
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
      await service.deleteTemplate(request.params.templateID);
      reply.code(204);
    },
  }),
];
