/** The moat command line: `moat serve`, `moat check`, `moat lint`, `moat observe`, `moat cni`. */
export type { CliIO } from './io.js';
export { runCli } from './run-cli.js';
