import dnsPacket from 'dns-packet';
import dnsPacketTypes from 'dns-packet/types.js';
import { type IPAddress, parseIP } from '../policy/index.js';
import { type UpstreamClient, UpstreamError } from './upstream.js';
import { RCODE, replyFramingProblem, ttlOffsets } from './wire.js';

/** A record as dns-packet decodes it (OPT never appears in the sections we keep). */
type DecodedRecord = {
  name: string;
  type: string;
  class?: string;
  /** dns-packet's reading of class bit 15 (mDNS cache-flush): never set in unicast IN data. */
  flush?: boolean;
  ttl?: number;
  data?: unknown;
};

/**
 * One upstream answer, kept in the form that is cheapest to hand out again: an encoded
 * template (ID 0, lower-case question, no additional section) whose TTLs and ID are patched
 * per client, plus the address records that policy must check per sandbox.
 */
export interface CachedAnswer {
  readonly rcode: number;
  readonly template: Buffer;
  readonly offsets: readonly number[];
  /** TTL of each answer and authority record when stored (sanitised and capped). */
  readonly ttls: readonly number[];
  /** A/AAAA records of the answer section, by record index. */
  readonly addresses: ReadonlyArray<{ readonly index: number; readonly ip: IPAddress }>;
  readonly answers: readonly DecodedRecord[];
  readonly authorities: readonly DecodedRecord[];
  readonly storedAt: number;
  readonly expiresAt: number;
}

export interface AnswerCacheOptions {
  readonly capacity: number;
  /** Cap on any TTL handed out or cached, seconds. */
  readonly maxTtl: number;
  /** Cap on negative caching (RFC 2308 suggests hours at most), seconds. */
  readonly maxNegativeTtl: number;
  /** A steady clock in milliseconds. */
  readonly now: () => number;
  readonly onLookup?: (hit: boolean) => void;
}

/** RFC 2181 section 8: a TTL with the top bit set is read as 0. */
const sanitiseTtl = (ttl: number | undefined, cap: number) =>
  ttl === undefined || ttl >= 2 ** 31 ? 0 : Math.min(ttl, cap);

const sameName = (a: string, b: string) => a.toLowerCase() === b.toLowerCase();

/**
 * Keeps answer records that belong to the question: owned by the name or by a CNAME target
 * reached from it, class IN exactly. Authority keeps only SOA (negative caching). Glue and other
 * additional data are dropped: nothing we did not ask about reaches a sandbox.
 */
function relevantRecords(
  name: string,
  packet: dnsPacket.Packet,
): { answers: DecodedRecord[]; authorities: DecodedRecord[] } {
  const chain = [name];
  const answers: DecodedRecord[] = [];
  for (const record of (packet.answers ?? []) as DecodedRecord[]) {
    if (record.class !== 'IN' || record.flush === true) continue;
    if (!chain.some((n) => sameName(n, record.name))) continue;
    answers.push(record);
    if (record.type === 'CNAME' && chain.length < 16) chain.push(String(record.data));
  }
  const authorities = ((packet.authorities ?? []) as DecodedRecord[]).filter(
    (record) => record.type === 'SOA',
  );
  return { answers, authorities };
}

/** Builds the cache entry (and its template) for a set of records. Throws when it cannot encode. */
export function buildAnswer(
  name: string,
  type: number,
  rcode: number,
  records: { answers: readonly DecodedRecord[]; authorities: readonly DecodedRecord[] },
  ttls: readonly number[],
  storedAt: number,
  lifetimeSeconds: number,
): CachedAnswer {
  const withTtls = records.answers.map((r, i) => ({ ...r, ttl: ttls[i] }));
  const authorityRecords = records.authorities.map((r, i) => ({
    ...r,
    ttl: ttls[records.answers.length + i],
  }));
  const template = dnsPacket.encode({
    type: 'response',
    id: 0,
    flags: rcode,
    questions: [{ name, type: typeName(type), class: 'IN' }],
    answers: withTtls as dnsPacket.Answer[],
    authorities: authorityRecords as dnsPacket.Answer[],
  });
  const offsets = ttlOffsets(template);
  if (offsets === undefined || offsets.length !== ttls.length)
    throw new UpstreamError('re-encoded answer does not walk');
  // What clients will read must be what was checked. dns-packet reads a label holding "." as
  // two labels and one holding bytes over 0x7f as UTF-8, so some names do not encode back to
  // themselves, and a record boundary can move: such an answer is refused, not served.
  const reread = dnsPacket.decode(template);
  const same = (sent: readonly unknown[], back: readonly unknown[] | undefined) =>
    JSON.stringify(sent) === JSON.stringify(back ?? []);
  if (
    reread.questions?.[0]?.name !== name ||
    !same(withTtls, reread.answers) ||
    !same(authorityRecords, reread.authorities)
  )
    throw new UpstreamError('its names do not survive re-encoding');
  const addresses: Array<{ index: number; ip: IPAddress }> = [];
  records.answers.forEach((record, index) => {
    if (record.type !== 'A' && record.type !== 'AAAA') return;
    const ip = parseIP(String(record.data));
    // An address record whose data is no address would go out unchecked: the answer is refused.
    if (!ip.ok)
      throw new UpstreamError(`the ${record.type} record of ${record.name} holds no address`);
    addresses.push({ index, ip: ip.value });
  });
  return {
    rcode,
    template,
    offsets,
    ttls,
    addresses,
    answers: records.answers,
    authorities: records.authorities,
    storedAt,
    expiresAt: storedAt + lifetimeSeconds * 1000,
  };
}

