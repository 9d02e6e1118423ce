import net from 'node:net';
import type { Logger } from 'pino';
import { warnEvery } from '../log/index.js';
import { type HostPort, listenFailure } from '../net/index.js';
import type {
  ConnectionBudget,
  EnforcedSandbox,
  EnforcementTable,
  LearnedElement,
} from '../enforce/index.js';
import type { FlowRecorder } from '../flows/index.js';
import type { DnsVerdict, HotCount, MoatMetrics } from '../metrics/index.js';
import {
  allowedPorts,
  deniedPorts,
  deniesLearnedName,
  canonicalName,
  type CanonicalName,
  decide,
  type HostAddresses,
  parseIP,
} from '../policy/index.js';
import { listenOn } from './listen.js';
import { DnsTcpConnections } from './tcp-connections.js';
import {
  batchedUdpUnavailable,
  listenUdp,
  type UdpIo,
  type UdpIoSetting,
  type UdpListener,
} from './udp.js';
import { type AnswerCache, buildAnswer, type CachedAnswer } from './cache.js';
import {
  emptyAnswer,
  finishAnswer,
  parseQuery,
  type Query,
  questionOf,
  RCODE,
  TYPE,
  udpLimit,
} from './wire.js';

export interface DnsInterceptorOptions {
  readonly listen: HostPort;
  readonly table: EnforcementTable;
  readonly cache: AnswerCache;
  readonly metrics: MoatMetrics;
  readonly logger: Logger;
  /** Where each query's decision is recorded. */
  readonly flows: FlowRecorder;
  /** Clamp for how long a learned address stays allowed, seconds. */
  readonly minLearnTtl: number;
  readonly maxLearnTtl: number;
  /** Queries per second per sandbox (token bucket, burst of the same size). */
  readonly rateLimit: number;
  /** The host itself, the gateway and sandbox links: stripped from answers, whatever the policy. */
  readonly host: HostAddresses;
  readonly now: () => number;
  /** TCP connections idle longer than this are closed (RFC 7766 section 6.2.3). */
  readonly tcpIdleTimeoutMs?: number;
  /** Each TCP connection is charged to its sandbox's connection budget from accept to close. */
  readonly connections: ConnectionBudget;
  /** UDP I/O: batched system calls where available (`auto`, the default) or node:dgram. */
  readonly udpIo?: UdpIoSetting;
  /**
   * Called with the addresses an answer newly opens (or keeps open longer) for a sandbox; the
   * answer is released once it resolves (the kernel enforcer opens them in the sandbox's
   * firewall). A rejection is logged and the answer still released: the firewall stays closed.
   */
  readonly onLearn?: (sandboxID: string, learned: LearnedElement[]) => Promise<void>;
}

type Transport = 'udp' | 'tcp';

const TCP_LIMIT = 65535;
const MAX_TCP_CONNECTIONS = 1024;

/**
 * The DNS interceptor: every sandbox's resolver. It decides each query name with the
 * sandbox's compiled Policy, answers denied names itself (NXDOMAIN, never forwarded), forwards
 * the rest through the shared cache, strips addresses the policy refuses, and learns the
 * addresses it hands out before the answer leaves.
 */
export class DnsInterceptor {
  private readonly sockets: Array<{ udp: UdpListener; tcp: net.Server }> = [];
  private readonly buckets = new Map<string, { tokens: number; at: number }>();
  private readonly tcpConnections: DnsTcpConnections;
  /** Failed UDP sends (one per batch on the batched path) logged at most every 10 s. */
  private readonly sendFailed: (error: Error) => void;

  constructor(private readonly options: DnsInterceptorOptions) {
    this.tcpConnections = new DnsTcpConnections({
      connections: options.connections,
      idleTimeoutMs: options.tcpIdleTimeoutMs ?? 10_000,
      answer: (message, source) => this.answer(message, source, 'tcp'),
    });
    this.sendFailed = warnEvery(options.logger, 'dns udp socket error', 10_000, options.now);
    options.metrics.countLearnedWith(() =>
      options.table.all().reduce((sum, s) => sum + s.learned.size, 0),
    );
    options.table.subscribe((event) => {
      if (event.type === 'removed') this.buckets.delete(event.sandboxID);
    });
  }

  /** Binds UDP and TCP on the configured address and port; resolves to the bound port. */
  start(): Promise<number> {
    return this.listen(this.options.listen);
  }

