/** The composition root: every part of Moat built and wired as `moat serve` runs them. */
export { type RunningMoat, type StartOptions, startMoat } from './start.js';
