import type { CanonicalName, IPAddress } from '../policy/index.js';
import type { AnswerCache } from './cache.js';
import { RCODE, TYPE } from './wire.js';

/**
 * Moat's own name resolution (for the proxy): the same upstreams and shared cache the
 * interceptor uses, so a name resolves the same way for Moat as for the sandbox.
 */
export class HostResolver {
  constructor(private readonly cache: AnswerCache) {}

  /** IPv4 addresses first, then IPv6. Rejects only when both lookups failed outright. */
  async lookup(name: CanonicalName): Promise<IPAddress[]> {
    const results = await Promise.allSettled([
      this.cache.resolve(name, TYPE.A),
      this.cache.resolve(name, TYPE.AAAA),
    ]);
    const addresses: IPAddress[] = [];
    const failures: string[] = [];
    for (const result of results) {
      if (result.status === 'rejected') failures.push((result.reason as Error).message);
      else if (result.value.rcode === RCODE.NOERROR)
        addresses.push(...result.value.addresses.map((a) => a.ip));
    }
    if (addresses.length === 0 && failures.length === results.length) throw new Error(failures[0]);
    return addresses;
  }
}
