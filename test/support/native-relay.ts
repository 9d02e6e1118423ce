import { expect } from 'vitest';
import {
  type NativeClient,
  type NativeListenerHandlers,
  nativeTcp,
} from '../../src/proxy/native-tcp.js';

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Polls `condition` every 5 ms until it holds or `timeoutMs` passed. */
export async function until(condition: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!condition() && performance.now() < deadline) await sleep(5);
}

/**
 * After a test that used the native relay (when it loads here): every socket it opened is
 * closed, and no bytes are left waiting for a reader.
 */
export async function expectNativeRelayEmpty(): Promise<void> {
  const relay = nativeTcp('auto');
  if (relay === undefined) return;
  await until(() => relay.stats().sockets === 0, 2000);
  expect(relay.stats()).toEqual({ sockets: 0, pendingBytes: 0 });
}

/** Listener handlers that keep every client and hand each, with its first bytes, to `client`. */
export const everyClient = (client: (client: NativeClient) => void): NativeListenerHandlers => ({
  opened: () => true,
  client,
  gone: () => {},
});
