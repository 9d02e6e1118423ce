/**
 * One typed configuration, merged from defaults < config file < MOAT_* environment < flags, and
 * shown as a config file would write it. Every source is reduced to text and parsed by the same
 * function (the settings table, config-settings.ts), so a value means the same thing wherever
 * it is written, and every error names the key and the source at fault.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { Result } from './policy/index.js';
import { SETTINGS } from './config-settings.js';
import type { MoatConfig } from './config-shape.js';

export type { EnforcementSetting, MoatConfig } from './config-shape.js';

export interface ConfigSources {
  /** Values given as command-line flags, by flag name (without dashes). */
  readonly flags?: Readonly<Record<string, string | undefined>>;
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** Path of a JSON config file whose keys are the MoatConfig keys. */
  readonly file?: string;
}

/** Config-file keys that were renamed, old to new: a file with the old one is told the new. */
const RENAMED_KEYS = new Map([
  // "namespace" also meant a Linux network namespace (enforcement, namespacePool).
  ['namespace', 'teamNamespace'],
]);

function readConfigFile(path: string): Result<Record<string, unknown>> {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    return { ok: false, error: `cannot read config file ${path}: ${(error as Error).message}` };
  }
  try {
    const value: unknown = JSON.parse(text);
    if (typeof value !== 'object' || value === null || Array.isArray(value)) {
      return { ok: false, error: `config file ${path} must hold a JSON object` };
    }
    const known = new Set(SETTINGS.map((s) => s.key as string));
    const unknown = Object.keys(value).find((key) => !known.has(key));
    const renamed = unknown === undefined ? undefined : RENAMED_KEYS.get(unknown);
    if (renamed !== undefined) {
      return {
        ok: false,
        error: `config file ${path}: key ${JSON.stringify(unknown)} is now ${JSON.stringify(renamed)}; rename it`,
      };
    }
    if (unknown !== undefined) {
      return {
        ok: false,
        error: `config file ${path}: unknown key ${JSON.stringify(unknown)}; known keys: ${[...known].join(', ')}`,
      };
    }
    return { ok: true, value: value as Record<string, unknown> };
  } catch (error) {
    return {
      ok: false,
      error: `config file ${path} is not valid JSON: ${(error as Error).message}`,
    };
  }
}

/** Values in a config file may be written as JSON numbers, booleans or arrays of strings. */
const fileValueText = (value: unknown): string =>
  Array.isArray(value) ? value.join(',') : String(value);

export function loadConfig(sources: ConfigSources = {}): Result<MoatConfig> {
  const file =
    sources.file === undefined ? { ok: true as const, value: {} } : readConfigFile(sources.file);
  if (!file.ok) return file;
  const config: Record<string, unknown> = {};
  for (const setting of SETTINGS) {
    const candidates: Array<[string, string | undefined]> = [
      [`--${setting.flag}`, sources.flags?.[setting.flag]],
      [setting.env, sources.env?.[setting.env]],
      [
        `${sources.file}: ${setting.key}`,
        setting.key in file.value ? fileValueText(file.value[setting.key]) : undefined,
      ],
      [`default ${setting.key}`, setting.default],
    ];
    const [source, text] = candidates.find(([, value]) => value !== undefined)!;
    const parsed = setting.parse(text!);
    if (!parsed.ok) return { ok: false, error: `${source}: ${parsed.error}` };
    config[setting.key] = parsed.value;
  }
  return { ok: true, value: config as unknown as MoatConfig };
}

/**
 * The file the first start writes the API key into when no key is configured, and the one the
 * API's clients (`moat observe`, `moat check --replay-api`) read when given no key.
 */
export const apiKeyFile = (dataDir: string): string => path.resolve(dataDir, 'api-key');

/** What a secret looks like wherever configuration is shown: one mask per value, never text. */
export const SECRET_MASK = '***';

/**
 * The effective configuration as JSON-ready values, one per setting in SETTINGS order, written
 * as a config file would write them, with every secret masked.
 */
export function showConfig(config: MoatConfig): Record<string, unknown> {
  const shown: Record<string, unknown> = {};
  for (const setting of SETTINGS) {
    const value = config[setting.key];
    if (setting.secret) {
      shown[setting.key] = Array.isArray(value) ? value.map(() => SECRET_MASK) : SECRET_MASK;
      continue;
    }
    // SETTINGS pairs each show with its own key's value type; the union loses that pairing.
    const show = setting.show as ((v: typeof value) => unknown) | undefined;
    shown[setting.key] = show ? show(value) : value;
  }
  return shown;
}
