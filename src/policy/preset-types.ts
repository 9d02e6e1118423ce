/**
 * A preset's shape and spelling, apart from its file parsing (presets.ts), so the rules parser
 * can take a table without importing the parser that uses it.
 */
export interface Preset {
  readonly name: string;
  readonly version: number;
  readonly description: string;
  /** The allowOut entries as written in the file; each one a name or a `*.name` wildcard. */
  readonly entries: readonly string[];
  /** Where the preset came from (its file), for messages. */
  readonly source: string;
}

/** Presets by name: the shipped folder's and the operator's (`--presets-dir`). */
export type PresetTable = ReadonlyMap<string, Preset>;

/** What `allowOut` writes to use a preset: `preset:NAME`. */
export const PRESET_PREFIX = 'preset:';

/** A preset's name: lower-case letters, digits and inner hyphens, as in `docker-hub`. */
export const PRESET_NAME = /^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$/;
