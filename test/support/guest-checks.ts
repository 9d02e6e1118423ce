/**
 * The checks every guest held behind a sandbox's namespace passes, whatever joins it there (a
 * routed subnet, or tc redirection below the IP stack): one copy for test/netns/guest-behind and
 * test/netns/guest-redirect.
 */
import { expect } from 'vitest';
import type { ApiClient } from './api-client.js';
import { type World, WORLD_PORTS } from '../../bench/lib/world.js';
import type { FakeDns } from './fake-dns.js';
import { DNS, get, type GuestBehind, tcpEcho, text, udpEcho } from './guest-behind.js';

/**
 * The guest's DNS, sent to `deniedIp` as its resolver, is answered by Moat's interceptor: the
 * allowed name by the upstream (`upstream`, the tests' fake DNS), NXDOMAIN for the denied one;
 * the resolver it was sent to never sees either.
 */
export async function expectDnsHeldByMoat(
  guest: GuestBehind,
  deniedIp: string,
  world: World,
  upstream: FakeDns,
): Promise<void> {
  const asked = await guest.run(
    `${DNS}\nfor name in ('allowed.test', 'denied.test'): print(ask('${deniedIp}', name)[1])`,
  );
  expect(asked.out, asked.err).toBe('0 1\n3 0\n');
  expect(world.seen('dns-udp')).toEqual([]);
  expect(upstream.log.map((q) => q.name)).toContain('allowed.test');
  expect(upstream.log.map((q) => q.name)).not.toContain('denied.test');
}

/**
 * The guest reaches allowed.test (web by its Host, other TCP by the address it learned) and
 * the allowed `cidrIp` over TCP, and over UDP too when `udp`.
 */
export async function expectAllowedReached(
  guest: GuestBehind,
  cidrIp: string,
  { udp }: { udp: boolean },
): Promise<void> {
  const learned = `${DNS}\nip = resolve('${guest.router}', 'allowed.test')\n`;
  const web = await guest.run(learned + get('ip', 'allowed.test'));
  expect(web.out, web.err).toBe('world http host=allowed.test\n');
  const echo = await guest.run(learned + tcpEcho('ip', WORLD_PORTS.echo));
  expect(echo.out, echo.err).toBe('ping\n');
  expect((await guest.run(tcpEcho(text(cidrIp), WORLD_PORTS.echo))).out).toBe('ping\n');
  if (udp) expect((await guest.run(udpEcho(cidrIp, WORLD_PORTS.udpEcho))).out).toBe('pong\n');
}

/**
 * The guest's direct TCP to the allowed `cidrIp` and to the denied `deniedIp` (a port no web
 * redirect takes) is recorded under `sandboxID`, once each: allowed and denied.
 */
export async function expectDirectRecords(
  guest: GuestBehind,
  api: ApiClient,
  sandboxID: string,
  { cidrIp, deniedIp }: { cidrIp: string; deniedIp: string },
): Promise<void> {
  const port = WORLD_PORTS.udpTalk;
  const since = new Date().toISOString();
  await guest.run(tcpEcho(text(cidrIp), port));
  await guest.run(tcpEcho(text(deniedIp), port));
  const direct = async () =>
    (
      (await api.call('GET', `/flows?sandboxID=${sandboxID}&kind=direct&since=${since}&limit=100`))
        .body as Array<{ verdict: string; destination: { address: string; port: number } }>
    )
      .filter((r) => r.destination.port === port)
      .map((r) => [r.verdict, r.destination.address]);
  const deadline = Date.now() + 3000;
  while ((await direct()).length < 2 && Date.now() < deadline)
    await new Promise((resolve) => setTimeout(resolve, 50));
  expect((await direct()).sort()).toEqual(
    [
      ['allow', cidrIp],
      ['deny', deniedIp],
    ].sort(),
  );
}
