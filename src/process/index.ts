/**
 * Moat as a process on this host: the package it runs from (its folder and version), the native
 * addons it loads from there, and whether another process (a lock file's holder) still runs.
 */
export { type LoadedAddon, loadAddon } from './native-addon.js';
export { packageRoot } from './package-root.js';
export { processRuns } from './process-alive.js';
export { VERSION } from './version.js';