  /** Binds UDP and TCP on one more address (and port); resolves to the bound port. */
  async listen({ host, port }: HostPort): Promise<number> {
    // With port 0 the UDP port is free but the same number may be taken for TCP: try again.
    for (let attempt = 1; ; attempt++) {
      const udp = await listenUdp(host, port, {
        io: this.options.udpIo ?? 'auto',
        respond: (message, source) => this.answer(message, source, 'udp'),
        onOversize: (source, length) => {
          this.count('udp', 'dropped');
          this.options.logger.debug({ source, length }, 'dns udp datagram too long, dropped');
        },
        // A send error (e.g. the client vanished) must never end the listener.
        onSendError: this.sendFailed,
      }).catch((error: unknown) => {
        throw listenFailure('DNS listener udp', { host, port }, error);
      });
      const tcp = net.createServer((socket) => this.tcpConnections.serve(socket));
      tcp.maxConnections = MAX_TCP_CONNECTIONS;
      try {
        await listenOn(tcp, { host, port: udp.port });
      } catch (error) {
        await udp.close();
        if (port !== 0 || attempt >= 20 || (error as NodeJS.ErrnoException).code !== 'EADDRINUSE')
          throw listenFailure('DNS listener tcp', { host, port: udp.port }, error);
        continue;
      }
      this.sockets.push({ udp, tcp });
      if (this.sockets.length === 1)
        this.options.logger.info(
          { io: udp.io, why: udp.io === 'dgram' ? this.dgramReason() : undefined },
          'dns udp listener',
        );
      return udp.port;
    }
  }

  /** How each UDP listener does its I/O, in the order they were bound. */
  get udpIo(): UdpIo[] {
    return this.sockets.map(({ udp }) => udp.io);
  }

  /** Why this interceptor answers UDP with node:dgram. */
  private dgramReason(): string {
    return this.options.udpIo === 'dgram'
      ? 'configured (--dns-udp-io dgram)'
      : (batchedUdpUnavailable() ?? 'unknown');
  }

  async stop(): Promise<void> {
    this.tcpConnections.closeAll();
    await Promise.all(
      this.sockets
        .splice(0)
        .flatMap(({ udp, tcp }) => [
          udp.close(),
          new Promise<void>((resolve) => tcp.close(() => resolve())),
        ]),
    );
  }

  /** Query counts by transport and verdict, each made on first use. */
  private readonly counts: Record<Transport, Partial<Record<DnsVerdict, HotCount>>> = {
    udp: {},
    tcp: {},
  };

  private count(transport: Transport, verdict: DnsVerdict): void {
    const byVerdict = this.counts[transport];
    (byVerdict[verdict] ??= this.options.metrics.hotCount(this.options.metrics.dnsQueries, {
      transport,
      verdict,
    })).count++;
  }

  /**
   * Answers one message from `source`. Returns the bytes to send back, or undefined to stay
   * silent; synchronously when the answer is cached. Never throws or rejects: any failure
   * becomes SERVFAIL for a parsed query.
   */
  answer(
    message: Buffer,
    source: string,
    transport: Transport,
  ): Buffer | undefined | Promise<Buffer | undefined> {
    const parsed = parseQuery(message);
    if (parsed.kind === 'drop') {
      this.count(transport, 'dropped');
      return undefined;
    }
    // Who asks comes first: a stranger learns nothing from how its bytes were wrong, and a
    // sandbox's malformed queries cost tokens like any other.
    const sandbox = this.sandboxAt(source);
    const limited = sandbox !== undefined && !this.takeToken(sandbox.sandboxID);
    if (parsed.kind === 'error') {
      const rcode = sandbox === undefined || limited ? RCODE.REFUSED : parsed.rcode;
      this.count(transport, rcode === RCODE.REFUSED ? 'refused' : 'formerr');
      return emptyAnswer(parsed.id, parsed.question, rcode);
    }
    const { query } = parsed;
    const refuse = (reason: string, sandbox?: EnforcedSandbox) => {
      this.count(transport, 'refused');
      this.options.logger.debug(
        { sandboxID: sandbox?.sandboxID, source, name: query.name, reason },
        'dns query refused',
      );
      return emptyAnswer(query.id, questionOf(query), RCODE.REFUSED, query);
    };
    if (sandbox === undefined) return refuse('unknown source address');
    if (limited) return refuse('rate limit', sandbox);
    if (query.type === TYPE.ANY) return refuse('ANY queries are not answered (RFC 8482)', sandbox);
    const name = canonicalName(query.name);
    if (!name.ok) return refuse(name.error, sandbox);

    // Undefined when the sandbox's current policy allows the name; else the NXDOMAIN to send.
    // Decided again once a slow answer came (`again`): recorded then only if it now denies.
    const blocked = (again = false) => {
      const verdict = decide(sandbox.policy, { host: name.value, ip: undefined, port: undefined });
      if (again && verdict.verdict === 'allow') return undefined;
      this.options.flows.decided(
        {
          sandboxID: sandbox.sandboxID,
          kind: 'dns',
          destination: { name: name.value, address: null, port: null, protocol: transport },
        },
        verdict,
      );
      if (verdict.verdict === 'allow') return undefined;
      this.count(transport, 'blocked');
      return emptyAnswer(query.id, questionOf(query), RCODE.NXDOMAIN, query);
    };
    const denied = blocked();
    if (denied !== undefined) return denied;
    const limit = transport === 'udp' ? udpLimit(query) : TCP_LIMIT;
    const servfail = (error: unknown) => {
      this.count(transport, 'servfail');
      this.options.logger.warn(
        { sandboxID: sandbox.sandboxID, destination: name.value, err: (error as Error).message },
        'dns servfail',
      );
      return emptyAnswer(query.id, questionOf(query), RCODE.SERVFAIL, query);
    };
    const forward = (answer: CachedAnswer) => {
      try {
        const reply = this.reply(sandbox, name.value, answer, query, limit);
        this.count(transport, 'forwarded');
        return reply;
      } catch (error) {
        return servfail(error);
      }
    };
    // An answer that took a while: the sandbox may have gone, or its policy denied the name
    // meanwhile (a PUT's reply promises the next query sees the new policy; so does this one).
    const forwardLate = (answer: CachedAnswer) => {
      if (!this.options.table.holds(sandbox))
        return refuse('the sandbox was removed while its query was answered', sandbox);
      return blocked(true) ?? forward(answer);
    };
    try {
      const resolved = this.options.cache.resolve(name.value, query.type);
      return resolved instanceof Promise ? resolved.then(forwardLate, servfail) : forward(resolved);
    } catch (error) {
      return servfail(error);
    }
  }

