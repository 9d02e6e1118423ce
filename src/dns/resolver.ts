import type { CanonicalName, IPAddress } from '../policy/index.js';
import type { AnswerCache, CachedAnswer } from './cache.js';
import { RCODE, TYPE } from './wire.js';

/**
 * Moat's own name resolution (for the proxy): the same upstreams and shared cache the
 * interceptor uses, so a name resolves the same way for Moat as for the sandbox.
 */
export class HostResolver {
  constructor(private readonly cache: AnswerCache) {}

  /** IPv4 addresses first, then IPv6. Rejects only when both lookups failed outright. */
  async lookup(name: CanonicalName): Promise<IPAddress[]> {
    const v4 = this.cache.resolve(name, TYPE.A);
    const v6 = this.cache.resolve(name, TYPE.AAAA);
    // Both cached (the usual case for a proxy): no promise to settle.
    if (!(v4 instanceof Promise) && !(v6 instanceof Promise)) return [...usable(v4), ...usable(v6)];
    const results = await Promise.allSettled([v4, v6]);
    const addresses: IPAddress[] = [];
    const failures: string[] = [];
    for (const result of results) {
      if (result.status === 'rejected') failures.push((result.reason as Error).message);
      else addresses.push(...usable(result.value));
    }
    if (addresses.length === 0 && failures.length === results.length) throw new Error(failures[0]);
    return addresses;
  }
}

function usable(answer: CachedAnswer): IPAddress[] {
  return answer.rcode === RCODE.NOERROR ? answer.addresses.map((a) => a.ip) : [];
}
