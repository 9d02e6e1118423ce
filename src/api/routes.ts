/**
 * Every platform route, by group: what the server mounts, /openapi.json documents and the 501
 * list leaves alone.
 */
import { caRoute } from './routes/ca.js';
import { flowsRoute } from './routes/flows.js';
import { internalDenyRoute } from './routes/internal-deny.js';
import { LIFETIME_ROUTES } from './routes/lifetime.js';
import { NETWORK_ROUTES } from './routes/network.js';
import type { PlatformRoute } from './routes/route.js';
import { SANDBOX_ROUTES } from './routes/sandboxes.js';
import { SECRET_ROUTES } from './routes/secrets.js';
import { SNAPSHOT_ROUTES } from './routes/snapshots.js';
import { USAGE_ROUTES } from './routes/usage.js';

export const ROUTES: readonly PlatformRoute[] = [
  ...SANDBOX_ROUTES,
  ...LIFETIME_ROUTES,
  ...NETWORK_ROUTES,
  ...SNAPSHOT_ROUTES,
  ...USAGE_ROUTES,
  flowsRoute,
  caRoute,
  internalDenyRoute,
  ...SECRET_ROUTES,
];