  /** The sandbox behind a source address (udp6 sockets report IPv4 peers as ::ffff:a.b.c.d). */
  private sandboxAt(source: string): EnforcedSandbox | undefined {
    const direct = this.options.table.fromSource(source);
    if (direct !== undefined) return direct;
    const parsed = parseIP(source);
    return parsed.ok && parsed.value.text !== source
      ? this.options.table.fromSource(parsed.value.text)
      : undefined;
  }

  /** Checks the answer's addresses against the sandbox's policy, learns the kept ones, encodes. */
  private reply(
    sandbox: EnforcedSandbox,
    name: CanonicalName,
    answer: CachedAnswer,
    query: Query,
    limit: number,
  ): Buffer | Promise<Buffer> {
    const { minLearnTtl, maxLearnTtl } = this.options;
    // The TTLs as the upstream gave them, however long the answer has been cached: counted
    // down, they would tell one sandbox when another asked for the same name (and answers
    // may outlive the upstream's TTL by one TTL at most, the cost of that).
    const ttls = answer.ttls;
    const policy = sandbox.policy;
    const refused = new Set<number>();
    for (const { index, ip } of answer.addresses) {
      if (
        this.options.host.decide(ip) !== undefined ||
        decide(policy, { host: name, ip }).verdict === 'deny'
      )
        refused.add(index);
    }
    // Learn before the answer is released: the client may connect the moment it has it.
    const opened: LearnedElement[] = [];
    for (const { index, ip } of answer.addresses) {
      if (refused.has(index)) continue;
      const ttl = Math.min(maxLearnTtl, Math.max(minLearnTtl, ttls[index]!));
      const denied = deniedPorts(policy, [name]);
      const expiresAt = sandbox.learned.learn(ip, name, ttl, deniesLearnedName(policy, name));
      // The table holds only denials and cannot take this address: not handed out.
      if (expiresAt === 'full') refused.add(index);
      // The firewall opens the address on the ports this name is allowed on (every port for a
      // portless rule) and closes those it is denied on: the ports of the address's other
      // names are already in.
      else if (expiresAt !== undefined)
        opened.push({ address: ip, expiresAt, ports: allowedPorts(policy, [name]), denied });
    }
    const reply = this.encode(name, answer, ttls, refused, query, limit);
    const { onLearn } = this.options;
    if (onLearn === undefined || opened.length === 0) return reply;
    return onLearn(sandbox.sandboxID, opened).then(
      () => reply,
      (error: Error) => {
        this.options.logger.error(
          { sandboxID: sandbox.sandboxID, destination: name, err: error.message },
          'learned addresses could not be opened in the firewall',
        );
        sandbox.learned.firewallMissed(opened.map((element) => element.address));
        return reply;
      },
    );
  }

  /** The answer as this client gets it: refused addresses left out. */
  private encode(
    name: CanonicalName,
    answer: CachedAnswer,
    ttls: readonly number[],
    refused: ReadonlySet<number>,
    query: Query,
    limit: number,
  ): Buffer {
    if (refused.size === 0)
      return finishAnswer(answer.template, answer.offsets, ttls, query, answer.rcode, limit);
    // Rare path: this sandbox may not see some addresses (rebinding defence); re-encode without them.
    const keep = answer.answers.map((_, i) => !refused.has(i));
    const stripped = buildAnswer(
      name,
      query.type,
      answer.rcode,
      { answers: answer.answers.filter((_, i) => keep[i]), authorities: answer.authorities },
      ttls.filter((_, i) => i >= answer.answers.length || keep[i]),
      this.options.now(),
      0,
    );
    return finishAnswer(
      stripped.template,
      stripped.offsets,
      stripped.ttls,
      query,
      stripped.rcode,
      limit,
    );
  }

  private takeToken(sandboxID: string): boolean {
    const rate = this.options.rateLimit;
    const at = this.options.now();
    const bucket = this.buckets.get(sandboxID) ?? { tokens: rate, at };
    bucket.tokens = Math.min(rate, bucket.tokens + ((at - bucket.at) / 1000) * rate);
    bucket.at = at;
    this.buckets.set(sandboxID, bucket);
    if (bucket.tokens < 1) return false;
    bucket.tokens -= 1;
    return true;
  }
}
