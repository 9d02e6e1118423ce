/**
 * docs/configuration.md, generated from the settings table (SETTINGS) that also parses every
 * value and writes `moat serve --help`: one source, so the three cannot disagree.
 * `npm run docs:config` writes the file; test/config-doc.test.ts fails when it is stale.
 */
import { SETTINGS } from './config-settings.js';

const cell = (text: string) => text.replace(/\|/g, '\\|').replace(/\n/g, ' ');
const code = (text: string) => (text === '' ? '(none)' : `\`${cell(text)}\``);

export function configurationDoc(): string {
  const rows = SETTINGS.map(
    (s) =>
      `| \`${s.key}\` | \`--${s.flag} ${cell(s.metavar)}\` | \`${s.env}\` | ${code(s.default)} | ${cell(s.help)} |`,
  );
  return `<!-- Generated from SETTINGS in src/config-settings.ts by \`npm run docs:config\`; do not edit by hand. -->

# Configuration

Every setting of \`moat serve\` (and the few that \`moat check\` and \`moat lint\` use) comes from,
in order, each overriding the one before:

1. the default below;
2. a JSON file given with \`--config FILE\`, whose keys are the setting names below
   (\`{"dnsListen": "127.0.0.1:3053", "internalDeny": ["default", "-198.18.0.0/15"]}\`;
   numbers, booleans and arrays of strings are written as JSON); an unknown key is an error;
3. the \`MOAT_*\` environment variable; a \`MOAT_*\` variable that is no setting is warned about
   at start-up, with the setting it was probably meant to be;
4. the command-line flag. A list setting (internal deny list, host ports, upstreams, API keys)
   takes comma-separated values, and a repeated flag adds to it
   (\`--internal-deny 10.0.0.0/8 --internal-deny 192.168.0.0/16\`); any other flag given twice
   is an error.

Every value is checked at start; an error names the setting and where it came from
(\`MOAT_INTERNAL_DENY: internal deny list entry 0 "banana": ...\`), and Moat exits with status 2.
\`moat serve --print-config\` prints the effective configuration, secrets masked, in the form
\`--config\` reads back.

Addresses are \`ip:port\`, \`[ipv6]:port\` or \`localhost:port\` (\`localhost\` means
\`127.0.0.1\`); port \`0\` takes any free port (start-up says which). In namespace mode Moat also
listens on the first address of \`namespacePool\` (the sandboxes' gateway, \`10.213.0.1\` by
default): DNS on port 53 (UDP and TCP), the egress proxy on 3128 and the transparent listener on
3129. A listener set to \`0.0.0.0\` or \`::\` already answers there, and sandboxes use its port.

The internal deny list takes CIDRs, \`none\`, \`default\` (the built-in list), and \`-CIDR\` to
take a range out of what comes before it: \`default,-198.18.0.0/15\` makes the benchmarking
range reachable without copying the other ranges. An exclusion must lie inside a range listed
before it.

| setting | flag | environment | default | meaning |
|---|---|---|---|---|
${rows.join('\n')}
`;
}
