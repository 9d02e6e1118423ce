/**
 * Runs `work` on request, one run at a time; a request during a run makes one more run after it,
 * and a failed run is tried again every 500 ms until one succeeds (reported once per streak).
 */
export class RetryingTask {
  private running = false;
  private again = false;

  constructor(
    private readonly work: () => Promise<void>,
    private readonly onFailure: (error: Error) => void,
  ) {}

  request(): void {
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = true;
    void this.run();
  }

  private async run(): Promise<void> {
    let failures = 0;
    for (;;) {
      this.again = false;
      try {
        await this.work();
        failures = 0;
        if (!this.again) break;
      } catch (error) {
        // Said once per streak: the store may take a while to come back.
        if (failures++ === 0) this.onFailure(error as Error);
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
    this.running = false;
  }
}
