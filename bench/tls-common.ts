/**
 * Shared pieces of `npm run bench:tls`: the names every process agrees on, the origin's
 * address, and the jobs the load client takes over IPC.
 */
import type { HostPort } from '../src/net/index.js';

/** The domain of the benchmark; a name below `bump.` has a header rule, below `tunnel.` none. */
const DOMAIN = 'tls-bench.test';
/** The name intercepted flows go to (Moat: a header rule; squid: ssl_bump bump). */
export const BUMP_NAME = `api.bump.${DOMAIN}`;
/** The name opaque tunnels go to (Moat: no rule; squid: ssl_bump splice). */
export const TUNNEL_NAME = `api.tunnel.${DOMAIN}`;
/** Every intercepted name ends so (Moat's rule key is `*` and this). */
export const BUMP_SUFFIX = `.bump.${DOMAIN}`;
export const TUNNEL_SUFFIX = `.tunnel.${DOMAIN}`;
/** The origin listens here (loopback; beside bench:proxy's 127.0.0.20). */
export const ORIGIN_IP = '127.0.0.21';
export const BENCH_SANDBOX_ID = 'itlsbench00000000001';
export const BENCH_SECRET = 'bench-tls-egress-secret';
/** What both proxies add to every intercepted request (Moat from a stored secret `token`). */
export const INJECTED_HEADER = 'Authorization';
export const INJECTED_PREFIX = 'Bearer ';
export const INJECTED_SECRET = 'x';
/** The origin's answer says in this header whether it saw the injected value. */
export const SEEN_HEADER = 'x-injected';

/** The `count` names that round `round` mints leaves for (first sight), each once. */
export function mintNames(round: number, count: number): string[] {
  return Array.from({ length: count }, (_, i) => `r${round}n${i}${BUMP_SUFFIX}`);
}

/** Whose certificates the client trusts: the proxies' CA (intercepted) or the origin's. */
export type Trust = 'proxy' | 'origin';

export type TlsJob =
  | {
      /**
       * New connections, one GET each (Connection: close): `concurrency` workers in a loop for
       * `seconds` over `names` in turn, or, `once`, each name exactly once (`seconds` caps it).
       */
      readonly type: 'connections';
      readonly proxy: HostPort;
      readonly names: readonly string[];
      readonly once: boolean;
      readonly trust: Trust;
      readonly concurrency: number;
      readonly seconds: number;
    }
  | {
      /** `connections` keep-alive connections to `name`, GETs back to back for `seconds`. */
      readonly type: 'keepalive';
      readonly proxy: HostPort;
      readonly name: string;
      readonly trust: Trust;
      readonly connections: number;
      readonly seconds: number;
    }
  | {
      /** One connection, one GET: the answer's head (the correctness check). */
      readonly type: 'check';
      readonly proxy: HostPort;
      readonly name: string;
      readonly trust: Trust;
    };

export interface CheckResult {
  readonly head?: string;
  readonly error?: string;
}
