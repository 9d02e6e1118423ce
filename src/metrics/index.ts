/**
 * Every Prometheus metric Moat exports, defined in one place on one registry per server.
 * Labels are bounded sets; nothing is labelled by sandbox ID or destination.
 */
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';

export type DnsVerdict = 'forwarded' | 'blocked' | 'refused' | 'formerr' | 'servfail' | 'dropped';

export class MoatMetrics {
  readonly registry = new Registry();
  private learnedCount: () => number = () => 0;

  readonly dnsQueries = new Counter({
    name: 'moat_dns_queries_total',
    help: 'DNS queries answered by the interceptor, by transport and verdict',
    labelNames: ['transport', 'verdict'] as const,
    registers: [this.registry],
  });

  readonly dnsCacheLookups = new Counter({
    name: 'moat_dns_cache_lookups_total',
    help: 'Answer cache lookups, by result (hit or miss)',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });

  readonly dnsUpstreamDuration = new Histogram({
    name: 'moat_dns_upstream_duration_seconds',
    help: 'Time an upstream resolver took to answer',
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2],
    registers: [this.registry],
  });

  readonly dnsLearnedAddresses: Gauge = new Gauge({
    name: 'moat_dns_learned_addresses',
    help: 'Addresses learned from DNS answers and currently allowed, over all sandboxes',
    registers: [this.registry],
    collect: (): void => this.dnsLearnedAddresses.set(this.learnedCount()),
  });

  constructor(options: { defaultMetrics?: boolean } = {}) {
    if (options.defaultMetrics !== false)
      collectDefaultMetrics({ register: this.registry, prefix: 'moat_' });
  }

  /** Where the learned-address gauge reads its value at scrape time. */
  countLearnedWith(count: () => number): void {
    this.learnedCount = count;
  }
}
