/** Snapshots: taking a sandbox's root as a template, listing them, deleting them. */
import { madeHere } from './membership.js';
import { type Page, paginate } from './pages.js';
import type { LifecycleParts } from './parts.js';
import { asJson, type SandboxRecord, type SnapshotRecord, TEMPLATES } from './records.js';
import { SandboxError, type SnapshotQuery } from './requests.js';
import {
  isBaseTemplate,
  resolveTemplate,
  snapshotNaming,
  templateCandidates,
  templateKey,
} from './templates.js';

/** What snapshots use of the lifecycle's parts. */
export interface SnapshotContext extends Pick<
  LifecycleParts,
  'teamNamespace' | 'queue' | 'records' | 'runtime' | 'cluster' | 'logger' | 'now' | 'transition'
> {
  /** The sandbox as the lifecycle answers it (404 when it does not exist). */
  get(sandboxID: string): Promise<SandboxRecord>;
}

export class SnapshotCatalog {
  constructor(private readonly context: SnapshotContext) {}

  /** Copies the sandbox's root into a new template; the sandbox keeps running. */
  create(sandboxID: string, name: string | undefined): Promise<SnapshotRecord> {
    const { queue, records, runtime } = this.context;
    const naming = snapshotNaming(this.context.teamNamespace, name);
    return queue.run(sandboxID, async () => {
      const record = await this.context.get(sandboxID);
      const snapshot: SnapshotRecord = {
        ...naming,
        sandboxID,
        createdAt: this.context.now(),
        limits: records.limitsOf(record),
        ...madeHere(this.context.cluster),
      };
      await queue.run(templateKey(snapshot.snapshotID), async () => {
        await runtime.snapshot(sandboxID, snapshot.snapshotID);
        await records.commit([
          { collection: TEMPLATES, key: snapshot.snapshotID, value: asJson(snapshot) },
        ]);
      });
      this.context.transition(record, 'snapshot', { snapshotID: snapshot.snapshotID });
      return snapshot;
    });
  }

  async list(query: SnapshotQuery): Promise<Page<SnapshotRecord>> {
    const wanted =
      query.name === undefined ? undefined : snapshotNaming(this.context.teamNamespace, query.name);
    const snapshots = (await this.context.records.snapshots()).filter(
      (s) =>
        (query.sandboxID === undefined || s.sandboxID === query.sandboxID) &&
        (wanted === undefined ||
          s.snapshotID === wanted.snapshotID ||
          (query.name?.includes(':') !== true && s.templateID === wanted.templateID)),
    );
    return paginate(snapshots, (s) => [s.createdAt, s.snapshotID], { ...query, order: 'desc' });
  }

  /**
   * Deletes a snapshot (by its ID, or every tag of a template ID). Refused while a sandbox made
   * from it still exists.
   */
  async delete(id: string): Promise<void> {
    const { teamNamespace, queue, records } = this.context;
    if (isBaseTemplate(id)) {
      throw new SandboxError(400, `template "${id}" is built in and cannot be deleted`);
    }
    // A template ID without a tag names every tag of that template.
    const candidates = new Set(templateCandidates(teamNamespace, id));
    const templates = new Set(id.includes(':') ? [] : [id, `${teamNamespace}/${id}`]);
    const matching = (await records.snapshots()).filter(
      (s) => candidates.has(s.snapshotID) || templates.has(s.templateID),
    );
    if (matching.length === 0) {
      throw new SandboxError(404, `template "${id}" doesn't exist or you don't have access to it`);
    }
    for (const snapshot of matching) {
      await queue.run(templateKey(snapshot.snapshotID), async () => {
        const users = (await records.all())
          .filter((r) => r.templateID === snapshot.snapshotID)
          .map((r) => r.sandboxID);
        if (users.length > 0) {
          throw new SandboxError(
            409,
            `template "${snapshot.snapshotID}" is used by sandbox${users.length > 1 ? 'es' : ''} ${users.join(', ')}; kill ${users.length > 1 ? 'them' : 'it'} first`,
          );
        }
        await records.commit([{ collection: TEMPLATES, key: snapshot.snapshotID, value: null }]);
        await this.context.runtime.removeTemplate(snapshot.snapshotID);
        this.context.logger.info({ snapshotID: snapshot.snapshotID }, 'template deleted');
      });
    }
  }

  /**
   * The node whose data folder holds a template's files: a sandbox made from a snapshot must be
   * made there. Undefined for the built-in template (every node has it) and a Moat on its own.
   */
  async nodeOf(templateID: string): Promise<string | undefined> {
    return (
      await resolveTemplate(this.context.records.reads, this.context.teamNamespace, templateID)
    ).node;
  }
}
