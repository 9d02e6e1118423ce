/** How long a sandbox lives and whether it runs: timeout, refresh, pause, resume and connect. */
import { DEFAULT_TIMEOUT } from '../../sandbox/index.js';
import { type PlatformRoute, route } from './route.js';
import { bodyObject, errors, noContent, sandboxParams, timeoutSeconds } from './schemas.js';
import { createdSchema, createdView } from '../views.js';

export const LIFETIME_ROUTES: readonly PlatformRoute[] = [
  route({
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
      await service.setTimeout(request.params.sandboxID, request.body.timeout);
      reply.code(204);
    },
  }),
  route({
    method: 'POST',
    url: '/sandboxes/:sandboxID/refreshes',
    runsOn: 'owner',
    summary: 'Keep the sandbox alive at least `duration` seconds more (never shortens)',
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: bodyObject({ duration: { type: 'integer', minimum: 0, maximum: 3600 } }, []),
      response: { ...noContent, ...errors(400, 401, 404, 503) },
    },
    handler: async (request, reply, { service }) => {
      await service.refresh(request.params.sandboxID, request.body.duration ?? DEFAULT_TIMEOUT);
      reply.code(204);
    },
  }),
  route({
    method: 'POST',
    url: '/sandboxes/:sandboxID/pause',
    runsOn: 'owner',
    summary: 'Pause a running sandbox (409 when already paused)',
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: bodyObject(
        {
          memory: {
            type: 'boolean',
            description: 'false: end its processes and keep its files; resuming cold-boots it',
          },
        },
        [],
      ),
      response: { ...noContent, ...errors(400, 401, 404, 409, 501, 503) },
    },
    handler: async (request, reply, { service }) => {
      await service.pause(request.params.sandboxID, request.body.memory ?? true);
      reply.code(204);
    },
  }),
  route({
    method: 'POST',
    url: '/sandboxes/:sandboxID/resume',
    runsOn: 'owner',
    summary: 'Resume a paused sandbox (deprecated; use connect)',
    auth: true,
    optionalBody: true,
    schema: {
      params: sandboxParams,
      body: bodyObject({ timeout: timeoutSeconds, autoPause: { type: 'boolean' } }, []),
      response: { 201: createdSchema, ...errors(400, 401, 404, 409, 501, 503) },
    },
    handler: async (request, reply, { service }) => {
      const seconds = request.body.timeout ?? DEFAULT_TIMEOUT;
      const record = await service.resume(request.params.sandboxID, seconds);
      reply.code(201);
      return createdView(record);
    },
  }),
  ...['/sandboxes/:sandboxID/connect', '/v2/sandboxes/:sandboxID/connect'].map((url) =>
    route({
      method: 'POST',
      url,
      runsOn: 'owner',
      summary:
        'Connect: resume a paused sandbox (201) or extend a running one, never shortening (200)',
      auth: true,
      optionalBody: true,
      schema: {
        params: sandboxParams,
        body: bodyObject(
          {
            timeout: timeoutSeconds,
            memory: {
              type: 'boolean',
              description: 'false: a paused sandbox starts again from its files (a cold boot)',
            },
          },
          [],
        ),
        response: { 200: createdSchema, 201: createdSchema, ...errors(400, 401, 404, 503) },
      },
      handler: async (request, reply, { service }) => {
        const { timeout, memory } = request.body;
        const { record, resumed } = await service.connect(
          request.params.sandboxID,
          timeout ?? DEFAULT_TIMEOUT,
          memory ?? true,
        );
        reply.code(resumed ? 201 : 200);
        return createdView(record);
      },
    }),
  ),
];
