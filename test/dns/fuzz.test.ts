/**
 * Fuzzes the DNS interceptor: well over 100,000 random and mutated messages through
 * `answer()` and over real UDP and TCP sockets, from a sandbox and from an unknown source. The
 * process must never throw, every reply must be a well-formed answer to its query, no denied
 * name may reach the upstream, and valid queries must still be answered correctly afterwards.
 *
 * The run is seeded; set MOAT_FUZZ_SEED to replay one. Failures name the seed, the generator
 * and the packet (hex).
 */
import dgram from 'node:dgram';
import net from 'node:net';
import { setImmediate as tick } from 'node:timers/promises';
import dnsPacket from 'dns-packet';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DnsInterceptor } from '../../src/dns/index.js';
import { TCP_MESSAGE_TIMEOUT_MS } from '../../src/dns/tcp-connections.js';
import type { MoatMetrics } from '../../src/metrics/index.js';
import { compilePolicy, parseIP, parseNetworkConfig } from '../../src/policy/index.js';
import {
  type DnsHarness,
  encodeQuery,
  startInterceptor,
  tcpExchange,
  udpExchange,
} from '../support/dns-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { TEST_ZONE as zone } from '../support/test-zone.js';
import {
  buildQuery,
  deservesReply,
  frame,
  type GeneratedPacket,
  generatePacket,
  isAllowedName,
  Rng,
  replyProblems,
  splitFrames,
  truncationSweep,
  validQuery,
  wireName,
} from '../support/fuzz-packets.js';

const SEED = Number(process.env.MOAT_FUZZ_SEED ?? Math.floor(Math.random() * 2 ** 32)) >>> 0;

/** How many messages each path gets (a fresh seed each run adds up to more over time). */
const DIRECT_PACKETS = 60_000;
const UDP_SANDBOX_PACKETS = 45_000;
const UDP_UNKNOWN_PACKETS = 8_000;
const TCP_SESSIONS = 48;
const TCP_MESSAGES_PER_SESSION = 250;
const TCP_HOSTILE_STREAMS = 400;
/**
 * Each phase stops here even if it has not sent everything (and then fails on the count). Quiet,
 * a phase takes 2-7 s; beside two busy loops and the rest of the suite on two cores, three
 * times that and more (issue 36's load runs ran out of 20 s, and at load 8 out of 40 s).
 */
const PHASE_BUDGET_MS = 60_000;
/** A phase stops early once something crashed or this many queries went unanswered. */
const GIVE_UP_UNANSWERED = 5;

const SANDBOX = 'isandbox0000000000001';
const SOURCE = '127.77.0.2';
const UNKNOWN = '127.77.0.99';
const WEIRD_SOURCES = ['', 'not-an-address', '127.77.0.256', '::1', '10.0.0.1', UNKNOWN];

function allowTestPolicy() {
  const parsed = parseNetworkConfig({ allowOut: ['*.allowed.test'], denyOut: ['0.0.0.0/0'] });
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
  return compilePolicy(parsed.value);
}

/** Problems found, grouped, with a few example packets each. */
class Findings {
  private readonly byProblem = new Map<string, { count: number; examples: string[] }>();

  add(problem: string, packet: GeneratedPacket, where: string): void {
    const entry = this.byProblem.get(problem) ?? { count: 0, examples: [] };
    entry.count++;
    if (entry.examples.length < 3) {
      const hex = packet.bytes.toString('hex');
      entry.examples.push(
        `${where} ${packet.kind} ${hex.length > 240 ? `${hex.slice(0, 240)}...` : hex}`,
      );
    }
    this.byProblem.set(problem, entry);
  }

  get list(): string[] {
    return [...this.byProblem].map(
      ([problem, { count, examples }]) => `${problem} (x${count}): ${examples.join(' | ')}`,
    );
  }
}

