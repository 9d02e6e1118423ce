import { readFileSync } from 'node:fs';
import { type NetworkRules, type ParseOptions, parseNetworkConfig } from '../policy/index.js';

export type PolicyFileResult =
  /** `json`: the file as written, for a command that passes it on (moat cni install). */
  | { ok: true; rules: NetworkRules; json: unknown }
  /** `notJson`: the file does not parse as JSON at all (lint skips such files unless *.json). */
  | { ok: false; problems: string[]; notJson?: true };

/** Reads and validates a policy file (JSON shaped like the PUT network body). */
export function readPolicyFile(path: string, options: ParseOptions): PolicyFileResult {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    return {
      ok: false,
      problems: [`cannot read policy file: ${(error as NodeJS.ErrnoException).message}`],
    };
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    return { ok: false, problems: [`not valid JSON: ${(error as Error).message}`], notJson: true };
  }
  const parsed = parseNetworkConfig(json, options);
  return parsed.ok
    ? { ok: true, rules: parsed.value, json }
    : { ok: false, problems: parsed.errors.map((problem) => problem.message) };
}
