/**
 * E2B's `iam` (workload identity) on create, checked, and the check that a sandbox's rules name
 * only its own tokens. Audiences are no secret: they are stored with the record as given.
 */
import {
  type DestinationRules,
  isIdentityTokenName,
  MAX_IDENTITY_TOKEN_NAME_LENGTH,
  type Policy,
} from '../policy/index.js';
import type { IamSettings } from './records.js';
import { type IamRequest, SandboxError } from './requests.js';

/** The one token type Moat mints (SPIFFE's JWT form), as E2B's API names it. */
export const JWT_SVID = 'JWT-SVID';
/** As E2B: a sixth token is refused there too (by the API's schema). */
export const MAX_IAM_TOKENS = 5;
export const MAX_AUDIENCE_LENGTH = 512;
/** The setting without which no sandbox may ask for identity tokens, as operators write it. */
export const IDENTITY_SETTING = '--identity-issuer URL (MOAT_IDENTITY_ISSUER)';

const notOffered = (what: string) =>
  new SandboxError(
    400,
    `${what} asks for workload identity tokens, which this Moat does not mint: the operator must set ${IDENTITY_SETTING} to enable them`,
  );

// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * The `iam` of a create request as stored (undefined: none; an empty token map is none, as E2B
 * has it), or a 400 naming the token and field at fault. `enabled`: the operator set the issuer.
 */
export function acceptIam(
  request: IamRequest | undefined,
  enabled: boolean,
): IamSettings | undefined {
  const entries = Object.entries(request?.tokens ?? {});
  if (entries.length === 0) return undefined;
  if (!enabled) throw notOffered('iam.tokens');
  const tokens: Record<string, IamSettings['tokens'][string]> = {};
  for (const [name, token] of entries) {
    const at = `iam.tokens[${JSON.stringify(name)}]`;
    if (!isIdentityTokenName(name))
      throw new SandboxError(
        400,
        `${at}: a token name is 1 to ${MAX_IDENTITY_TOKEN_NAME_LENGTH} characters without "{", "}" or control characters (it is written into \${e2b.identity.tokens.<name>})`,
      );
    if (token.tokenType !== JWT_SVID)
      throw new SandboxError(
        400,
        `${at}.tokenType ${JSON.stringify(token.tokenType.slice(0, 64))} is not supported: Moat mints "${JWT_SVID}" tokens only`,
      );
    const { audience } = token;
    if (audience.trim() === '' || audience.length > MAX_AUDIENCE_LENGTH || CONTROL.test(audience))
      throw new SandboxError(
        400,
        `${at}.audience must be 1 to ${MAX_AUDIENCE_LENGTH} characters, not blank, without control characters`,
      );
    tokens[name] = { audience, tokenType: JWT_SVID };
  }
  return { tokens };
}

/**
 * Every `${e2b.identity.tokens.NAME}` of the policy's rules must name a token of the sandbox's
 * `iam` (a 400 naming key, header and token), and identity must be enabled for any to be used.
 */
export function checkIdentityTokens(
  policy: Policy,
  iam: IamSettings | undefined,
  enabled: boolean,
): void {
  const defined = Object.keys(iam?.tokens ?? {});
  for (const transform of policy.rules.transforms) {
    for (const header of transform.headers) {
      for (const part of header.value) {
        if (!('identity' in part)) continue;
        if (!enabled) throw notOffered(ruleAt(transform, header.name));
        if (iam !== undefined && Object.hasOwn(iam.tokens, part.identity)) continue;
        throw new SandboxError(
          400,
          `${ruleAt(transform, header.name)} names the identity token ${JSON.stringify(part.identity)}, which the sandbox's iam.tokens does not define (${defined.length === 0 ? 'it defines none: give iam.tokens on create' : `it defines ${defined.map((name) => JSON.stringify(name)).join(', ')}`})`,
        );
      }
    }
  }
}

const ruleAt = (transform: DestinationRules, header: string) =>
  `network.rules[${JSON.stringify(transform.ruleKey)}] header ${JSON.stringify(header)}`;
