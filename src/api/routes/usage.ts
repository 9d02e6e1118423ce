/** What sandboxes use: CPU, memory and disk samples, one sandbox's series or many's newest. */
import { SandboxError } from '../../sandbox/index.js';
import { type PlatformRoute, route } from './route.js';
import { errors, sandboxParams } from './schemas.js';
import { metricSchema, metricView } from '../views.js';

export const USAGE_ROUTES: readonly PlatformRoute[] = [
  route({
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
      const { start, end } = request.query;
      if (start !== undefined && end !== undefined && start > end) {
        throw new SandboxError(400, `query.start (${start}) is after query.end (${end})`);
      }
      const samples = await service.metrics(
        request.params.sandboxID,
        start === undefined ? undefined : start * 1000,
        end === undefined ? undefined : end * 1000,
      );
      return samples.map(metricView);
    },
  }),
  route({
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
      const ids = request.query.sandbox_ids.split(',');
      if (ids.length > 100) {
        throw new SandboxError(400, `query.sandbox_ids lists ${ids.length} sandboxes; at most 100`);
      }
      const latest = service.latestMetrics(ids);
      return { sandboxes: Object.fromEntries([...latest].map(([id, m]) => [id, metricView(m)])) };
    },
  }),
];