let upstream: FakeDns;
let dns: DnsInterceptor;
let port: number;
let harness: DnsHarness | undefined;
let metrics: MoatMetrics;
/** Everything that reached the process-level handlers (the first few, in full). */
const crashes: string[] = [];
const recordCrash = (what: string, error: unknown) => {
  if (crashes.length < 5) crashes.push(`${what}: ${(error as Error)?.stack ?? String(error)}`);
  else crashes[5] = `... and more`;
};
const onUncaught = (error: unknown) => recordCrash('uncaughtException', error);
const onUnhandled = (reason: unknown) => recordCrash('unhandledRejection', reason);
let upstreamQuestions = 0;

/** True once a phase has failed for sure (UDP may lose up to 1% in the kernel: see below). */
const givingUp = (unanswered: number, udpSent: number) =>
  crashes.length > 0 || unanswered > Math.max(GIVE_UP_UNANSWERED, udpSent / 100);

/** Moves the fake upstream's log into `findings`: it may only ever see allowed names. */
function checkUpstream(findings: Findings): void {
  for (const question of upstream.log) {
    upstreamQuestions++;
    if (!isAllowedName(question.name.toLowerCase()))
      findings.add(
        `the upstream was asked for a name the policy denies (${question.name})`,
        { kind: 'upstream-question', bytes: Buffer.from(question.name) },
        question.transport,
      );
  }
  upstream.log.length = 0;
}

/** Messages the interceptor has counted for a transport (every path counts exactly once). */
async function counted(transport: 'udp' | 'tcp'): Promise<number> {
  const { values } = await metrics.dnsQueries.get();
  return values
    .filter((v) => v.labels.transport === transport)
    .reduce((sum, v) => sum + v.value, 0);
}

const report = (findings: Findings) => [`seed ${SEED}`, ...findings.list];

beforeAll(async () => {
  process.on('uncaughtException', onUncaught);
  process.on('unhandledRejection', onUnhandled);
  upstream = await new FakeDns(zone).start();
  // The clock stands still: a finite bucket would turn most of the run into rate-limit refusals.
  harness = await startInterceptor(upstream.port, { timeoutMs: 400, rateLimit: 1_000_000_000 });
  ({ metrics, interceptor: dns, port } = harness);
  const table = harness.table;
  const source = parseIP(SOURCE);
  if (!source.ok) throw new Error(source.error);
  table.register(SANDBOX, { sourceAddress: source.value, egressSecret: 'fuzz' }, allowTestPolicy());
});

afterAll(async () => {
  await harness?.stop();
  await upstream?.stop();
  process.off('uncaughtException', onUncaught);
  process.off('unhandledRejection', onUnhandled);
});

