import { readFileSync } from 'node:fs';
import { type NetworkRules, type ParseOptions, parseNetworkConfig } from '../policy/index.js';

export type PolicyFileResult =
  /** `json`: the file as written, for a command that passes it on (moat cni install). */
  | { ok: true; rules: NetworkRules; json: unknown }
  /** `notJson`: the file does not parse as JSON at all (lint skips such files unless *.json). */
  | { ok: false; problems: string[]; notJson?: true };

/**
 * The text with each `//` comment outside a JSON string blanked to the end of its line (spaces,
 * so a JSON error's position still points into the file as written): `moat suggest` writes them.
 */
export function blankLineComments(text: string): string {
  let out = '';
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const char = text[i]!;
    if (inString) {
      if (char === '\\') {
        out += text.slice(i, i + 2);
        i++;
        continue;
      }
      if (char === '"') inString = false;
      out += char;
    } else if (char === '/' && text[i + 1] === '/') {
      const end = text.indexOf('\n', i);
      const stop = end === -1 ? text.length : end;
      out += ' '.repeat(stop - i);
      i = stop - 1;
    } else {
      if (char === '"') inString = true;
      out += char;
    }
  }
  return out;
}

/** Reads and validates a policy file (JSON shaped like the PUT network body, `//` comments allowed). */
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
    json = JSON.parse(blankLineComments(text));
  } catch (error) {
    return { ok: false, problems: [`not valid JSON: ${(error as Error).message}`], notJson: true };
  }
  const parsed = parseNetworkConfig(json, options);
  return parsed.ok
    ? { ok: true, rules: parsed.value, json }
    : { ok: false, problems: parsed.errors.map((problem) => problem.message) };
}
