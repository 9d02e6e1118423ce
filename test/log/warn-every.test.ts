import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { warnEvery } from '../../src/log/index.js';

/** A real pino logger writing its JSON lines into an array. */
function capturedLogger() {
  const lines: Array<Record<string, unknown>> = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => lines.push(JSON.parse(line)) });
  return { logger, lines };
}

describe('warnEvery', () => {
  it('logs the first of a flood, then once per interval with how many came', () => {
    const { logger, lines } = capturedLogger();
    let clock = 0;
    const warn = warnEvery(logger, 'send failed', 10_000, () => clock);
    for (let i = 0; i < 1000; i++) {
      warn(new Error(`failure ${i}`));
      clock += 25; // 1,000 failures over 25 s
    }
    expect(lines.map((line) => [line.msg, line.occurrences])).toEqual([
      ['send failed', 1],
      ['send failed', 400],
      ['send failed', 400],
    ]);
    expect((lines[1]!.err as { message: string }).message).toBe('failure 400');
  });

  it('logs every one of failures that come slower than the interval', () => {
    const { logger, lines } = capturedLogger();
    let clock = 0;
    const warn = warnEvery(logger, 'send failed', 1000, () => clock);
    for (let i = 0; i < 3; i++) {
      warn(new Error('failure'));
      clock += 1000;
    }
    expect(lines.map((line) => line.occurrences)).toEqual([1, 1, 1]);
  });
});