describe('DNS interceptor fuzz', () => {
  it(`answer() survives ${DIRECT_PACKETS} hostile messages and answers each one correctly`, async () => {
    const rng = new Rng(SEED);
    const findings = new Findings();
    const sweep = truncationSweep(rng);
    const deadline = performance.now() + PHASE_BUDGET_MS;
    let done = 0;
    const one = async (packet: GeneratedPacket) => {
      const roll = rng.int(10);
      const source = roll < 8 ? SOURCE : rng.pick(WEIRD_SOURCES);
      const transport = rng.bool(0.7) ? 'udp' : 'tcp';
      const where = `answer(${transport}, ${JSON.stringify(source)})`;
      let reply: Buffer | undefined;
      try {
        reply = await dns.answer(packet.bytes, source, transport);
      } catch (error) {
        findings.add(`answer() rejected: ${(error as Error).message}`, packet, where);
        return;
      }
      if (reply === undefined) {
        if (deservesReply(packet.bytes)) findings.add('no answer to a query', packet, where);
        return;
      }
      const context = { transport, knownSource: source === SOURCE } as const;
      for (const problem of replyProblems(packet.bytes, reply, context))
        findings.add(problem, packet, where);
    };
    for (let batch = 0; done < DIRECT_PACKETS && performance.now() < deadline; batch++) {
      const pending: Promise<void>[] = [];
      for (let i = 0; i < 500 && done < DIRECT_PACKETS; i++, done++)
        pending.push(one(sweep[done] ?? generatePacket(rng)));
      await Promise.all(pending);
      if (batch % 20 === 0) checkUpstream(findings);
    }
    checkUpstream(findings);
    expect(crashes).toEqual([]);
    expect(report(findings)).toEqual([`seed ${SEED}`]);
    expect(done, `seed ${SEED}: only ${done} messages within the time budget`).toBe(DIRECT_PACKETS);
  }, 120_000);

  it(`UDP: ${UDP_SANDBOX_PACKETS} messages from the sandbox and ${UDP_UNKNOWN_PACKETS} from an unknown source`, async () => {
    const rng = new Rng(SEED ^ 0x5555);
    const findings = new Findings();
    const deadline = performance.now() + PHASE_BUDGET_MS;
    const before = await counted('udp');
    const sandbox = await udpFuzz(SOURCE, true, UDP_SANDBOX_PACKETS, rng, findings, deadline);
    const unknown = await udpFuzz(UNKNOWN, false, UDP_UNKNOWN_PACKETS, rng, findings, deadline);
    checkUpstream(findings);
    const sent = sandbox.sent + unknown.sent;
    const missing = sandbox.missing + unknown.missing;
    // Loopback UDP can still drop when a socket buffer is full. Such drops are told apart from a
    // silent interceptor by its own counter: every message it reads is counted once.
    const lostInKernel = sent - ((await counted('udp')) - before);
    expect(crashes).toEqual([]);
    expect(report(findings)).toEqual([`seed ${SEED}`]);
    expect(missing, 'queries the interceptor read but never answered').toBeLessThanOrEqual(
      lostInKernel,
    );
    expect(lostInKernel, 'UDP datagrams the kernel dropped').toBeLessThanOrEqual(sent / 100);
    expect(sent, `seed ${SEED}: UDP sent within the time budget`).toBe(
      UDP_SANDBOX_PACKETS + UDP_UNKNOWN_PACKETS,
    );
  }, 120_000);

  it('TCP: pipelined sessions, garbage lengths, partial frames and connections closed mid-frame', async () => {
    const rng = new Rng(SEED ^ 0xaaaa);
    const findings = new Findings();
    const deadline = performance.now() + PHASE_BUDGET_MS;
    const plans: Array<() => Promise<TcpResult>> = [];
    for (let i = 0; i < TCP_SESSIONS; i++) {
      const knownSource = i % 6 !== 5;
      const plan = pipelinedPlan(rng);
      plans.push(() => runTcp(knownSource ? SOURCE : UNKNOWN, knownSource, plan, findings));
    }
    for (let i = 0; i < TCP_HOSTILE_STREAMS; i++) {
      const knownSource = i % 4 !== 3;
      const plan = hostilePlan(rng);
      plans.push(() => runTcp(knownSource ? SOURCE : UNKNOWN, knownSource, plan, findings));
    }
    const results: TcpResult[] = [];
    let next = 0;
    const worker = async () => {
      const unanswered = () => results.reduce((sum, r) => sum + r.missing, 0);
      while (next < plans.length && performance.now() < deadline && !givingUp(unanswered(), 0)) {
        const plan = plans[next++]!;
        results.push(await plan());
      }
    };
    await Promise.all(Array.from({ length: 12 }, worker));
    checkUpstream(findings);
    const headerSized = results.reduce((sum, r) => sum + r.headerSized, 0);
    const unanswered = results
      .filter((r) => r.missing > 0 && !r.trickled)
      .map((r) => `${r.kind} ${r.missing}`);
    const trickled = results.filter((r) => r.trickled).length;
    if (trickled > 0) console.log(`${trickled} paced sessions took the trickle deadline or longer`);
    expect(crashes).toEqual([]);
    expect(report(findings)).toEqual([`seed ${SEED}`]);
    expect(unanswered, `seed ${SEED}: TCP sessions with unanswered queries`).toEqual([]);
    // Every pipelined session (they go first), however busy the host: quiet, all the sessions
    // run in a few seconds; beside two busy loops about a third did, and at load 8 a tenth in
    // 40 s. Each session that ran was checked above.
    if (results.length < plans.length)
      console.log(`${results.length} of ${plans.length} TCP sessions ran within the time budget`);
    expect(
      results.length,
      `seed ${SEED}: TCP sessions run within the time budget`,
    ).toBeGreaterThanOrEqual(TCP_SESSIONS);
    expect(headerSized).toBeGreaterThanOrEqual(10_000);
  }, 120_000);

  it('still answers valid queries correctly afterwards, and nothing threw', async () => {
    const findings = new Findings();
    const RCODES = ['NOERROR', 'FORMERR', 'SERVFAIL', 'NXDOMAIN', 'NOTIMP', 'REFUSED'];
    /** Judges a reply with the oracle, then reads what the assertions below need. */
    const check = (query: Buffer, reply: Buffer | undefined, transport: 'udp' | 'tcp') => {
      expect(reply, `a ${transport} reply`).toBeDefined();
      const raw = reply!;
      for (const problem of replyProblems(query, raw, { transport, knownSource: true }))
        findings.add(problem, { kind: 'final', bytes: query }, transport);
      let packet: dnsPacket.DecodedPacket | undefined;
      try {
        packet = dnsPacket.decode(raw);
      } catch {
        // replyProblems has recorded why.
      }
      return {
        id: raw.readUInt16BE(0),
        rcode: RCODES[raw.readUInt16BE(2) & 0xf],
        truncated: (raw.readUInt16BE(2) & 0x0200) !== 0,
        addresses: (packet?.answers ?? [])
          .map((r) => String((r as { data?: unknown }).data))
          .sort(),
        additionals: (packet?.additionals ?? []).map((r) => r.type),
      };
    };

    const a = encodeQuery('api.allowed.test', 'A', { id: 777 });
    const udp = check(a, (await udpExchange(port, a, SOURCE))?.raw, 'udp');
    expect(udp).toMatchObject({ id: 777, rcode: 'NOERROR', truncated: false });
    expect(udp.addresses).toEqual(['93.184.216.7', '93.184.216.8']);

    const edns = encodeQuery('api.allowed.test', 'AAAA', { id: 778, edns: 1232 });
    const ednsUdp = check(edns, (await udpExchange(port, edns, SOURCE))?.raw, 'udp');
    expect(ednsUdp).toMatchObject({ id: 778, rcode: 'NOERROR', additionals: ['OPT'] });
    expect(ednsUdp.addresses).toEqual(['2606:2800:220:1::7']);

    // 60 uncompressed A records do not fit 512 bytes: TC over UDP, the whole answer over TCP.
    const big = encodeQuery('big.allowed.test', 'A', { id: 779 });
    const bigUdp = check(big, (await udpExchange(port, big, SOURCE))?.raw, 'udp');
    expect(bigUdp).toMatchObject({ id: 779, rcode: 'NOERROR', truncated: true });

    const queries = [big, encodeQuery('secret.denied.test', 'A', { id: 780 })];
    const replies = await tcpExchange(port, queries, SOURCE);
    expect(replies).toHaveLength(2);
    const byId = new Map(replies.map((r) => [r.readUInt16BE(0), r]));
    const bigTcp = check(queries[0]!, byId.get(779), 'tcp');
    expect(bigTcp).toMatchObject({ rcode: 'NOERROR', truncated: false });
    expect(bigTcp.addresses).toHaveLength(60);
    const denied = check(queries[1]!, byId.get(780), 'tcp');
    expect(denied).toMatchObject({ rcode: 'NXDOMAIN', addresses: [] });

    checkUpstream(findings);
    expect(upstreamQuestions).toBeGreaterThan(0);
    expect(report(findings)).toEqual([`seed ${SEED}`]);
    expect(crashes).toEqual([]);
  });
});

