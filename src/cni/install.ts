/**
 * `moat cni install`'s work: the plugin executable `moat` in the runtime's plugin folder and
 * the network `moat` in its configuration folder. The executable names the node binary and
 * Moat's built entry by absolute path, since a CNI runtime runs plugins with no PATH.
 */
import { chmodSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const NETWORK_NAME = 'moat';
const CONFLIST_VERSION = '1.0.0';

export interface InstallOptions {
  readonly binDir: string;
  readonly confDir: string;
  readonly api: string;
  readonly keyFile: string;
  /** A validated PUT network body; absent: the plugin denies everything. */
  readonly policy?: Record<string, unknown>;
}

export interface Installed {
  readonly executable: string;
  readonly conflist: string;
}

/** A word the shell takes literally. */
const quoted = (text: string) => `'${text.replaceAll("'", `'\\''`)}'`;

/** Writes `text` beside `file` and renames it over: a runtime never runs half a file. */
function writeWhole(file: string, text: string, mode: number): void {
  const partial = `${file}.${process.pid}.partial`;
  writeFileSync(partial, text, { mode });
  chmodSync(partial, mode);
  renameSync(partial, file);
}

/** The conflist: one plugin, Moat's, with where to reach it and the starting policy. */
function conflistText(options: Omit<InstallOptions, 'binDir' | 'confDir'>): string {
  return `${JSON.stringify(
    {
      cniVersion: CONFLIST_VERSION,
      name: NETWORK_NAME,
      plugins: [
        {
          type: 'moat',
          api: options.api,
          keyFile: options.keyFile,
          ...(options.policy === undefined ? {} : { policy: options.policy }),
        },
      ],
    },
    null,
    2,
  )}\n`;
}

export function installPlugin(options: InstallOptions): Installed {
  const entry = fileURLToPath(new URL('./main.js', import.meta.url));
  const binDir = path.resolve(options.binDir);
  const confDir = path.resolve(options.confDir);
  mkdirSync(binDir, { recursive: true });
  mkdirSync(confDir, { recursive: true });
  const executable = path.join(binDir, 'moat');
  writeWhole(
    executable,
    [
      '#!/bin/sh',
      '# Moat\'s CNI plugin, written by "moat cni install": the network configuration on standard',
      '# input, the CNI_* variables in the environment, the result or error on standard output.',
      `exec ${quoted(process.execPath)} ${quoted(entry)} "$@"`,
      '',
    ].join('\n'),
    0o755,
  );
  const conflist = path.join(confDir, `${NETWORK_NAME}.conflist`);
  // The key stays in its own file: the conflist names it and may be read by anyone.
  writeWhole(conflist, conflistText(options), 0o644);
  return { executable, conflist };
}
