/**
 * A stored network config that no longer compiles (this Moat's limits or presets changed since)
 * is enforced deny-all, whatever mode it or the operator's default names: failing closed must
 * not become report mode's allow-everything.
 */
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import {
  compileInternalDenyList,
  decide,
  parseAuthority,
  presetTable,
} from '../../src/policy/index.js';
import { SandboxPolicies } from '../../src/sandbox/policies.js';
import type { SandboxRecord } from '../../src/sandbox/records.js';

const presets = presetTable([]);
if (!presets.ok) throw new Error('an empty preset table');

describe('a stored config that no longer compiles', () => {
  const policies = new SandboxPolicies({
    internal: compileInternalDenyList([]),
    maxPolicyEntries: 1,
    presets: presets.value,
    logger: pino({ level: 'silent' }),
  });
  const record = (mode: 'enforce' | 'report') =>
    ({
      sandboxID: 'istoredpolicy00000001',
      network: {
        allowOut: ['a.test', 'b.test'],
        denyOut: ['0.0.0.0/0'],
        allowInternetAccess: null,
        allowPublicTraffic: true,
        maskRequestHost: null,
        mode,
      },
    }) as unknown as SandboxRecord;

  it.each(['enforce', 'report'] as const)('is enforced deny-all when it said %s', (mode) => {
    const policy = policies.stored(record(mode));
    expect(policy.report).toBe(false);
    const target = parseAuthority('a.test:443');
    if (!target.ok) throw new Error(target.error);
    expect(decide(policy, target.value).verdict).toBe('deny');
  });
});
