import { randomInt } from 'node:crypto';
import dgram from 'node:dgram';
import net from 'node:net';
import { answersQuestion, encodeUpstreamQuery, isTruncated } from './wire.js';
import type { HostPort } from '../net/index.js';

export interface UpstreamOptions {
  /** Total time for one question across every resolver and retry. */
  readonly timeoutMs: number;
  /**
   * Time one resolver gets for one try before the next is asked; by default a third of
   * `timeoutMs` (at least 100 ms), so that a silent resolver leaves time for the others.
   */
  readonly attemptTimeoutMs?: number;
  /** Called with the seconds an upstream took to answer, for the latency histogram. */
  readonly onLatency?: (seconds: number, server: HostPort) => void;
}

export class UpstreamError extends Error {}

const MAX_TCP_MESSAGE = 65535;

/**
 * The one way an upstream exchange ends: with an answer, an error, or its deadline, whichever
 * comes first; the socket is released exactly once.
 */
function settleOnce(
  resolve: (reply: Buffer) => void,
  reject: (error: Error) => void,
  timeoutMs: number,
  transport: 'UDP' | 'TCP',
  release: () => void,
): (error: Error | undefined, reply?: Buffer) => void {
  let settled = false;
  const finish = (error: Error | undefined, reply?: Buffer) => {
    if (settled) return;
    settled = true;
    clearTimeout(timer);
    release();
    if (error) reject(error);
    else resolve(reply!);
  };
  const timer = setTimeout(
    () => finish(new Error(`no ${transport} answer within ${Math.round(timeoutMs)} ms`)),
    timeoutMs,
  );
  return finish;
}

/**
 * Asks upstream resolvers. Every try uses a fresh random ID and a fresh socket (a fresh source
 * port), and only a reply from the server asked, with our ID and our question, is accepted:
 * anything else is dropped, which is what makes off-path spoofing hard.
 */
export class UpstreamClient {
  private next = 0;
  private readonly attemptTimeoutMs: number;

  constructor(
    readonly servers: readonly HostPort[],
    private readonly options: UpstreamOptions,
  ) {
    if (servers.length === 0) throw new Error('at least one upstream DNS server is needed');
    this.attemptTimeoutMs =
      options.attemptTimeoutMs ?? Math.max(100, Math.floor(options.timeoutMs / 3));
  }

  /** Resolves a question; returns the raw reply, or throws UpstreamError when every try failed. */
  async query(name: string, type: number): Promise<Buffer> {
    const deadline = performance.now() + this.options.timeoutMs;
    const failures: string[] = [];
    // Each resolver is tried at most twice per question, and never past the deadline.
    for (let attempt = 0; attempt < this.servers.length * 2; attempt++) {
      const remaining = deadline - performance.now();
      if (remaining <= 0) break;
      const server = this.servers[(this.next + attempt) % this.servers.length]!;
      const started = performance.now();
      try {
        const id = randomInt(0, 65536);
        const query = encodeUpstreamQuery(id, name, type);
        const budget = Math.min(remaining, this.attemptTimeoutMs);
        let reply = await this.overUdp(server, query, id, budget);
        if (isTruncated(reply)) {
          reply = await this.overTcp(server, query, id, Math.max(1, deadline - performance.now()));
          // Still cut short over TCP: a part of an answer must not pass (or be cached) as whole.
          if (isTruncated(reply)) {
            failures.push(`${server.host}:${server.port} answered truncated over TCP`);
            continue;
          }
        }
        this.options.onLatency?.((performance.now() - started) / 1000, server);
        const rcode = reply.readUInt16BE(2) & 0xf;
        // SERVFAIL and REFUSED say this resolver could not help; another one may.
        if (rcode === 2 || rcode === 5) {
          failures.push(`${server.host}:${server.port} answered rcode ${rcode}`);
          continue;
        }
        this.next = (this.next + attempt) % this.servers.length;
        return reply;
      } catch (error) {
        failures.push(`${server.host}:${server.port}: ${(error as Error).message}`);
      }
    }
    this.next = (this.next + 1) % this.servers.length;
    throw new UpstreamError(
      `no upstream answered ${name} type ${type} within ${this.options.timeoutMs} ms (${failures.join('; ') || 'no time left'})`,
    );
  }

  private overUdp(server: HostPort, query: Buffer, id: number, timeoutMs: number): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const socket = dgram.createSocket(net.isIPv6(server.host) ? 'udp6' : 'udp4');
      const finish = settleOnce(resolve, reject, timeoutMs, 'UDP', () => socket.close());
      socket.on('error', (error) => finish(error));
      socket.on('message', (reply, from) => {
        if (from.address !== server.host || from.port !== server.port) return;
        if (reply.length < 12 || reply.readUInt16BE(0) !== id || !answersQuestion(reply, query))
          return;
        finish(undefined, reply);
      });
      socket.send(query, server.port, server.host, (error) => {
        if (error) finish(error);
      });
    });
  }

  private overTcp(server: HostPort, query: Buffer, id: number, timeoutMs: number): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const socket = net.connect({ host: server.host, port: server.port });
      let buffered = Buffer.alloc(0);
      const finish = settleOnce(resolve, reject, timeoutMs, 'TCP', () => socket.destroy());
      socket.on('error', (error) => finish(error));
      socket.on('connect', () => {
        const framed = Buffer.alloc(2 + query.length);
        framed.writeUInt16BE(query.length, 0);
        query.copy(framed, 2);
        socket.write(framed);
      });
      socket.on('data', (chunk: Buffer) => {
        buffered = Buffer.concat([buffered, chunk]);
        if (buffered.length > 2 + MAX_TCP_MESSAGE) return finish(new Error('TCP answer too large'));
        if (buffered.length < 2) return;
        const length = buffered.readUInt16BE(0);
        if (buffered.length < 2 + length) return;
        const reply = buffered.subarray(2, 2 + length);
        if (reply.length < 12 || reply.readUInt16BE(0) !== id || !answersQuestion(reply, query)) {
          return finish(new Error('TCP answer does not match the question'));
        }
        finish(undefined, reply);
      });
      socket.on('end', () => finish(new Error('TCP connection closed before an answer')));
    });
  }
}
