/**
 * Forks: `count` sandboxes made from one copy of a sandbox's files, taken while it is frozen for
 * a moment (it keeps its ID, expiry and processes).
 */
import type { IPAddress, Policy } from '../policy/index.js';
import { newSandboxID, newSecret, randomName } from './ids.js';
import { madeHere } from './membership.js';
import type { LifecycleParts } from './parts.js';
import type { SandboxRecord } from './records.js';
import { type ForkResult, MAX_FORKS, SandboxError } from './requests.js';

/** What forking uses of the lifecycle's parts. */
export interface ForkContext extends Pick<
  LifecycleParts,
  'queue' | 'runtime' | 'sources' | 'policies' | 'cluster' | 'logger' | 'now' | 'transition'
> {
  /** The sandbox as the lifecycle answers it (404 when it does not exist). */
  get(sandboxID: string): Promise<SandboxRecord>;
  /** Makes, records and enforces the sandbox of `record` from the files of `template`. */
  launch(
    record: SandboxRecord,
    template: string,
    source: IPAddress,
    policy: Policy,
  ): Promise<SandboxRecord>;
  /** Expires what is due now (a fork with timeout 0 expires at once). */
  expireDue(): Promise<void>;
}

/**
 * Each fork gets the source's network config, lifecycle, metadata, environment and limits,
 * fresh tokens and no processes. Forks succeed or fail one by one; the copy is made once.
 */
export async function fork(
  context: ForkContext,
  sandboxID: string,
  count: number,
  seconds: number,
): Promise<ForkResult[]> {
  if (!Number.isSafeInteger(count) || count < 1 || count > MAX_FORKS) {
    throw new SandboxError(400, `count must be from 1 to ${MAX_FORKS} (got ${count})`);
  }
  const copy = `fork-${randomName(20)}`;
  const parent = await context.queue.run(sandboxID, async () => {
    const record = await context.get(sandboxID);
    await context.runtime.snapshot(sandboxID, copy);
    return record;
  });
  const policy = context.policies.stored(parent);
  const results: ForkResult[] = [];
  try {
    // One at a time: each is a copy-on-write mount of the same layer, cheap next to a boot.
    for (let i = 0; i < count; i++)
      results.push(await forkOne(context, parent, copy, seconds, policy));
  } finally {
    // Each fork's own record names the copy's layer; the template name is not needed any more.
    await context.runtime.removeTemplate(copy).catch((error: Error) => {
      context.logger.warn({ sandboxID, err: error.message }, 'could not remove a fork’s copy');
    });
  }
  return results;
}

async function forkOne(
  context: ForkContext,
  parent: SandboxRecord,
  copy: string,
  seconds: number,
  policy: Policy,
): Promise<ForkResult> {
  try {
    const now = context.now();
    const source = context.sources.allocate();
    const record: SandboxRecord = {
      ...parent,
      sandboxID: newSandboxID(),
      state: 'running',
      startedAt: now,
      endAt: now + seconds * 1000,
      filesOnly: false,
      envdAccessToken: parent.secure ? newSecret() : null,
      trafficAccessToken: parent.network.allowPublicTraffic ? null : newSecret(),
      egressSecret: newSecret(),
      sourceAddress: source.text,
      ...madeHere(context.cluster),
    };
    await context.launch(record, copy, source, policy);
    context.transition(record, 'fork', { from: parent.sandboxID, timeout: seconds });
    if (seconds === 0) await context.expireDue();
    return record;
  } catch (error) {
    context.logger.error(
      { sandboxID: parent.sandboxID, err: (error as Error).message },
      'fork failed',
    );
    // As the API answers any error it did not expect: the details are in the log only.
    return error instanceof SandboxError
      ? error
      : new SandboxError(500, 'internal error; the server log has the details');
  }
}
