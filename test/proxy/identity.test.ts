import { describe, expect, it } from 'vitest';
import { EnforcementTable } from '../../src/enforce/index.js';
import { compilePolicy, parseIP, parseNetworkConfig } from '../../src/policy/index.js';
import { identify } from '../../src/proxy/identity.js';

const rules = parseNetworkConfig({});
if (!rules.ok) throw new Error(JSON.stringify(rules.errors));
const address = (text: string) => {
  const parsed = parseIP(text);
  if (!parsed.ok) throw new Error(parsed.error);
  return parsed.value;
};

const table = new EnforcementTable();
const alice = table.register(
  'ialice00000000000001',
  { sourceAddress: address('10.213.0.6'), egressSecret: 'alice-secret' },
  compilePolicy(rules.value),
);
const bob = table.register(
  'ibob0000000000000001',
  { sourceAddress: address('10.213.0.10'), egressSecret: 'bob-secret' },
  compilePolicy(rules.value),
);
const basic = (credential: string) => `Basic ${Buffer.from(credential).toString('base64')}`;
const BOB = basic('ibob0000000000000001:bob-secret');
const fromAlice = { remoteAddress: '10.213.0.6' };

describe('identity where the source address is proof (namespace mode)', () => {
  it("refuses another sandbox's credential, naming both", () => {
    const who = identify(table, BOB, fromAlice, true);
    expect(who).toEqual({
      ok: false,
      reason:
        'the credential of sandbox ibob0000000000000001 came from the address of sandbox ialice00000000000001',
      sandbox: alice,
    });
  });

  it('takes the source alone, or with its own credential (IPv4-mapped sources included)', () => {
    expect(identify(table, undefined, fromAlice, true)).toEqual({ ok: true, sandbox: alice });
    const own = basic('ialice00000000000001:alice-secret');
    expect(identify(table, own, { remoteAddress: '::ffff:10.213.0.6' }, true)).toEqual({
      ok: true,
      sandbox: alice,
    });
  });

  it('lets the host itself (no sandbox at its address) use a credential', () => {
    expect(identify(table, BOB, { remoteAddress: '127.0.0.1' }, true)).toEqual({
      ok: true,
      sandbox: bob,
    });
  });
});

describe('identity where sandboxes share the host network (proxy mode)', () => {
  it('takes the credential over the source address, which any process can use', () => {
    expect(identify(table, BOB, fromAlice, false)).toEqual({ ok: true, sandbox: bob });
    expect(identify(table, undefined, fromAlice, false)).toEqual({ ok: true, sandbox: alice });
  });

  it('never falls back to the address for a wrong secret', () => {
    const wrong = basic('ibob0000000000000001:guess');
    for (const proof of [true, false])
      expect(identify(table, wrong, fromAlice, proof)).toEqual({
        ok: false,
        reason: 'unknown sandbox or wrong egress secret',
      });
  });
});