/** Sends `count` generated messages from `source` over UDP, a fresh socket per 50,000. */
async function udpFuzz(
  source: string,
  knownSource: boolean,
  count: number,
  rng: Rng,
  findings: Findings,
  deadline: number,
): Promise<{ sent: number; missing: number }> {
  let sent = 0;
  let missing = 0;
  while (sent < count && performance.now() < deadline && !givingUp(missing, sent)) {
    const part = Math.min(50_000, count - sent);
    const run = await udpSocketFuzz(source, knownSource, part, rng, findings, deadline);
    sent += run.sent;
    missing += run.missing;
  }
  return { sent, missing };
}

/** Sends up to `count` messages over one UDP socket, in paced batches, matching replies by ID. */
async function udpSocketFuzz(
  source: string,
  knownSource: boolean,
  count: number,
  rng: Rng,
  findings: Findings,
  deadline: number,
): Promise<{ sent: number; missing: number }> {
  const BATCH = 256;
  const CHUNK = 32;
  const socket = dgram.createSocket({ type: 'udp4', recvBufferSize: 4 << 20 });
  socket.on('error', (error) =>
    findings.add(
      `UDP client socket error: ${error.message}`,
      { kind: '-', bytes: Buffer.alloc(0) },
      source,
    ),
  );
  await new Promise<void>((resolve) => socket.bind(0, source, resolve));
  // IDs are rewritten to a counter so every reply finds its message (at most 65,536 per socket).
  const inFlight = new Map<number, { packet: GeneratedPacket; batch: number; answered: boolean }>();
  let batch = 0;
  let waiting = 0;
  let wake: (() => void) | undefined;
  socket.on('message', (reply) => {
    const entry = reply.length >= 2 ? inFlight.get(reply.readUInt16BE(0)) : undefined;
    if (entry === undefined) {
      findings.add('a UDP reply to no message sent', { kind: 'reply', bytes: reply }, source);
      return;
    }
    if (entry.answered) {
      findings.add('two UDP replies to one message', entry.packet, `udp from ${source}`);
      return;
    }
    entry.answered = true;
    for (const problem of replyProblems(entry.packet.bytes, reply, {
      transport: 'udp',
      knownSource,
    }))
      findings.add(problem, entry.packet, `udp from ${source}`);
    if (entry.batch === batch && deservesReply(entry.packet.bytes) && --waiting === 0) wake?.();
  });
  let sent = 0;
  let missing = 0;
  let id = 0;
  try {
    for (; sent < count && performance.now() < deadline && !givingUp(missing, sent); batch++) {
      waiting = 0;
      for (let i = 0; i < BATCH && sent < count; i++, sent++) {
        const generated = generatePacket(rng);
        const bytes = Buffer.from(generated.bytes);
        if (bytes.length >= 2) {
          bytes.writeUInt16BE(id, 0);
          inFlight.set(id, { packet: { kind: generated.kind, bytes }, batch, answered: false });
          id = (id + 1) & 0xffff;
        }
        if (deservesReply(bytes)) waiting++;
        socket.send(bytes, port, '127.0.0.1');
        if (i % CHUNK === CHUNK - 1) await tick();
      }
      if (waiting > 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, 1000);
          wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        wake = undefined;
      }
      missing += Math.max(0, waiting);
    }
    // Late or stray replies to the last batch.
    await new Promise((resolve) => setTimeout(resolve, 50));
  } finally {
    await new Promise<void>((resolve) => socket.close(() => resolve()));
  }
  return { sent, missing };
}

