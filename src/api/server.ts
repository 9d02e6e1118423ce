/**
 * The platform API on Fastify: auth, error shapes, metrics and the routes of routes.ts.
 */
import Fastify, {
  type FastifyBaseLogger,
  type FastifyError,
  type FastifyInstance,
  LogController,
} from 'fastify';
import type { Logger } from 'pino';
import type { HostPort } from '../config.js';
import type { MoatMetrics } from '../metrics/index.js';
import { InvalidTokenError, SANDBOX_ID, SandboxError } from '../sandbox/index.js';
import { keyMatcher } from './keys.js';
import { openApiDocument } from './openapi.js';
import { ROUTES, type RouteContext } from './routes.js';
import { schemaErrorFormatter, validatorCompiler } from './validation.js';

export interface PlatformApiOptions extends RouteContext {
  readonly keys: readonly string[];
  readonly metrics: MoatMetrics;
  readonly logger: Logger;
  /** GET /metrics needs the API key too. */
  readonly metricsRequireKey: boolean;
  readonly version: string;
}

const errorBody = (code: number, message: string) => ({ code, message });

export function createPlatformApi(options: PlatformApiOptions): FastifyInstance {
  const { metrics, logger } = options;
  const app = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    // Our onResponse hook logs each request once, with the sandbox ID; Fastify's own lines off.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: 4 << 20,
    schemaErrorFormatter,
    routerOptions: { ignoreTrailingSlash: true },
  });
  app.setValidatorCompiler(validatorCompiler);
  // An empty body with a JSON content type (`curl -XPOST -H 'content-type: application/json'`)
  // means "no body", as it does for the routes whose body is optional; anything else is parsed
  // by Fastify's own parser, which refuses __proto__ and constructor poisoning.
  const parseJson = app.getDefaultJsonParser('error', 'error');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (request, body, done) => {
    if (body === '') {
      done(null, undefined);
      return;
    }
    parseJson(request, body as string, done);
  });
  const matches = keyMatcher(options.keys);

  const requireKey = async (request: { headers: Record<string, unknown> }) => {
    const given = request.headers['x-api-key'];
    if (typeof given !== 'string' || given === '') {
      throw new AuthError('missing X-API-Key header');
    }
    if (!matches(given)) throw new AuthError('invalid API key');
  };

  app.setErrorHandler((error: FastifyError, request, reply) => {
    if (error instanceof SandboxError || error instanceof AuthError) {
      if (error.status >= 500) {
        request.log.error(
          { err: error.message, sandboxID: sandboxIDOf(request) },
          'request failed',
        );
      }
      return reply.code(error.status).send(errorBody(error.status, error.message));
    }
    if (error instanceof InvalidTokenError)
      return reply.code(400).send(errorBody(400, error.message));
    const status = error.statusCode ?? 500;
    if (status >= 400 && status < 500) {
      return reply.code(status).send(errorBody(status, error.message));
    }
    request.log.error({ err: error, sandboxID: sandboxIDOf(request) }, 'request failed');
    return reply.code(500).send(errorBody(500, 'internal error; the server log has the details'));
  });
  app.setNotFoundHandler((request, reply) =>
    reply
      .code(404)
      .send(errorBody(404, `no route for ${request.method} ${request.url.split('?')[0]}`)),
  );

  app.addHook('onResponse', async (request, reply) => {
    const route = request.routeOptions.url ?? 'unmatched';
    metrics.apiRequestDuration.observe(
      { method: request.method, route, code: String(reply.statusCode) },
      reply.elapsedTime / 1000,
    );
    request.log.debug(
      {
        method: request.method,
        route,
        code: reply.statusCode,
        ms: Math.round(reply.elapsedTime * 100) / 100,
        sandboxID: sandboxIDOf(request),
      },
      'api request',
    );
  });

  for (const route of ROUTES) {
    app.route({
      method: route.method,
      url: route.url,
      schema: route.schema,
      onRequest: route.auth ? requireKey : undefined,
      preValidation: async (request) => {
        const id = sandboxIDOf(request);
        if (id !== undefined && !SANDBOX_ID.test(id))
          throw new SandboxError(400, 'Invalid sandbox ID');
        if (route.optionalBody && request.body === undefined) request.body = {};
      },
      handler: (request, reply) => route.handler(request, reply, options),
    });
  }

  app.get('/health', async () => ({ status: 'ok' }));
  app.get(
    '/metrics',
    { onRequest: options.metricsRequireKey ? requireKey : undefined },
    async (_request, reply) => {
      reply.header('Content-Type', metrics.registry.contentType);
      return metrics.registry.metrics();
    },
  );
  const document = openApiDocument(ROUTES, options.version);
  app.get('/openapi.json', async () => document);
  return app;
}

/** A missing or wrong API key: the API's own refusal, answered with the same error body. */
class AuthError extends Error {
  readonly status = 401;
}

const sandboxIDOf = (request: { params: unknown }) =>
  (request.params as { sandboxID?: string } | undefined)?.sandboxID;

export async function listenApi(app: FastifyInstance, at: HostPort): Promise<HostPort> {
  await app.listen({ host: at.host, port: at.port });
  const address = app.server.address();
  return { host: at.host, port: typeof address === 'object' && address ? address.port : at.port };
}
