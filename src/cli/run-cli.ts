/**
 * The moat command line: `moat serve`, `moat check`, `moat lint`, `moat suggest`, `moat observe`,
 * `moat cni`, `moat identity`. Only `serve` loads the server (lazily): the other commands start
 * without it.
 */
import { CHECK_HELP, check } from './check.js';
import { CNI_HELP, cni } from './cni.js';
import { IDENTITY_HELP, identity } from './identity.js';
import { type CliIO, EXIT, switchesFilled, UsageError } from './io.js';
import { LINT_HELP, lint } from './lint.js';
import { OBSERVE_HELP, observe } from './observe.js';
import { SERVE_HELP, serve } from './serve.js';
import { SUGGEST_HELP, suggest } from './suggest.js';
import { VERSION } from '../process/index.js';

const COMMANDS: Record<
  string,
  { run: (args: string[], io: CliIO) => Promise<number>; help: string; summary: string }
> = {
  serve: {
    run: serve,
    help: SERVE_HELP,
    summary: 'run Moat: the platform API and sandboxes, their DNS, egress proxy and firewall',
  },
  check: {
    run: check,
    help: CHECK_HELP,
    summary: 'decide destinations against a policy file (dry run, no network)',
  },
  lint: {
    run: lint,
    help: LINT_HELP,
    summary: 'validate policy files and warn about likely mistakes',
  },
  suggest: {
    run: suggest,
    help: SUGGEST_HELP,
    summary: 'print the smallest policy that allows what a sandbox did (from its flow records)',
  },
  observe: {
    run: observe,
    help: OBSERVE_HELP,
    summary: "print a node's flow records (GET /flows), and follow new ones",
  },
  cni: {
    run: cni,
    help: CNI_HELP,
    summary: "install Moat's CNI plugin: containers and VMs of a CNI runtime held by Moat",
  },
  identity: {
    run: identity,
    help: IDENTITY_HELP,
    summary: 'workload identity: rotate-key makes a new token signing key',
  },
};

const HELP = `Moat ${VERSION}: egress policy gateway and network enforcer for sandboxes.

Usage: moat <command> [options]

Commands:
${Object.entries(COMMANDS)
  .map(([name, c]) => `  ${name.padEnd(10)}${c.summary}`)
  .join('\n')}

Run "moat <command> --help" for a command's options.
  -h, --help     this help
  -v, --version  print the version`;

/** Runs the CLI; returns the exit status. Errors the user can fix are printed, not thrown. */
export async function runCli(argv: string[], io: CliIO): Promise<number> {
  const [name, ...args] = argv;
  if (name === undefined || name === '-h' || name === '--help' || name === 'help') {
    const topic = name === 'help' && args[0] !== undefined ? COMMANDS[args[0]] : undefined;
    io.stdout.write(`${topic?.help ?? HELP}\n`);
    return EXIT.ok;
  }
  if (name === '-v' || name === '--version') {
    io.stdout.write(`${VERSION}\n`);
    return EXIT.ok;
  }
  const command = COMMANDS[name];
  if (!command) {
    io.stderr.write(`moat: unknown command ${JSON.stringify(name)}\n\n${HELP}\n`);
    return EXIT.usage;
  }
  try {
    return await command.run(switchesFilled(args), io);
  } catch (error) {
    // parseArgs reports unknown or malformed options with code ERR_PARSE_ARGS_*.
    const code = (error as NodeJS.ErrnoException).code ?? '';
    if (error instanceof UsageError || code.startsWith('ERR_PARSE_ARGS')) {
      io.stderr.write(
        `moat ${name}: ${(error as Error).message}\nRun "moat ${name} --help" for usage.\n`,
      );
      return EXIT.usage;
    }
    throw error;
  }
}
