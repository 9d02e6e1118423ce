/** Small helpers shared by the policy suites: build policies and destinations from text. */
import {
  type CanonicalName,
  compilePolicy,
  type Decision,
  type Destination,
  decide,
  type InternalDenyList,
  type LearnedAddresses,
  type Policy,
  parseAuthority,
  parseNetworkConfig,
} from '../../src/policy/index.js';
import { refKey } from './reference.js';

/** Parses and compiles a network configuration; fails the test when it does not parse. */
export function policyOf(config: unknown, internal?: InternalDenyList): Policy {
  const parsed = parseNetworkConfig(config);
  if (!parsed.ok) throw new Error(`expected a valid policy: ${JSON.stringify(parsed.errors)}`);
  return internal === undefined
    ? compilePolicy(parsed.value)
    : compilePolicy(parsed.value, internal);
}

/** Builds a destination from a host text and/or an address text via parseAuthority. */
export function destinationOf(parts: { host?: string; ip?: string; port?: number }): Destination {
  let destination: { host?: CanonicalName; ip?: Destination['ip']; port?: number } = {};
  if (parts.host !== undefined) {
    const parsed = parseAuthority(parts.host);
    if (!parsed.ok || parsed.value.host === undefined) {
      throw new Error(`expected a host name: ${parts.host} -> ${JSON.stringify(parsed)}`);
    }
    destination = { ...destination, host: parsed.value.host };
  }
  if (parts.ip !== undefined) {
    const parsed = parseAuthority(parts.ip);
    if (!parsed.ok || parsed.value.ip === undefined) {
      throw new Error(`expected an IP literal: ${parts.ip} -> ${JSON.stringify(parsed)}`);
    }
    destination = { ...destination, ip: parsed.value.ip };
  }
  if (parts.port !== undefined) destination = { ...destination, port: parts.port };
  return destination;
}

/** A learned-address table keyed by address text (any spelling ipaddr.js reads the same). */
export function learnedOf(entries: Iterable<readonly [string, string]>): LearnedAddresses {
  const table = new Map<string, CanonicalName[]>();
  for (const [address, name] of entries) {
    const key = refKey(address);
    table.set(key, [...(table.get(key) ?? []), name as CanonicalName]);
  }
  return { names: (ip) => table.get(refKey(ip.text)) ?? [] };
}

/** The parts of a decision that the contract fixes (the reason is prose). */
export const outcome = (decision: Decision) => ({
  verdict: decision.verdict,
  list: decision.list,
  rule: decision.rule,
});

export const decideText = (
  policy: Policy,
  parts: { host?: string; ip?: string; port?: number },
  learned?: LearnedAddresses,
) => outcome(decide(policy, destinationOf(parts), learned));

export const ALLOW_DEFAULT = { verdict: 'allow', list: 'default', rule: null } as const;
export const DENY_INVALID = { verdict: 'deny', list: 'invalid', rule: null } as const;
export const allowBy = (rule: string) => ({ verdict: 'allow', list: 'allowOut', rule }) as const;
export const denyBy = (rule: string) => ({ verdict: 'deny', list: 'denyOut', rule }) as const;
export const internalBy = (rule: string) => ({ verdict: 'deny', list: 'internal', rule }) as const;
export const learnedBy = (rule: string) => ({ verdict: 'allow', list: 'learned', rule }) as const;
