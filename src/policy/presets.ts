/**
 * Presets: named, versioned allow bundles (`preset:pypi` in allowOut), read from JSON files by
 * the caller (I/O lives outside this part) and validated here, so a preset's entries are judged
 * by the same normaliser as a written entry. A preset names only domain names and `*.name`
 * wildcards: it never opens an address range.
 */
import { PRESET_NAME, type Preset, type PresetTable } from './preset-types.js';
import type { PolicyProblem } from './result.js';
import { presetEntryProblem } from './rules.js';

const PRESET_FIELDS = new Set(['name', 'version', 'description', 'allowOut']);

/**
 * Validates one preset file's JSON. `source` names the file in every message; each entry is
 * judged as allowOut judges it, and anything but a name or a wildcard is refused.
 */
export function parsePresetFile(
  json: unknown,
  source: string,
): { ok: true; value: Preset } | { ok: false; errors: PolicyProblem[] } {
  const errors: PolicyProblem[] = [];
  const problem = (at: string, message: string) =>
    errors.push({ at, message: `preset file ${source}: ${message}` });
  if (typeof json !== 'object' || json === null || Array.isArray(json)) {
    problem('preset', 'a preset must be a JSON object with name, version, description, allowOut');
    return { ok: false, errors };
  }
  const file = json as Record<string, unknown>;
  for (const key of Object.keys(file)) {
    if (!PRESET_FIELDS.has(key)) {
      problem(
        key,
        `unknown field ${JSON.stringify(key)}; a preset has name, version, description and allowOut`,
      );
    }
  }
  const { name, version, description, allowOut } = file;
  if (typeof name !== 'string' || !PRESET_NAME.test(name)) {
    problem(
      'name',
      `name must be lower-case letters, digits and inner hyphens (as "docker-hub"), not ${JSON.stringify(name)}`,
    );
  }
  if (typeof version !== 'number' || !Number.isSafeInteger(version) || version < 1) {
    problem('version', `version must be a whole number from 1, not ${JSON.stringify(version)}`);
  }
  if (typeof description !== 'string' || description.trim() === '') {
    problem('description', 'description must say what the preset allows and leaves out');
  }
  const entries: string[] = [];
  if (!Array.isArray(allowOut) || allowOut.length === 0) {
    problem('allowOut', 'allowOut must be a non-empty array of names and *.name wildcards');
  } else {
    allowOut.forEach((entry: unknown, index) => {
      const at = `allowOut[${index}]`;
      if (typeof entry !== 'string') {
        problem(at, `${at} must be a string, not ${JSON.stringify(entry)}`);
        return;
      }
      const why = presetEntryProblem(entry, index);
      if (why === undefined) entries.push(entry);
      else problem(at, why);
    });
  }
  if (errors.length > 0) return { ok: false, errors };
  return {
    ok: true,
    value: {
      name: name as string,
      version: version as number,
      description: description as string,
      entries,
      source,
    },
  };
}

/**
 * One table from the shipped presets and the operator's: an operator preset may add names but
 * not reuse a shipped one (nor may two files share a name), so `preset:pypi` means one thing.
 */
export function presetTable(
  presets: readonly Preset[],
): { ok: true; value: PresetTable } | { ok: false; errors: PolicyProblem[] } {
  const table = new Map<string, Preset>();
  const errors: PolicyProblem[] = [];
  for (const preset of presets) {
    const first = table.get(preset.name);
    if (first === undefined) table.set(preset.name, preset);
    else
      errors.push({
        at: preset.source,
        message: `preset ${JSON.stringify(preset.name)} is defined twice: in ${first.source} and in ${preset.source}; give one of them another name`,
      });
  }
  return errors.length > 0 ? { ok: false, errors } : { ok: true, value: table };
}
