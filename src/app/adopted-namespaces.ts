/**
 * Network-only sandboxes hold namespaces that other runtimes made and may delete at any time:
 * every second, each adopted namespace's path is checked, and a sandbox whose namespace is gone
 * is detached (logged with why), so that GET answers 404 within a few seconds.
 */
import type { Logger } from 'pino';
import type { SandboxService } from '../sandbox/index.js';
import { RetryingTask } from './retrying-task.js';

export const LOSS_CHECK_MS = 1000;

export function watchAdoptedNamespaces(
  sandboxes: Pick<SandboxService, 'detachLost'>,
  logger: Logger,
): { stop(): void } {
  const task = new RetryingTask(
    () => sandboxes.detachLost(),
    (error) =>
      logger.error(
        { err: error.message },
        'could not check the namespaces of network-only sandboxes',
      ),
  );
  const timer = setInterval(() => task.request(), LOSS_CHECK_MS);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
