import path from 'node:path';
import {
  JWKS_MAX_AGE_S,
  KEY_FOLDER,
  PUBLISH_AHEAD_MS,
  RETIRED_KEY_KEPT_MS,
  rotateKey,
} from '../identity/index.js';
import { type CliIO, configFlags, configFrom, EXIT, parseOptions, UsageError } from './io.js';
import { warnUnknownEnvironment } from './unknown-environment.js';

/** The one setting the identity commands use: where the keys live. */
const IDENTITY_CONFIG = configFlags(['dataDir']);

export const IDENTITY_HELP = `Usage: moat identity rotate-key [options]

Workload identity keys (docs/identity.md). rotate-key makes a new ECDSA P-256 signing key in
<data-dir>/${KEY_FOLDER}/ (mode 0600). A running Moat publishes it in /.well-known/jwks.json
within a second and signs new tokens with it ${PUBLISH_AHEAD_MS / 1000} s later, once every
verifier's cached copy of the JWKS (max-age ${JWKS_MAX_AGE_S} s) holds it; the key it replaces
signs until then and stays in the JWKS for ${Math.round(RETIRED_KEY_KEPT_MS / 60_000)} minutes,
until every token it signed has expired; keys replaced longer ago are removed. Run it as the
user Moat runs as.

Options:
${IDENTITY_CONFIG.help}
  -h, --help
      this help`;

export async function identity(args: string[], io: CliIO): Promise<number> {
  const { values, positionals } = parseOptions({
    args,
    allowPositionals: true,
    options: { help: { type: 'boolean', short: 'h' }, ...IDENTITY_CONFIG.options },
  });
  if (values.help) {
    io.stdout.write(`${IDENTITY_HELP}\n`);
    return EXIT.ok;
  }
  if (positionals.length !== 1 || positionals[0] !== 'rotate-key')
    throw new UsageError('moat identity takes one subcommand: rotate-key');
  warnUnknownEnvironment(io);
  const config = configFrom(values, io);
  const rotated = await rotateKey(config.dataDir);
  io.stdout.write(
    `moat: identity key ${rotated.kid} is published and signs from ${new Date(rotated.signsFrom).toISOString()}, once verifiers' cached JWKS have it (in ${path.resolve(config.dataDir, KEY_FOLDER)}); ${rotated.published} key(s) published, ${rotated.removed} expired key(s) removed\n`,
  );
  return EXIT.ok;
}
