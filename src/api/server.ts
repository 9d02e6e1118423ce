/**
 * The platform API on Fastify: auth, error shapes, metrics, the routes of routes.ts and the
 * console's static files (console.ts).
 */
import Fastify, {
  type FastifyBaseLogger,
  type FastifyError,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
  LogController,
} from 'fastify';
import type { Logger } from 'pino';
import type { HostPort } from '../net/index.js';
import type { MoatMetrics } from '../metrics/index.js';
import { InvalidTokenError, notFound, SANDBOX_ID, SandboxError } from '../sandbox/index.js';
import { registerConsole } from './console.js';
import { type IdentityDocuments, registerWellKnown } from './well-known.js';
import { keyMatcher } from './keys.js';
import { openApiDocument } from './openapi.js';
import type { PlatformRoute, RouteContext, RouteHooks } from './routes/route.js';
import { ROUTES } from './routes.js';
import { unsupportedRoutes } from './routes/unsupported.js';
import { schemaErrorFormatter, validatorCompiler } from './validation.js';
import { errorBody } from '../e2b-wire/index.js';

/** How requests find the node that must carry them out, when many nodes share a store. */
export interface ApiRouting {
  readonly self: string;
  /** host:port of the API of the node hosting the sandbox; undefined when it is this one. */
  ownerOf(sandboxID: string): Promise<string | undefined>;
  /** host:port of the API of the node a sandbox from `templateID` goes to; undefined: this one. */
  placement(templateID: string): Promise<string | undefined>;
}

/** Marks a forwarded request: the receiving node carries it out itself, whatever it thinks. */
const FORWARDED = 'x-moat-forwarded-by';
const FORWARD_TIMEOUT_MS = 60_000;

export interface PlatformApiOptions extends RouteContext {
  readonly keys: readonly string[];
  readonly routing?: ApiRouting;
  readonly metrics: MoatMetrics;
  readonly logger: Logger;
  /** GET /metrics needs the API key too. */
  readonly metricsRequireKey: boolean;
  readonly version: string;
  /** Why Moat cannot serve now (its store, a listener); undefined when it can. For GET /ready. */
  readonly notReady: () => Promise<string | undefined>;
  /** Workload identity's discovery documents, served without the key; undefined: identity off. */
  readonly identity?: IdentityDocuments;
}

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
      // A key sent the common way (Authorization: Bearer) is told where it goes, not echoed.
      throw new AuthError(
        request.headers.authorization === undefined
          ? 'missing X-API-Key header'
          : 'missing X-API-Key header: the API key goes in the X-API-Key header, not in Authorization',
      );
    }
    if (!matches(given)) throw new AuthError('invalid API key');
  };

  // A follower's stream never ends on its own: closing would wait for it.
  app.addHook('preClose', async () => options.flows.cutFollowers());

  app.setErrorHandler((error: FastifyError, request, reply) => {
    if (error instanceof SandboxError || error instanceof AuthError) {
      // 501 is a feature Moat lacks, not a failure of Moat's.
      if (error.status >= 500 && error.status !== 501) {
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

  const routes = [...ROUTES, ...unsupportedRoutes(ROUTES)];
  const hooksFor = (route: PlatformRoute): RouteHooks => ({
    onRequest: route.auth ? requireKey : undefined,
    preValidation: async (request) => {
      const id = sandboxIDOf(request);
      // No sandbox has a malformed ID: the SDK reads 404 as "not found" (kill resolves false).
      if (id !== undefined && !SANDBOX_ID.test(id)) throw notFound(id);
      if (route.optionalBody && request.body === undefined) request.body = {};
    },
    preHandler: async (request, reply) => {
      const node = await nodeFor(route, request);
      // The reply sent here is the answer: the route's handler does not run.
      if (node !== undefined) return forward(request, reply, node);
    },
  });
  for (const route of routes) route.mount(app, hooksFor(route), options);

  /** The API of the node that must carry out this request, when it is another one. */
  async function nodeFor(
    route: PlatformRoute,
    request: FastifyRequest,
  ): Promise<string | undefined> {
    const routing = options.routing;
    if (routing === undefined || route.runsOn === undefined) return undefined;
    if (request.headers[FORWARDED] !== undefined) return undefined;
    if (route.runsOn === 'placement') {
      const templateID = fieldOf(request.body, 'templateID');
      return routing.placement(typeof templateID === 'string' ? templateID : 'base');
    }
    return routing.ownerOf(sandboxIDOf(request)!);
  }

  /** Carries the request out on `node` and answers with what it answered. */
  async function forward(
    request: FastifyRequest,
    reply: FastifyReply,
    node: string,
  ): Promise<FastifyReply> {
    const hasBody = request.method !== 'GET' && request.method !== 'DELETE';
    let response: Response;
    try {
      response = await fetch(`http://${node}${request.url}`, {
        method: request.method,
        headers: {
          'x-api-key': String(request.headers['x-api-key'] ?? ''),
          [FORWARDED]: options.routing!.self,
          ...(hasBody ? { 'content-type': 'application/json' } : {}),
        },
        body: hasBody ? JSON.stringify(request.body ?? {}) : undefined,
        signal: AbortSignal.timeout(FORWARD_TIMEOUT_MS),
      });
    } catch (error) {
      throw new SandboxError(
        503,
        `the node at ${node} that must carry out this request did not answer: ${(error as Error).message}`,
      );
    }
    const text = await response.text();
    reply.code(response.status);
    const type = response.headers.get('content-type');
    if (type) reply.header('content-type', type);
    return reply.send(text === '' ? undefined : text);
  }

  // Liveness: the process answers. Readiness: it can also do its work (store, listeners).
  app.get('/health', async () => ({ status: 'ok' }));
  app.get('/ready', async (_request, reply) => {
    const reason = await options.notReady();
    if (reason === undefined) return { status: 'ready' };
    return reply.code(503).send({ status: 'not ready', reason });
  });
  app.get(
    '/metrics',
    { onRequest: options.metricsRequireKey ? requireKey : undefined },
    async (_request, reply) => {
      reply.header('Content-Type', metrics.registry.contentType);
      return metrics.registry.metrics();
    },
  );
  const document = openApiDocument(routes, options.version);
  app.get('/openapi.json', async () => document);
  registerConsole(app);
  if (options.identity !== undefined) registerWellKnown(app, options.identity);
  return app;
}

/** A missing or wrong API key: the API's own refusal, answered with the same error body. */
class AuthError extends Error {
  readonly status = 401;
}

/** A field of a request part, read the same way whatever the route (and its schema). */
const fieldOf = (part: unknown, name: string): unknown =>
  typeof part === 'object' && part !== null
    ? Object.getOwnPropertyDescriptor(part, name)?.value
    : undefined;

const sandboxIDOf = (request: { params: unknown }) => {
  const id = fieldOf(request.params, 'sandboxID');
  return typeof id === 'string' ? id : undefined;
};

export async function listenApi(app: FastifyInstance, at: HostPort): Promise<HostPort> {
  await app.listen({ host: at.host, port: at.port });
  const address = app.server.address();
  return { host: at.host, port: typeof address === 'object' && address ? address.port : at.port };
}
