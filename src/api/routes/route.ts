/**
 * What a platform route is: method, path, schemas, whether it needs the API key, and a handler
 * whose request is typed by the route's own schemas (json-schema-to-ts reads the `as const`
 * schemas), so no handler restates a body or query type beside its schema. Fastify validates
 * with the same schemas and /openapi.json is generated from them.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type {
  ContextConfigDefault,
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  onRequestAsyncHookHandler,
  preHandlerAsyncHookHandler,
  preValidationAsyncHookHandler,
  RawServerDefault,
  RouteHandlerMethod,
  RouteGenericInterface,
} from 'fastify';
import type { JsonSchemaToTsProvider } from '@fastify/type-provider-json-schema-to-ts';
import type { JSONSchema } from 'json-schema-to-ts';
import type { FlowStore } from '../../flows/index.js';
import type { InternalRange } from '../../policy/index.js';
import type { SandboxService } from '../../sandbox/index.js';
import type { SecretVault } from '../../secrets/index.js';
import type { EgressInfo } from '../views.js';

/** What handlers work with. */
export interface RouteContext {
  readonly service: SandboxService;
  readonly egress: EgressInfo;
  /** This node's recent flow records. */
  readonly flows: FlowStore;
  /** host:port of the platform API of every other live node (none outside a cluster). */
  readonly peers: () => readonly string[];
  /** The secrets API's records (shared by every node of a Redis store). */
  readonly secrets: SecretVault;
  /** This node's egress CA certificate (PEM), served at GET /ca.pem. */
  readonly caCertificatePem: string;
  /** This node's internal deny list, served at GET /internal-deny. */
  readonly internalDeny: readonly InternalRange[];
}

export interface RouteSchema {
  readonly params?: JSONSchema;
  readonly querystring?: JSONSchema;
  readonly body?: JSONSchema;
  /** Replies are serialised with these: a field a schema lacks is never sent. */
  readonly response: Readonly<Record<number, object>>;
}

/**
 * Replies stay untyped: Fastify serialises them with the response schemas, and the views that
 * build them (views.ts) are typed by hand.
 */
interface UntypedReply extends RouteGenericInterface {
  Reply: unknown;
}

/** A request whose params, query and body have the types `S` describes. */
export type SchemaRequest<S extends RouteSchema> = FastifyRequest<
  UntypedReply,
  RawServerDefault,
  IncomingMessage,
  S,
  JsonSchemaToTsProvider
>;

interface RouteFields {
  readonly method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  readonly url: string;
  readonly summary: string;
  /** Needs X-API-Key. */
  readonly auth: boolean;
  /** The body may be left out; it then counts as `{}`. */
  readonly optionalBody?: boolean;
  /**
   * Where it runs when many nodes share a store: `owner`, on the node that hosts the sandbox
   * (the request is forwarded there); `placement`, on the node the new sandbox goes to.
   * Unmarked routes run on any node (reads, and network changes, which the store and the
   * cluster channel carry to the owner).
   */
  readonly runsOn?: 'owner' | 'placement';
}

export interface RouteSpec<S extends RouteSchema> extends RouteFields {
  readonly schema: S;
  readonly handler: (
    request: SchemaRequest<S>,
    reply: FastifyReply,
    context: RouteContext,
  ) => ReturnType<
    RouteHandlerMethod<
      RawServerDefault,
      IncomingMessage,
      ServerResponse,
      UntypedReply,
      ContextConfigDefault,
      S,
      JsonSchemaToTsProvider
    >
  >;
}

/** What the server runs around every platform route: the key check, ID check, forwarding. */
export interface RouteHooks {
  readonly onRequest?: onRequestAsyncHookHandler;
  readonly preValidation: preValidationAsyncHookHandler;
  /** Carries the request out on another node when it must (answering it there). */
  readonly preHandler: preHandlerAsyncHookHandler;
}

/**
 * A route as the server, the OpenAPI document and the 501 list see it: its fields and schemas,
 * and how it adds itself to Fastify with its handler's types intact.
 */
export interface PlatformRoute extends RouteFields {
  readonly schema: RouteSchema;
  mount(app: FastifyInstance, hooks: RouteHooks, context: RouteContext): void;
}

export function route<const S extends RouteSchema>(spec: RouteSpec<S>): PlatformRoute {
  const { handler, ...fields } = spec;
  return {
    ...fields,
    mount: (app, hooks, context) => {
      app.withTypeProvider<JsonSchemaToTsProvider>().route<UntypedReply, ContextConfigDefault, S>({
        method: fields.method,
        url: fields.url,
        schema: fields.schema,
        ...hooks,
        handler: (request, reply) => handler(request, reply, context),
      });
    },
  };
}
