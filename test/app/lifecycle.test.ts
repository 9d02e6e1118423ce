/** The one lifecycle stack: latest first, every step once, a failure reported after all ran. */
import { describe, expect, it } from 'vitest';
import { Lifecycle } from '../../src/app/lifecycle.js';

describe('the lifecycle stack', () => {
  it('stops what started last first, handing each step the drain time', async () => {
    const lifecycle = new Lifecycle();
    const stopped: string[] = [];
    for (const part of ['store', 'dns', 'proxy', 'api'])
      lifecycle.started(async (drainMs) => {
        await new Promise((resolve) => setTimeout(resolve, 1));
        stopped.push(`${part}:${drainMs}`);
      });
    await lifecycle.stop(250);
    expect(stopped).toEqual(['api:250', 'proxy:250', 'dns:250', 'store:250']);
    // A second stop has nothing left to do.
    await lifecycle.stop();
    expect(stopped).toHaveLength(4);
  });

  it('runs every step when one fails, and throws the first failure after', async () => {
    const lifecycle = new Lifecycle();
    const stopped: string[] = [];
    lifecycle.started(() => void stopped.push('store'));
    lifecycle.started(() => {
      throw new Error('dns would not stop');
    });
    lifecycle.started(() => Promise.reject(new Error('api would not stop')));
    lifecycle.started(() => void stopped.push('metrics'));
    await expect(lifecycle.stop()).rejects.toThrow('api would not stop');
    expect(stopped).toEqual(['metrics', 'store']);
  });
});
