/**
 * Platform routes of the E2B API that Moat does not serve. Each answers 501 naming the feature,
 * which the SDK and CLI show as it is; without these the router's 404 would read as "sandbox not
 * found" to the SDK.
 */
import { SandboxError } from '../../sandbox/index.js';
import { type PlatformRoute, route } from './route.js';
import { errors } from './schemas.js';

const FEATURES: ReadonlyArray<readonly [PlatformRoute['method'], string, string]> = [
  ['GET', '/sandboxes/:sandboxID/logs', 'Sandbox logs'],
  ['GET', '/v2/sandboxes/:sandboxID/logs', 'Sandbox logs'],
  ['GET', '/teams', 'Teams'],
  ['GET', '/teams/:teamID/metrics', 'Team metrics'],
  ['GET', '/teams/:teamID/metrics/max', 'Team metrics'],
  ['GET', '/templates/:templateID', 'Template details'],
  ['PATCH', '/templates/:templateID', 'Template building'],
  ['GET', '/templates/:templateID/builds/:buildID/logs', 'Template building'],
  ['GET', '/templates/:templateID/builds/:buildID/status', 'Template building'],
  ['GET', '/templates/:templateID/files/:hash', 'Template building'],
  ['GET', '/templates/:templateID/tags', 'Template tags'],
  ['POST', '/templates/tags', 'Template tags'],
  ['DELETE', '/templates/tags', 'Template tags'],
  ['GET', '/templates/aliases/:alias', 'Template aliases'],
  ['GET', '/v2/templates', 'Template building'],
  ['PATCH', '/v2/templates/:templateID', 'Template building'],
  ['POST', '/v2/templates/:templateID/builds/:buildID', 'Template building'],
  ['POST', '/v3/templates', 'Template building'],
  ['GET', '/volumes', 'Volumes'],
  ['POST', '/volumes', 'Volumes'],
  ['GET', '/volumes/:volumeID', 'Volumes'],
  ['DELETE', '/volumes/:volumeID', 'Volumes'],
];

const notSupported = (feature: string) =>
  new SandboxError(501, `${feature} is not supported by Moat`);

/**
 * The 501 routes, leaving out any that `served` has (so a feature implemented later simply
 * takes its route over).
 */
export function unsupportedRoutes(served: readonly PlatformRoute[]): PlatformRoute[] {
  const taken = new Set(served.map((r) => `${r.method} ${r.url}`));
  return FEATURES.filter(([method, url]) => !taken.has(`${method} ${url}`)).map(
    ([method, url, feature]) =>
      route({
        method,
        url,
        summary: `Not supported: answers 501 "${feature} is not supported by Moat"`,
        auth: true,
        schema: { response: errors(501, 401) },
        handler: async () => {
          throw notSupported(feature);
        },
      }),
  );
}
