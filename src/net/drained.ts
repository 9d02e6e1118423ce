import type { EventEmitter } from 'node:events';

const waits = new WeakMap<EventEmitter, Promise<void>>();

/**
 * Resolves once `stream` emits `drain` or `close`. However many wait on one stream, it gets one
 * pair of listeners (a listener per waiter would pile up while a slow peer holds everyone).
 */
export function drainedOrClosed(stream: EventEmitter): Promise<void> {
  let wait = waits.get(stream);
  if (wait === undefined) {
    wait = new Promise<void>((resolve) => {
      const done = () => {
        stream.off('drain', done);
        stream.off('close', done);
        waits.delete(stream);
        resolve();
      };
      stream.on('drain', done);
      stream.on('close', done);
    });
    waits.set(stream, wait);
  }
  return wait;
}
