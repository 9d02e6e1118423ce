/**
 * EXPERIMENT for `npm run bench:proxy` (its "Moat+x" runs): loaded into a second Moat process
 * with `node --import`, it tries two changes Moat's code could make, without touching src/:
 * - bulk: it swaps bench/proxy-experiment-splice.ts in for src/proxy/splice.ts (a module
 *   resolve hook) and makes Dialer's upstream sockets read into large recycled buffers
 *   (`onread`), by replacing Dialer.prototype.tcpConnect with a copy that differs only in that
 *   option;
 * - absolute-form GET: the http.Agent that EgressProxy.agentFor makes keeps as many idle
 *   upstream connections as it may open (maxFreeSockets 16 -> min(maxSockets, 1024)), reusing
 *   the most recent first (scheduling 'lifo'), so that more than 16 concurrent requests do not
 *   close and reopen upstream connections; and the 'timeout' listener forwardOnce leaves on a
 *   pooled socket per request is removed when the socket returns to the pool (without that,
 *   long-lived pooled sockets collect one listener and one ClientRequest per request).
 * Moat's own numbers in the benchmark never run with this.
 *
 * This one file is both the `--import` entry (main thread: registers itself as the hooks
 * module, then patches the Dialer) and the hooks module (the loader thread: `resolve`).
 */
import { register } from 'node:module';
import type net from 'node:net';
import { isMainThread } from 'node:worker_threads';

const SPLICE = new URL('../src/proxy/splice.js', import.meta.url).href;
const VARIANT = new URL('./proxy-experiment-splice.js', import.meta.url).href;

type NextResolve = (
  specifier: string,
  context: unknown,
) => Promise<{ url: string; format?: string | null; shortCircuit?: boolean }>;

/** Module hook: whoever imports Moat's splice.js gets the experiment's. */
export async function resolve(specifier: string, context: unknown, nextResolve: NextResolve) {
  const resolved = await nextResolve(specifier, context);
  return resolved.url === SPLICE ? { ...resolved, url: VARIANT } : resolved;
}

if (isMainThread) {
  register(import.meta.url);
  const http = (await import('node:http')).default;
  const MoatAgent = http.Agent;
  // MOAT_EXPERIMENT_AGENT: 'both' (default), 'pool' (only the idle pool) or 'listener' (only
  // the listener fix), to tell the two apart.
  const agentChange = process.env.MOAT_EXPERIMENT_AGENT ?? 'both';
  class PooledAgent extends MoatAgent {
    constructor(options?: import('node:http').AgentOptions) {
      const most = Math.min(options?.maxSockets ?? 1024, 1024);
      super(
        agentChange === 'listener'
          ? options
          : {
              ...options,
              maxFreeSockets: Math.max(options?.maxFreeSockets ?? 0, most),
              scheduling: 'lifo',
            },
      );
    }

    /**
     * EgressProxy.forwardOnce adds a 'timeout' listener to the pooled socket on every request
     * (socket.setTimeout with a callback) and never removes it; with connections that live
     * long that grows without bound (Node warns: MaxListenersExceededWarning). Dropped here
     * when the socket goes back to the pool, which is what ClientRequest.setTimeout would do.
     */
    override keepSocketAlive(socket: import('node:stream').Duplex): void {
      if (agentChange === 'pool') return super.keepSocketAlive(socket);
      for (const raw of socket.rawListeners('timeout')) {
        const listener = (raw as { listener?: (...args: unknown[]) => void }).listener ?? raw;
        if (/idle timeout/.test(String(listener)))
          socket.removeListener('timeout', listener as (...args: unknown[]) => void);
      }
      return super.keepSocketAlive(socket);
    }
  }
  (http as { Agent: typeof MoatAgent }).Agent = PooledAgent;
  const netModule = (await import('node:net')).default;
  const { Dialer } = await import('../src/proxy/dial.js');
  const { largeReads } = await import('./proxy-experiment-splice.js');
  type IP = { readonly text: string };
  const proto = Dialer.prototype as unknown as {
    tcpConnect(
      this: { options: { connectTimeoutMs: number } },
      ip: IP,
      port: number,
    ): Promise<net.Socket>;
  };
  // A copy of Dialer.tcpConnect (src/proxy/dial.ts) with `onread` added.
  proto.tcpConnect = function tcpConnect(ip, port) {
    return new Promise((resolve, reject) => {
      const reads = largeReads();
      const socket = netModule.connect({
        host: ip.text,
        port,
        noDelay: true,
        onread: reads.onread,
      });
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new Error('timeout'));
      }, this.options.connectTimeoutMs);
      const failed = (error: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        socket.destroy();
        reject(new Error(error.code ?? error.message));
      };
      socket.once('error', failed);
      socket.once('connect', () => {
        clearTimeout(timer);
        socket.off('error', failed);
        socket.on('error', () => socket.destroy());
        reads.bind(socket);
        resolve(socket);
      });
    });
  };
}
