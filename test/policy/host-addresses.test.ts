import { describe, expect, it } from 'vitest';
import { compileHostAddresses, parseCIDR, parseIP } from '../../src/policy/index.js';

const ip = (text: string) => {
  const parsed = parseIP(text);
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.value;
};
const pool = parseCIDR('10.213.0.0/16');
if (!pool.ok) throw new Error(pool.error);

/** A host as os.networkInterfaces() lists one in namespace mode. */
const HOST = compileHostAddresses(
  [
    { address: '127.0.0.1', prefixLength: 8, loopback: true },
    { address: '::1', prefixLength: 128, loopback: true },
    { address: '10.213.0.1', prefixLength: 32, loopback: true },
    { address: '198.18.7.1', prefixLength: 24, loopback: false },
    { address: '2001:db8:7::1', prefixLength: 64, loopback: false },
    { address: 'fe80::1%eth0', prefixLength: 64, loopback: false },
    { address: '10.213.0.5', prefixLength: 30, loopback: false },
  ],
  { sandboxLinks: pool.value, openPorts: new Set([8080]) },
);
const listOf = (text: string, port?: number) => HOST.decide(ip(text), port)?.reason;

describe('the host as a destination', () => {
  it("denies every interface address, a loopback interface's whole prefix and unspecified ones", () => {
    for (const address of [
      '127.0.0.1',
      '127.4.5.6',
      '::1',
      '198.18.7.1',
      '2001:db8:7::1',
      'fe80::1',
    ])
      expect(listOf(address, 443), address).toMatch(/the host itself/);
    for (const address of ['0.0.0.0', '0.1.2.3', '::', '::ffff:0.0.0.0'])
      expect(listOf(address, 443), address).toBe('the unspecified address reaches the host itself');
  });

  it("leaves a non-loopback interface's neighbours to the policy", () => {
    expect(listOf('198.18.7.2', 443)).toBeUndefined();
    expect(listOf('2001:db8:7::2', 443)).toBeUndefined();
  });

  it('denies the gateway and every sandbox link, and no open port opens them', () => {
    for (const address of ['10.213.0.1', '10.213.0.5', '10.213.0.6', '10.213.255.254'])
      expect(listOf(address, 8080), address).toMatch(/the gateway or a sandbox link/);
  });

  it('leaves an open port of a host address to the policy, but not in a DNS answer', () => {
    expect(listOf('198.18.7.1', 8080)).toBeUndefined();
    expect(listOf('127.0.0.1', 8080)).toBeUndefined();
    expect(listOf('198.18.7.1', 8081)).toMatch(/the host itself/);
    expect(listOf('198.18.7.1')).toMatch(/the host itself/);
    expect(listOf('0.0.0.0', 8080)).toMatch(/unspecified/);
  });

  it('decides with the list "host" and no rule', () => {
    expect(HOST.decide(ip('198.18.7.1'), 22)).toMatchObject({
      verdict: 'deny',
      list: 'host',
      rule: null,
    });
  });

  it('denies a connection found to have reached the host, on any port but an opened one', () => {
    expect(HOST.reached(22)?.reason).toMatch(/the host itself/);
    expect(HOST.reached(8081)?.reason).toMatch(/the host itself/);
    expect(HOST.reached(8080)).toBeUndefined();
    expect(compileHostAddresses([]).reached(8080)?.list).toBe('host');
  });

  it("denies what the host's local routes deliver to it, but not the sandbox links among them", () => {
    const withRoutes = compileHostAddresses(
      [{ address: '127.0.0.1', prefixLength: 8, loopback: true }],
      { sandboxLinks: pool.value },
      ['198.18.9.0/24', '2001:db8:9::/64', '10.213.0.1/32'],
    );
    const reason = (text: string) => withRoutes.decide(ip(text), 443)?.reason;
    expect(reason('198.18.9.77')).toMatch(/the host itself/);
    expect(reason('2001:db8:9::5')).toMatch(/the host itself/);
    expect(reason('198.18.10.1')).toBeUndefined();
    expect(reason('10.213.0.1')).toMatch(/the gateway or a sandbox link/);
  });
});