interface TcpPlan {
  readonly kind: string;
  /** What to write, one socket.write each. */
  readonly writes: readonly Buffer[];
  /** Yield to the event loop between writes (makes the server see fragments). */
  readonly pace: boolean;
  /** Wait for the answer to every complete query in the stream before closing. */
  readonly wait: boolean;
  readonly close: 'destroy' | 'reset';
}

interface TcpResult {
  readonly kind: string;
  readonly messages: number;
  /** Messages of at least a header's length. */
  readonly headerSized: number;
  readonly missing: number;
  /**
   * Its writes took TCP_MESSAGE_TIMEOUT_MS or longer (a paced session on a loaded host): the
   * interceptor may rightly have closed it as a trickle, so what went unanswered is no finding.
   */
  readonly trickled: boolean;
}

/** Chops a byte stream into writes: whole, per frame, or at random places. */
function chop(rng: Rng, frames: readonly Buffer[]): { writes: Buffer[]; pace: boolean } {
  const stream = Buffer.concat(frames);
  switch (rng.int(3)) {
    case 0:
      return { writes: [stream], pace: false };
    case 1:
      return { writes: [...frames], pace: rng.bool(0.3) };
    default: {
      const writes: Buffer[] = [];
      for (let at = 0; at < stream.length;) {
        const size = rng.range(1, 1500);
        writes.push(stream.subarray(at, at + size));
        at += size;
      }
      return { writes, pace: true };
    }
  }
}

