/**
 * The preset table Moat decides `preset:NAME` by: the presets shipped in policies/presets/ and
 * the operator's folder (`--presets-dir`). Reading the files is I/O, so it lives here, beside the
 * settings `moat serve`, `moat check` and `moat lint` share; the policy part validates each file
 * and gets the table as a plain value.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import {
  parsePresetFile,
  type Preset,
  type PresetTable,
  presetTable,
  type Result,
} from './policy/index.js';
import { packageRoot } from './process/index.js';

/** The presets that ship with Moat. */
export const SHIPPED_PRESETS_DIR = path.join(packageRoot() ?? '.', 'policies', 'presets');

function readPresetFolder(folder: string, problems: string[]): Preset[] {
  let names: string[];
  try {
    names = readdirSync(folder).filter((name) => name.endsWith('.json'));
  } catch (error) {
    problems.push(`cannot read presets folder ${folder}: ${(error as Error).message}`);
    return [];
  }
  const presets: Preset[] = [];
  for (const name of names.sort()) {
    const file = path.join(folder, name);
    let json: unknown;
    try {
      json = JSON.parse(readFileSync(file, 'utf8'));
    } catch (error) {
      problems.push(`preset file ${file}: ${(error as Error).message}`);
      continue;
    }
    const parsed = parsePresetFile(json, file);
    if (!parsed.ok) {
      problems.push(...parsed.errors.map((problem) => problem.message));
      continue;
    }
    // The name in the file is the one allowOut uses; the file name must say the same.
    if (`${parsed.value.name}.json` !== name) {
      problems.push(
        `preset file ${file}: its name is ${JSON.stringify(parsed.value.name)}; name the file ${parsed.value.name}.json`,
      );
      continue;
    }
    presets.push(parsed.value);
  }
  return presets;
}

/**
 * The shipped presets and the operator's (`operatorDir`, when given), as one table; every
 * problem of every file at once, each naming its file.
 */
export function loadPresets(
  operatorDir: string | undefined,
  shippedDir: string = SHIPPED_PRESETS_DIR,
): Result<PresetTable> {
  const problems: string[] = [];
  const presets = readPresetFolder(shippedDir, problems);
  if (operatorDir !== undefined) presets.push(...readPresetFolder(operatorDir, problems));
  const table = presetTable(presets);
  if (!table.ok) problems.push(...table.errors.map((problem) => problem.message));
  return problems.length > 0 || !table.ok
    ? { ok: false, error: problems.join('; ') }
    : { ok: true, value: table.value };
}
