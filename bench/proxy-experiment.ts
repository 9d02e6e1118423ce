/**
 * EXPERIMENT for `npm run bench:proxy` (its "Moat+x" runs): loaded into a second Moat process
 * with `node --import`, it tries a change Moat's code could make, without touching src/: the
 * http.Agent that EgressProxy.agentFor makes keeps as many idle upstream connections as it may
 * open (maxFreeSockets 16 -> min(maxSockets, 1024)), reusing the most recent first (scheduling
 * 'lifo'), so that more than 16 concurrent requests do not close and reopen upstream
 * connections; and the 'timeout' listener forwardOnce leaves on a pooled socket per request is
 * removed when the socket returns to the pool (without that, long-lived pooled sockets collect
 * one listener and one ClientRequest per request). Moat's own numbers in the benchmark never run
 * with this.
 */
import http from 'node:http';

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
