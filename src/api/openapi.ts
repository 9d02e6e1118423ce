/**
 * /openapi.json, generated from the route table: the same schemas Fastify validates requests
 * with and serialises replies with.
 */
import type { PlatformRoute, RouteSchema } from './routes/route.js';

const parameters = (schema: RouteSchema['params'], where: 'path' | 'query') => {
  const { properties = {}, required = [] } = typeof schema === 'object' ? schema : {};
  return Object.entries(properties).map(([name, property]) => ({
    name,
    in: where,
    required: where === 'path' || required.includes(name),
    schema: property,
  }));
};

/** JSON Schema's `type: [x, 'null']` is OpenAPI 3.1's nullable form, so 3.1 it is. */
export function openApiDocument(routes: readonly PlatformRoute[], version: string): object {
  const paths: Record<string, Record<string, object>> = {};
  for (const route of routes) {
    const path = route.url.replace(/:([A-Za-z]+)/g, '{$1}');
    const { schema } = route;
    paths[path] ??= {};
    paths[path][route.method.toLowerCase()] = {
      summary: route.summary,
      ...(route.auth ? { security: [{ apiKey: [] }] } : {}),
      parameters: [
        ...parameters(schema.params, 'path'),
        ...parameters(schema.querystring, 'query'),
      ],
      ...(schema.body
        ? {
            requestBody: {
              required: route.optionalBody !== true,
              content: { 'application/json': { schema: schema.body } },
            },
          }
        : {}),
      responses: Object.fromEntries(
        Object.entries(schema.response).map(([code, body]) => [
          code,
          code === '204'
            ? { description: 'No content' }
            : {
                description: (body as { description?: string }).description ?? `HTTP ${code}`,
                content: { 'application/json': { schema: body } },
              },
        ]),
      ),
    };
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'Moat platform API',
      version,
      description:
        'Sandbox lifecycle, egress rules and snapshots, wire-compatible with the E2B platform API. Errors are {"code": <status>, "message": ...}.',
    },
    components: {
      securitySchemes: { apiKey: { type: 'apiKey', in: 'header', name: 'X-API-Key' } },
    },
    paths,
  };
}