const typeName = (type: number) => dnsPacketTypes.toString(type) as dnsPacket.RecordType;

/** A shared, TTL-respecting answer cache with in-flight coalescing and an LRU bound. */
export class AnswerCache {
  /** Insertion-ordered; `used` is the second-chance bit (set on a hit, cleared by eviction). */
  private readonly entries = new Map<string, { answer: CachedAnswer; used: boolean }>();
  private readonly inflight = new Map<string, Promise<CachedAnswer>>();

  constructor(
    private readonly upstream: UpstreamClient,
    private readonly options: AnswerCacheOptions,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  /** The answer for a question: cached, joined to an identical question in flight, or asked. */
  resolve(name: string, type: number): Promise<CachedAnswer> | CachedAnswer {
    const key = `${type} ${name}`;
    const cached = this.entries.get(key);
    if (cached !== undefined) {
      if (cached.answer.expiresAt > this.options.now()) {
        // A hit only marks the entry: reordering a large Map on every hit costs microseconds.
        cached.used = true;
        this.options.onLookup?.(true);
        return cached.answer;
      }
      this.entries.delete(key);
    }
    this.options.onLookup?.(false);
    const pending = this.inflight.get(key);
    if (pending !== undefined) return pending;
    const asked = this.ask(name, type).finally(() => this.inflight.delete(key));
    this.inflight.set(key, asked);
    return asked;
  }

  private async ask(name: string, type: number): Promise<CachedAnswer> {
    const reply = await this.upstream.query(name, type);
    const framing = replyFramingProblem(reply);
    if (framing !== undefined)
      throw new UpstreamError(`malformed upstream answer for ${name}: ${framing}`);
    let packet: dnsPacket.Packet;
    try {
      packet = dnsPacket.decode(reply);
    } catch (error) {
      throw new UpstreamError(
        `undecodable upstream answer for ${name}: ${(error as Error).message}`,
      );
    }
    const rcode = reply.readUInt16BE(2) & 0xf;
    const records = relevantRecords(name, packet);
    const { maxTtl, maxNegativeTtl } = this.options;
    const ttls = [...records.answers, ...records.authorities].map((r) =>
      sanitiseTtl(r.ttl, maxTtl),
    );
    let lifetime: number;
    // Positive only when a record of the asked type is there: a CNAME chain that ends in no
    // data is a negative answer (NODATA, RFC 2308 §2.2) and lives as one.
    const asked = typeName(type);
    if (rcode === RCODE.NOERROR && records.answers.some((record) => record.type === asked)) {
      lifetime = Math.min(...ttls.slice(0, records.answers.length));
    } else {
      // RFC 2308: a negative answer lives min(SOA TTL, SOA MINIMUM); without an SOA, not at all.
      const soa = records.authorities[0];
      const minimum = (soa?.data as { minimum?: number } | undefined)?.minimum;
      lifetime =
        soa === undefined
          ? 0
          : Math.min(sanitiseTtl(soa.ttl, maxNegativeTtl), sanitiseTtl(minimum, maxNegativeTtl));
      // A CNAME chain that led here may change sooner (RFC 2308 §5).
      lifetime = Math.min(lifetime, ...ttls.slice(0, records.answers.length));
      // The client caches the negative answer for the SOA's TTL: the same lifetime (RFC 2308 §3).
      if (soa !== undefined) ttls[records.answers.length] = lifetime;
    }
    let answer: CachedAnswer;
    try {
      answer = buildAnswer(name, type, rcode, records, ttls, this.options.now(), lifetime);
    } catch (error) {
      throw new UpstreamError(
        `cannot re-encode the upstream answer for ${name}: ${(error as Error).message}`,
      );
    }
    if (lifetime > 0 && (rcode === RCODE.NOERROR || rcode === RCODE.NXDOMAIN))
      this.store(`${type} ${name}`, answer);
    return answer;
  }

  /**
   * Second-chance eviction (CLOCK): the oldest entry goes, unless it was used since it was last
   * looked at, in which case it moves to the back with its bit cleared. Close to LRU, and
   * amortised O(1) since every entry is passed over at most once per eviction round.
   */
  private store(key: string, answer: CachedAnswer): void {
    this.entries.delete(key);
    for (
      let passes = 0;
      this.entries.size >= this.options.capacity && passes <= this.options.capacity;
      passes++
    ) {
      const [oldestKey, oldest] = this.entries.entries().next().value!;
      this.entries.delete(oldestKey);
      if (oldest.used) {
        oldest.used = false;
        this.entries.set(oldestKey, oldest);
      }
    }
    this.entries.set(key, { answer, used: false });
  }
}
