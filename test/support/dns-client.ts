/** Starts a real DnsInterceptor on loopback for tests, and speaks to it as a sandbox would. */
import dgram from 'node:dgram';
import net from 'node:net';
import dnsPacket from 'dns-packet';
import { pino } from 'pino';
import { startMoat } from '../../src/app/index.js';
import { scratchMoatFlags } from '../../bench/lib/scratch.js';
import { loadConfig } from '../../src/config.js';
import type { DnsInterceptor } from '../../src/dns/index.js';
import type { EnforcementTable } from '../../src/enforce/index.js';
import type { MoatMetrics } from '../../src/metrics/index.js';

export interface DnsHarness {
  readonly port: number;
  readonly table: EnforcementTable;
  readonly metrics: MoatMetrics;
  readonly interceptor: DnsInterceptor;
  /** The clock Moat reads; tests move it forward. */
  readonly clock: { now: number };
  stop(): Promise<void>;
}

/** Starts Moat as `moat serve` does (loopback, free ports), with a clock the test controls. */
export async function startInterceptor(
  upstreamPort: number,
  options: {
    timeoutMs?: number;
    rateLimit?: number;
    realClocks?: boolean;
    udpIo?: 'auto' | 'dgram';
  } = {},
): Promise<DnsHarness> {
  const clock = { now: 1_000_000 };
  const scratch = scratchMoatFlags();
  const config = loadConfig({
    flags: {
      'dns-listen': '127.0.0.1:0',
      'dns-upstream': `127.0.0.1:${upstreamPort}`,
      'dns-timeout-ms': String(options.timeoutMs ?? 1000),
      'dns-rate-limit': String(options.rateLimit ?? 10_000),
      'dns-cache-size': '1000',
      'dns-udp-io': options.udpIo ?? 'auto',
      'proxy-listen': '127.0.0.1:0',
      'transparent-listen': 'off',
      ...scratch.flags,
    },
  });
  if (!config.ok) throw new Error(config.error);
  const moat = await startMoat(config.value, pino({ level: 'silent' }), {
    // With real clocks Moat runs on its own (tests then leave `clock` alone).
    now: options.realClocks ? undefined : () => clock.now,
    defaultMetrics: false,
  });
  return {
    port: moat.listening.dns.port,
    table: moat.table,
    metrics: moat.metrics,
    interceptor: moat.dns,
    clock,
    stop: async () => {
      await moat.stop();
      scratch.remove();
    },
  };
}

/** A decoded reply with the fields dns-packet sets but its typings leave out. */
export type Reply = Omit<dnsPacket.Packet, 'answers'> & {
  rcode: string;
  flag_tc: boolean;
  answers?: Array<{ type: string; name: string; ttl?: number; data?: unknown }>;
};
export const decodeReply = (raw: Buffer): Reply => dnsPacket.decode(raw) as unknown as Reply;

export type QueryType = dnsPacket.RecordType | 'ANY';

export function encodeQuery(
  name: string,
  type: QueryType = 'A',
  options: { id?: number; edns?: number } = {},
): Buffer {
  return dnsPacket.encode({
    type: 'query',
    id: options.id ?? 4242,
    flags: dnsPacket.RECURSION_DESIRED,
    questions: [{ type: type as dnsPacket.RecordType, name, class: 'IN' }],
    additionals: options.edns
      ? [
          {
            type: 'OPT',
            name: '.',
            udpPayloadSize: options.edns,
            flags: 0,
            options: [],
          } as unknown as dnsPacket.Answer,
        ]
      : [],
  });
}

/** Sends raw bytes over UDP from `source` and waits for one reply (or undefined on timeout). */
export function udpExchange(
  port: number,
  message: Buffer,
  source: string,
  timeoutMs = 3000,
): Promise<{ raw: Buffer; at: number } | undefined> {
  return new Promise((resolve, reject) => {
    const socket = dgram.createSocket('udp4');
    const timer = setTimeout(() => {
      socket.close();
      resolve(undefined);
    }, timeoutMs);
    socket.on('error', reject);
    socket.on('message', (raw) => {
      clearTimeout(timer);
      socket.close();
      resolve({ raw, at: performance.now() });
    });
    socket.bind(0, source, () => socket.send(message, port, '127.0.0.1'));
  });
}

export async function udpQuery(
  port: number,
  source: string,
  name: string,
  type: QueryType = 'A',
  options: { edns?: number } = {},
): Promise<Reply & { raw: Buffer }> {
  const reply = await udpExchange(port, encodeQuery(name, type, options), source);
  if (!reply) throw new Error(`no UDP reply for ${name}`);
  return { ...decodeReply(reply.raw), raw: reply.raw };
}

/** Sends framed messages over one TCP connection from `source`; resolves with every reply. */
export function tcpExchange(
  port: number,
  messages: Buffer[],
  source: string,
  timeoutMs = 3000,
): Promise<Buffer[]> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: '127.0.0.1', port, localAddress: source });
    const replies: Buffer[] = [];
    let buffered = Buffer.alloc(0);
    const timer = setTimeout(() => {
      socket.destroy();
      resolve(replies);
    }, timeoutMs);
    socket.on('error', reject);
    socket.on('connect', () => {
      for (const m of messages)
        socket.write(Buffer.concat([Buffer.from([m.length >> 8, m.length & 255]), m]));
    });
    socket.on('data', (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      while (buffered.length >= 2 && buffered.length >= 2 + buffered.readUInt16BE(0)) {
        replies.push(buffered.subarray(2, 2 + buffered.readUInt16BE(0)));
        buffered = buffered.subarray(2 + replies.at(-1)!.length);
      }
      if (replies.length === messages.length) {
        clearTimeout(timer);
        socket.destroy();
        resolve(replies);
      }
    });
  });
}
