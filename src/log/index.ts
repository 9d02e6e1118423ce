/** Logging that stays readable under load: a warning that can flood is logged at a bounded rate. */
export { warnEvery } from './warn-every.js';
