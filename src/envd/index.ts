/**
 * The per-sandbox API: Connect JSON services process.Process and filesystem.Filesystem, and the
 * REST routes /health, /envs, /files, /files/compose.
 */
export type { EnvdSandbox } from './context.js';
export { SandboxApi } from './server.js';
export { signatureMatches } from './signed-urls.js';