/** Many generated messages on one connection, correctly framed, pipelined. */
function pipelinedPlan(rng: Rng): TcpPlan {
  const frames: Buffer[] = [];
  for (let i = 0; i < TCP_MESSAGES_PER_SESSION; i++) {
    const bytes = Buffer.from(generatePacket(rng).bytes);
    if (bytes.length >= 2) bytes.writeUInt16BE(i, 0);
    frames.push(frame(bytes));
  }
  return { kind: 'pipelined', ...chop(rng, frames), wait: true, close: 'destroy' };
}

const validFrame = (rng: Rng) => frame(validQuery(rng));
const allowedFrame = (id: number) =>
  frame(buildQuery({ id, name: wireName('api.allowed.test'), type: 1 }));

/** A stream that lies about lengths, stops mid-frame, or is not DNS at all. */
function hostilePlan(rng: Rng): TcpPlan {
  const close = rng.bool(0.3) ? 'reset' : 'destroy';
  const frames = (n: number) => Array.from({ length: n }, () => validFrame(rng));
  switch (rng.int(10)) {
    case 0:
      return {
        kind: 'random-stream',
        writes: [rng.bytes(rng.range(1, 3000))],
        pace: false,
        wait: true,
        close,
      };
    case 1: {
      // Frames whose length prefixes are sometimes wrong: the stream desynchronises.
      const lying = Array.from({ length: rng.range(5, 60) }, () => {
        const f = Buffer.from(frame(generatePacket(rng).bytes));
        if (rng.bool(0.2))
          f.writeUInt16BE(
            rng.bool() ? rng.int(65536) : Math.max(0, f.length - 2 + rng.range(-5, 5)),
            0,
          );
        return f;
      });
      return { kind: 'lying-lengths', ...chop(rng, lying), wait: true, close };
    }
    case 2: {
      // Complete queries, then a frame that never completes: the complete ones are answered.
      const partial = validFrame(rng);
      const writes = [
        ...frames(rng.range(0, 20)),
        partial.subarray(0, rng.range(1, partial.length - 1)),
      ];
      return { kind: 'partial-frame', writes, pace: rng.bool(), wait: true, close };
    }
    case 3:
      return {
        kind: 'one-byte',
        writes: [Buffer.from([rng.int(256)])],
        pace: false,
        wait: false,
        close,
      };
    case 4:
      return {
        kind: 'max-length-then-close',
        writes: [Buffer.from([0xff, 0xff]), rng.bytes(rng.int(65535))],
        pace: true,
        wait: false,
        close,
      };
    case 5:
      return {
        kind: 'zero-length-frames',
        writes: [Buffer.alloc(2 * rng.range(1, 5000)), allowedFrame(rng.int(65536))],
        pace: rng.bool(),
        wait: true,
        close,
      };
    case 6: {
      // One byte per write: the server sees every fragment separately.
      const stream = Buffer.concat([validFrame(rng), allowedFrame(rng.int(65536))]);
      const writes = Array.from({ length: stream.length }, (_, i) => stream.subarray(i, i + 1));
      return { kind: 'byte-at-a-time', writes, pace: true, wait: true, close };
    }
    case 7: {
      // The largest frame there is: a valid query, then junk up to 65,535 bytes.
      const query = validQuery(rng);
      const body = Buffer.concat([query, rng.bytes(65535 - query.length)]);
      return { kind: 'giant-frame', writes: [frame(body)], pace: false, wait: true, close };
    }
    case 8:
      return {
        kind: 'close-after-queries',
        writes: [Buffer.concat(frames(rng.range(1, 80)))],
        pace: false,
        wait: false,
        close,
      };
    default: {
      const stream = Buffer.concat(frames(rng.range(1, 10)));
      return {
        kind: 'close-mid-frame',
        writes: [stream.subarray(0, rng.range(1, stream.length - 1))],
        pace: false,
        wait: false,
        close,
      };
    }
  }
}

