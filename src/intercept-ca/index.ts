/** Moat's CA: its certificate for sandboxes to trust, and leaf certificates for interception. */
export { LeafRefused, type LeafStats, MoatCa, type MoatCaOptions } from './ca.js';
export { checkLeafName } from './leaf-name.js';
