/**
 * A small authoritative-style DNS server on loopback for tests and benchmarks. It answers from
 * a zone given in code, logs every question it receives, and can be told to stay silent.
 */
import dgram from 'node:dgram';
import net from 'node:net';
import dnsPacket from 'dns-packet';
import { listenOn } from '../../src/dns/index.js';

export interface ZoneEntry {
  readonly A?: string[];
  readonly AAAA?: string[];
  readonly CNAME?: string;
  readonly ttl?: number;
}

export interface LoggedQuestion {
  readonly name: string;
  readonly type: string;
  readonly transport: 'udp' | 'tcp';
  readonly packet: dnsPacket.Packet;
}

export class FakeDns {
  readonly log: LoggedQuestion[] = [];
  /** Names (lower case) the server never answers. */
  readonly silent = new Set<string>();
  /** Names (lower case) answered over UDP only after this many ms. */
  readonly slow = new Map<string, number>();
  /** Names (lower case) answered with bytes a test makes (a hostile upstream), per transport. */
  readonly handcrafted = new Map<string, (query: Buffer, transport: 'udp' | 'tcp') => Buffer>();
  port = 0;
  private udp: dgram.Socket | undefined;
  /** Answers to slow names, waiting to be sent. */
  private readonly held = new Set<NodeJS.Timeout>();
  private tcp: net.Server | undefined;

  constructor(
    readonly zone: Map<string, ZoneEntry>,
    readonly host = '127.0.0.1',
  ) {}

  async start(): Promise<this> {
    // A free UDP port's number may be taken for TCP: try fresh pairs until both bind.
    for (let attempt = 1; ; attempt++) {
      const udp = dgram.createSocket('udp4');
      udp.on('message', (message, from) => {
        const reply = this.answer(message, 'udp');
        const wait = this.slow.get(this.log.at(-1)?.name.toLowerCase() ?? '');
        const send = () => reply && udp.send(reply, from.port, from.address);
        if (wait === undefined) return void send();
        // Cleared by stop(): an answer held back must not be sent on a closed socket.
        const timer = setTimeout(() => {
          this.held.delete(timer);
          send();
        }, wait);
        this.held.add(timer);
      });
      await new Promise<void>((resolve) => udp.bind(0, this.host, resolve));
      const tcp = net.createServer((socket) => this.serveTcp(socket));
      try {
        await listenOn(tcp, { host: this.host, port: udp.address().port });
      } catch (error) {
        udp.close();
        if (attempt >= 20) throw error;
        continue;
      }
      this.udp = udp;
      this.tcp = tcp;
      this.port = udp.address().port;
      return this;
    }
  }

  private serveTcp(socket: net.Socket): void {
    let buffered = Buffer.alloc(0);
    socket.on('error', () => socket.destroy());
    socket.on('data', (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      while (buffered.length >= 2 && buffered.length >= 2 + buffered.readUInt16BE(0)) {
        const message = buffered.subarray(2, 2 + buffered.readUInt16BE(0));
        buffered = buffered.subarray(2 + message.length);
        const reply = this.answer(message, 'tcp');
        if (reply)
          socket.write(
            Buffer.concat([Buffer.from([reply.length >> 8, reply.length & 255]), reply]),
          );
      }
    });
  }

  async stop(): Promise<void> {
    for (const timer of this.held) clearTimeout(timer);
    this.held.clear();
    await new Promise<void>((resolve) => (this.udp ? this.udp.close(() => resolve()) : resolve()));
    await new Promise<void>((resolve) => (this.tcp ? this.tcp.close(() => resolve()) : resolve()));
  }

  /** Questions received for a name (any case, any type). */
  asked(name: string): LoggedQuestion[] {
    return this.log.filter((q) => q.name.toLowerCase() === name.toLowerCase());
  }

  private answer(message: Buffer, transport: 'udp' | 'tcp'): Buffer | undefined {
    let query: dnsPacket.Packet;
    try {
      query = dnsPacket.decode(message);
    } catch {
      return undefined;
    }
    const question = query.questions?.[0];
    if (!question) return undefined;
    this.log.push({ name: question.name, type: question.type, transport, packet: query });
    const name = question.name.toLowerCase();
    if (this.silent.has(name)) return undefined;
    const handcrafted = this.handcrafted.get(name);
    if (handcrafted !== undefined) return handcrafted(message, transport);
    const answers: dnsPacket.Answer[] = [];
    let owner = name;
    let entry = this.zone.get(owner);
    if (entry?.CNAME && question.type !== 'CNAME') {
      answers.push({ type: 'CNAME', name: owner, ttl: entry.ttl ?? 60, data: entry.CNAME });
      owner = entry.CNAME;
      entry = this.zone.get(owner);
    }
    const type = question.type as 'A' | 'AAAA';
    for (const data of entry?.[type] ?? [])
      answers.push({ type, name: owner, ttl: entry?.ttl ?? 60, data });
    const exists = this.zone.has(name);
    const reply = {
      type: 'response' as const,
      id: query.id,
      flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE | (exists ? 0 : 3),
      questions: [question],
      answers,
      authorities: exists
        ? []
        : [
            {
              type: 'SOA' as const,
              name: 'test',
              ttl: 300,
              data: {
                mname: 'ns.test',
                rname: 'admin.test',
                serial: 1,
                refresh: 60,
                retry: 60,
                expire: 60,
                minimum: 60,
              },
            },
          ],
    };
    let encoded = dnsPacket.encode(reply);
    const udpLimit = (query.additionals ?? []).some((r) => r.type === 'OPT') ? 1232 : 512;
    if (transport === 'udp' && encoded.length > udpLimit) {
      encoded = dnsPacket.encode({
        ...reply,
        flags: reply.flags | dnsPacket.TRUNCATED_RESPONSE,
        answers: [],
        authorities: [],
      });
    }
    return encoded;
  }
}
