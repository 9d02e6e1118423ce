/** The one count of sandbox connections to Moat's listeners: by sandbox, by source, in total. */
import { describe, expect, it } from 'vitest';
import {
  ConnectionBudget,
  type ConnectionRefusal,
  EnforcementTable,
} from '../../src/enforce/index.js';
import {
  compileInternalDenyList,
  compilePolicy,
  parseIP,
  parseNetworkConfig,
} from '../../src/policy/index.js';

function budget(options: { perSandbox: number; total?: number; dnsTcp?: number }) {
  const table = new EnforcementTable();
  const parsed = parseNetworkConfig({});
  if (!parsed.ok) throw new Error('policy');
  const address = parseIP('127.77.0.2');
  if (!address.ok) throw new Error(address.error);
  table.register(
    'isandbox0000000000001',
    { sourceAddress: address.value, egressSecret: 's' },
    compilePolicy(parsed.value, compileInternalDenyList([])),
  );
  const refusals: ConnectionRefusal[] = [];
  let now = 0;
  const connections = new ConnectionBudget({
    table,
    perSandbox: options.perSandbox,
    perListener: options.dnsTcp === undefined ? undefined : { dns_tcp: options.dnsTcp },
    total: options.total ?? Infinity,
    now: () => now,
    refused: (refusal) => refusals.push(refusal),
  });
  return { connections, refusals, tick: (ms: number) => (now += ms) };
}

describe('ConnectionBudget', () => {
  it('charges a sandbox by its source address across listeners, and gives back on release', () => {
    const { connections, refusals } = budget({ perSandbox: 2 });
    const one = connections.admit('proxy', '127.77.0.2')!;
    const two = connections.admit('dns_tcp', '::ffff:127.77.0.2')!;
    expect(one.sandboxID).toBe('isandbox0000000000001');
    expect(connections.admit('transparent', '127.77.0.2')).toBeUndefined();
    expect(refusals[0]).toMatchObject({
      resource: 'transparent_connections',
      sandboxID: 'isandbox0000000000001',
      held: 2,
      max: 2,
      log: 1,
    });
    one.release();
    one.release();
    expect(connections.held('isandbox0000000000001')).toBe(1);
    two.release();
    expect(connections.total).toBe(0);
  });

  it('charges an unknown source by its address until a credential names the sandbox', () => {
    const { connections } = budget({ perSandbox: 1 });
    const first = connections.admit('proxy', '127.0.0.1')!;
    expect(first.sandboxID).toBeUndefined();
    expect(connections.admit('proxy', '127.0.0.1')).toBeUndefined();
    expect(first.chargeTo('isandbox0000000000001')).toBe(true);
    const second = connections.admit('proxy', '127.0.0.1')!;
    expect(second.chargeTo('isandbox0000000000001')).toBe(false);
    expect(second.sandboxID).toBeUndefined();
    second.release();
    first.release();
    expect(connections.total).toBe(0);
  });

  it("holds a listener's own cap within the sandbox's", () => {
    const { connections, refusals } = budget({ perSandbox: 10, dnsTcp: 1 });
    connections.admit('dns_tcp', '127.77.0.2');
    expect(connections.admit('dns_tcp', '127.77.0.2')).toBeUndefined();
    expect(refusals[0]).toMatchObject({ resource: 'dns_tcp_connections', held: 1, max: 1 });
    expect(connections.admit('proxy', '127.77.0.2')).toBeDefined();
  });

  it('refuses everyone for file descriptors once all sandboxes together hold the total', () => {
    const { connections, refusals } = budget({ perSandbox: 10, total: 2 });
    connections.admit('proxy', '127.77.0.2');
    connections.admit('proxy', '127.0.0.5');
    expect(connections.admit('proxy', '127.0.0.6')).toBeUndefined();
    expect(refusals[0]).toMatchObject({ resource: 'file_descriptors', held: 2, max: 2 });
  });

  it('counts nothing for a client that is no sandbox where only sandboxes are budgeted', () => {
    const { connections } = budget({ perSandbox: 1, total: 1 });
    connections.admit('ingress', '192.0.2.1', true)!.release();
    expect(connections.admit('ingress', '192.0.2.1', true)).toBeDefined();
    expect(connections.total).toBe(0);
  });

  it("logs a holder's refusals at most every 10 s, with how many came since", () => {
    const { connections, refusals, tick } = budget({ perSandbox: 1 });
    connections.admit('proxy', '127.77.0.2');
    for (let i = 0; i < 5; i++) connections.admit('proxy', '127.77.0.2');
    tick(10_000);
    connections.admit('proxy', '127.77.0.2');
    expect(refusals.map((r) => r.log)).toEqual([1, 0, 0, 0, 0, 5]);
  });
});
