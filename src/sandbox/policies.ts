/** A sandbox's egress rules compiled into the Policy every enforcement point decides by. */
import type { Logger } from 'pino';
import {
  compilePolicy,
  type InternalDenyList,
  parseNetworkConfig,
  type Policy,
  type PresetTable,
  type PresetUse,
} from '../policy/index.js';
import { networkRules } from './network-settings.js';
import type { SandboxRecord } from './records.js';
import { type EgressRules, SandboxError } from './requests.js';

export interface PolicyOptions {
  readonly internal: InternalDenyList;
  readonly maxPolicyEntries: number;
  /** What `preset:NAME` in allowOut may name. */
  readonly presets: PresetTable;
  /**
   * Whether a stored secret has this name: `network.rules` may name only those. Absent, rules
   * that name a secret are refused.
   */
  readonly secretExists?: (name: string) => Promise<boolean>;
  readonly logger: Logger;
}

export class SandboxPolicies {
  constructor(private readonly options: PolicyOptions) {}

  private parse(rules: EgressRules) {
    return parseNetworkConfig(rules, {
      maxEntries: this.options.maxPolicyEntries,
      presets: this.options.presets,
    });
  }

  /** The rules of a request, compiled; a 400 naming the entry at fault. */
  compile(rules: EgressRules): Policy {
    const parsed = this.parse(rules);
    if (!parsed.ok) {
      throw new SandboxError(400, parsed.errors.map((problem) => problem.message).join('; '));
    }
    return compilePolicy(parsed.value, this.options.internal);
  }

  /**
   * A stored config was valid when stored; if this Moat's limits or presets have since changed
   * and it no longer parses, the sandbox is enforced deny-all rather than left open (fail closed).
   */
  stored(record: SandboxRecord): Policy {
    try {
      return this.compile(networkRules(record.network));
    } catch (error) {
      this.options.logger.error(
        { sandboxID: record.sandboxID, err: (error as Error).message },
        'stored network config no longer compiles; enforcing deny-all for this sandbox',
      );
      // One entry (ALL_TRAFFIC denies IPv6 too), so no limit refuses it; enforced, whatever mode
      // the operator's default says.
      return this.compile({ denyOut: ['0.0.0.0/0'], mode: 'enforce' });
    }
  }

  /** The presets a stored config uses, as this Moat expands them (none if it no longer parses). */
  presetsOf(record: SandboxRecord): readonly PresetUse[] {
    const parsed = this.parse(networkRules(record.network));
    return parsed.ok ? parsed.value.presets : [];
  }

  /** Every secret the policy's rules name must be stored (a 400 naming key, header and secret). */
  async checkSecrets(policy: Policy): Promise<void> {
    const exists = this.options.secretExists ?? (async () => false);
    for (const transform of policy.rules.transforms) {
      for (const header of transform.headers) {
        for (const part of header.value) {
          if (!('secret' in part) || (await exists(part.secret))) continue;
          throw new SandboxError(
            400,
            `network.rules[${JSON.stringify(transform.ruleKey)}] header ${JSON.stringify(header.name)} names the secret ${JSON.stringify(part.secret)}, which does not exist (create it with POST /secrets first)`,
          );
        }
      }
    }
  }
}
