/**
 * One typed configuration, merged from defaults < config file < MOAT_* environment < flags.
 * Every source is reduced to text and parsed by the same function, so a value means the same
 * thing wherever it is written, and every error names the key and the source at fault.
 */
import { readFileSync } from 'node:fs';
import {
  DEFAULT_MAX_ENTRIES,
  type InternalRange,
  parseInternalDenyList,
  type Result,
} from './policy/index.js';

export interface MoatConfig {
  /** Destinations no sandbox rule can open (the hard internal deny list). */
  readonly internalDeny: readonly InternalRange[];
  /** Entries allowed in each of allowOut and denyOut. */
  readonly maxPolicyEntries: number;
}

interface Setting<K extends keyof MoatConfig> {
  readonly key: K;
  readonly flag: string;
  readonly env: string;
  readonly default: string;
  readonly help: string;
  parse(text: string): Result<MoatConfig[K]>;
}

const positiveInteger =
  (max: number) =>
  (text: string): Result<number> =>
    /^[1-9][0-9]*$/.test(text) && Number(text) <= max
      ? { ok: true, value: Number(text) }
      : {
          ok: false,
          error: `expected a whole number from 1 to ${max}, got ${JSON.stringify(text)}`,
        };

type AnySetting = { [K in keyof MoatConfig]: Setting<K> }[keyof MoatConfig];

export const SETTINGS: readonly AnySetting[] = [
  {
    key: 'internalDeny',
    flag: 'internal-deny',
    env: 'MOAT_INTERNAL_DENY',
    default: 'default',
    help: 'the hard internal deny list: comma-separated CIDRs, "none", or "default" (loopback, private, link-local/metadata, CGNAT, multicast, reserved, NAT64/6to4/Teredo, ULA...)',
    parse: parseInternalDenyList,
  },
  {
    key: 'maxPolicyEntries',
    flag: 'max-policy-entries',
    env: 'MOAT_MAX_POLICY_ENTRIES',
    default: String(DEFAULT_MAX_ENTRIES),
    help: 'entries allowed in each of allowOut and denyOut',
    parse: positiveInteger(1_000_000),
  },
];

export interface ConfigSources {
  /** Values given as command-line flags, by flag name (without dashes). */
  readonly flags?: Readonly<Record<string, string | undefined>>;
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** Path of a JSON config file whose keys are the MoatConfig keys. */
  readonly file?: string;
}

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
