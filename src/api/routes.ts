/**
 * Every platform route, by group: what the server mounts, /openapi.json documents and the 501
 * list leaves alone.
 */
import { caRoute } from './ca.js';
import { flowsRoute } from './flows.js';
import { LIFETIME_ROUTES } from './lifetime.js';
import { NETWORK_ROUTES } from './network.js';
import type { PlatformRoute } from './route.js';
import { SANDBOX_ROUTES } from './sandboxes.js';
import { SECRET_ROUTES } from './secrets.js';
import { SNAPSHOT_ROUTES } from './snapshots.js';
import { USAGE_ROUTES } from './usage.js';

export const ROUTES: readonly PlatformRoute[] = [
  ...SANDBOX_ROUTES,
  ...LIFETIME_ROUTES,
  ...NETWORK_ROUTES,
  ...SNAPSHOT_ROUTES,
  ...USAGE_ROUTES,
  flowsRoute,
  caRoute,
  ...SECRET_ROUTES,
];
