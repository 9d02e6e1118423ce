/**
 * One lifecycle stack for everything Moat starts: each start pushes its stop, and stopping
 * unwinds the stack in reverse, so what started last stops first, on a clean stop and after a
 * failed start alike (a start that failed halfway leaves no listener open and no lock held).
 */
export type StopStep = (drainMs: number) => Promise<unknown> | unknown;

export class Lifecycle {
  private readonly steps: StopStep[] = [];

  /** Registers how to stop what just started. */
  started(stop: StopStep): void {
    this.steps.push(stop);
  }

  /**
   * Runs every step, latest first, each once: a failing step does not keep the ones below it
   * from running; the first failure is thrown once all have run.
   */
  async stop(drainMs = 0): Promise<void> {
    let failure: { error: unknown } | undefined;
    for (let step = this.steps.pop(); step !== undefined; step = this.steps.pop()) {
      try {
        await step(drainMs);
      } catch (error) {
        failure ??= { error };
      }
    }
    if (failure !== undefined) throw failure.error;
  }
}
