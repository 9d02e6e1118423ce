/** Templates and snapshots by name: `alias[:tag]`, `<team namespace>/alias[:tag]`, IDs, lookups. */
import { BASE_TEMPLATE, type SandboxLimits } from '../runtime/index.js';
import type { Store } from '../store/index.js';
import { NAME_PART, randomName } from './ids.js';
import { NETWORK_ONLY } from './network-only.js';
import { readSnapshot, type SnapshotRecord, TEMPLATES } from './records.js';
import { SandboxError } from './requests.js';

const DEFAULT_TAG = 'default';

export const isBaseTemplate = (id: string) =>
  id === BASE_TEMPLATE || id === `${BASE_TEMPLATE}:${DEFAULT_TAG}`;

export const templateKey = (id: string) => `template:${id}`;

/** `alias`, `alias:tag`, `<team namespace>/alias[:tag]` -> the snapshot's ID parts. */
export function snapshotNaming(
  teamNamespace: string,
  name: string | undefined,
): Pick<SnapshotRecord, 'snapshotID' | 'templateID' | 'tag' | 'alias' | 'names'> {
  if (name === undefined) {
    const templateID = randomName(20);
    return {
      snapshotID: `${templateID}:${DEFAULT_TAG}`,
      templateID,
      tag: DEFAULT_TAG,
      alias: null,
      names: [],
    };
  }
  const slash = name.indexOf('/');
  const space = slash < 0 ? undefined : name.slice(0, slash);
  const rest = slash < 0 ? name : name.slice(slash + 1);
  const [alias = '', tag = DEFAULT_TAG, ...extra] = rest.split(':');
  if (space !== undefined && space !== teamNamespace) {
    throw new SandboxError(
      400,
      `snapshot name ${JSON.stringify(name)} names team namespace "${space}"; this Moat's team namespace is "${teamNamespace}"`,
    );
  }
  if (!NAME_PART.test(alias) || !NAME_PART.test(tag) || extra.length > 0) {
    throw new SandboxError(
      400,
      `invalid snapshot name ${JSON.stringify(name)}: use lower-case letters, digits, ".", "_" and "-" for the name and an optional ":tag"`,
    );
  }
  const templateID = `${teamNamespace}/${alias}`;
  const snapshotID = `${templateID}:${tag}`;
  return { snapshotID, templateID, tag, alias, names: [snapshotID] };
}

/**
 * The snapshot IDs a template ID may mean: as written with the default tag filled in, and,
 * without a team namespace, the same name in this Moat's team namespace.
 */
export function templateCandidates(teamNamespace: string, id: string): string[] {
  const tagged = id.includes(':') ? id : `${id}:${DEFAULT_TAG}`;
  return tagged.includes('/') ? [tagged] : [tagged, `${teamNamespace}/${tagged}`];
}

/**
 * What a template ID names: the base template, the built-in `network-only` (network-only.ts), or
 * a stored snapshot (404 when none).
 */
export async function resolveTemplate(
  store: Pick<Store, 'get'>,
  teamNamespace: string,
  id: string,
): Promise<{ id: string; alias: string | null; node?: string; limits?: SandboxLimits }> {
  if (isBaseTemplate(id)) return { id: BASE_TEMPLATE, alias: BASE_TEMPLATE };
  if (id === NETWORK_ONLY) return { id: NETWORK_ONLY, alias: NETWORK_ONLY };
  for (const key of templateCandidates(teamNamespace, id)) {
    const stored = await store.get(TEMPLATES, key);
    if (stored === undefined) continue;
    const snapshot = readSnapshot(stored, key);
    return {
      id: snapshot.snapshotID,
      alias: snapshot.alias,
      node: snapshot.node,
      ...(snapshot.limits ? { limits: snapshot.limits } : {}),
    };
  }
  throw new SandboxError(404, `template "${id}" doesn't exist or you don't have access to it`);
}
