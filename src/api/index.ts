/** The platform API: Fastify routes, API-key auth, error shapes and the OpenAPI document. */
export { type ApiKeys, loadApiKeys } from './keys.js';
export {
  type ApiRouting,
  createPlatformApi,
  listenApi,
  type PlatformApiOptions,
} from './server.js';
export { ENVD_VERSION, type EgressInfo } from './views.js';