/** Runs one TCP connection to the plan; checks every framed reply against its query. */
function runTcp(
  source: string,
  knownSource: boolean,
  plan: TcpPlan,
  findings: Findings,
): Promise<TcpResult> {
  const messages = splitFrames(Buffer.concat(plan.writes));
  const byId = new Map<number, Buffer[]>();
  for (const message of messages) {
    if (message.length < 2) continue;
    const id = message.readUInt16BE(0);
    byId.set(id, [...(byId.get(id) ?? []), message]);
  }
  const expected = plan.wait ? messages.filter(deservesReply).length : 0;
  const where = `tcp ${plan.kind} from ${source}`;
  return new Promise((resolve) => {
    const socket = net.connect({ host: '127.0.0.1', port, localAddress: source });
    socket.setNoDelay(true);
    let buffered: Buffer = Buffer.alloc(0);
    let replies = 0;
    let finished = false;
    /** How long the writes have taken so far (ms). */
    let writing = 0;
    const finish = () => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      if (plan.close === 'reset' && !socket.destroyed) socket.resetAndDestroy();
      else socket.destroy();
      resolve({
        kind: plan.kind,
        messages: messages.length,
        headerSized: messages.filter((m) => m.length >= 12).length,
        missing: plan.wait ? Math.max(0, expected - replies) : 0,
        trickled: writing >= TCP_MESSAGE_TIMEOUT_MS,
      });
    };
    const timer = setTimeout(finish, 3000);
    // Resets and broken pipes are what some plans are for.
    socket.on('error', () => {});
    socket.on('close', finish);
    socket.on('data', (chunk: Buffer) => {
      buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
      while (buffered.length >= 2 && buffered.length >= 2 + buffered.readUInt16BE(0)) {
        const reply = buffered.subarray(2, 2 + buffered.readUInt16BE(0));
        buffered = buffered.subarray(2 + reply.length);
        replies++;
        const candidates = reply.length >= 2 ? byId.get(reply.readUInt16BE(0)) : undefined;
        if (candidates === undefined || candidates.length === 0) {
          findings.add('a TCP reply to no message sent', { kind: plan.kind, bytes: reply }, where);
          continue;
        }
        // IDs can repeat in a random stream: the reply must suit one of the messages with its ID.
        const judged = candidates.map((query) =>
          replyProblems(query, reply, { transport: 'tcp', knownSource }),
        );
        const fit = judged.findIndex((problems) => problems.length === 0);
        const index = Math.max(fit, 0);
        for (const problem of judged[index]!)
          findings.add(problem, { kind: plan.kind, bytes: candidates[index]! }, where);
        candidates.splice(index, 1);
      }
      if (plan.wait && expected > 0 && replies >= expected) finish();
    });
    socket.on('connect', async () => {
      const began = performance.now();
      for (const write of plan.writes) {
        if (socket.destroyed) return;
        socket.write(write);
        if (plan.pace) await tick();
        writing = performance.now() - began;
      }
      // The answers get the whole budget from the last write, however long the writes took.
      timer.refresh();
      if (!plan.wait) {
        await tick();
        finish();
      } else if (expected === 0) {
        // Nothing deserves an answer: give a stray reply a moment to show up, then go.
        setTimeout(finish, 20);
      }
    });
  });
}
