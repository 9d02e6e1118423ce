/**
 * The policy engine: pure, no I/O. Parse a network configuration into canonical rules, compile
 * them into an immutable Policy, and decide destinations against it.
 */
export { type CIDR, type IPAddress, parseCIDR, parseIP } from './address.js';
export {
  type Destination,
  destination,
  formatDestination,
  parseAuthority,
  parseDestination,
  parsePort,
  parsePortRange,
} from './destination.js';
export { type CanonicalName, canonicalName, type Host, parseHost } from './host.js';
export {
  compileHostAddresses,
  type HostAddresses,
  type HostAddressOptions,
  type InterfaceAddress,
} from './host-addresses.js';
export {
  DEFAULT_INTERNAL_DENY,
  internalRange,
  type InternalRange,
  parseInternalDenyList,
} from './internal.js';
export { lintPolicy } from './lint.js';
export {
  allowedPorts,
  deniedPorts,
  deniesLearnedName,
  compileInternalDenyList,
  compilePolicy,
  type Decision,
  type DecisionList,
  decide,
  reported,
  describeRequestDecision,
  destinationRulesFor,
  type InternalDenyList,
  type LearnedAddresses,
  matchName,
  type Policy,
  portScopedIPv4,
  requestDecision,
} from './policy.js';
export { formatPorts, type PortRange } from './ports.js';
export type { Preset, PresetTable } from './preset-types.js';
export { parsePresetFile, presetTable } from './presets.js';
export type { PolicyProblem, Result } from './result.js';
export {
  MAX_PORTS_PER_ENTRY,
  type ObservedDestination,
  PRESET_MIN_NAMES,
  type SuggestedEntry,
  type Suggestion,
  suggestPolicy,
  WILDCARD_SIBLINGS,
} from './suggest.js';
export {
  ALL_TRAFFIC,
  ALL_TRAFFIC_MESSAGE,
  DEFAULT_MAX_ENTRIES,
  MAX_DESCRIPTION_LENGTH,
  NETWORK_MODES,
  type NetworkMode,
  type NetworkRules,
  type ParseOptions,
  type ParseResult,
  parseNetworkConfig,
  type PresetUse,
  type Rule,
} from './rules.js';
export {
  decideRequest,
  destinationRules,
  headerRules,
  MAX_MATCH_METHODS,
  MAX_MATCH_PATHS,
  MAX_PATH_PATTERN_LENGTH,
  MAX_RULES_PER_KEY,
  MAX_SHOWN_METHOD,
  MAX_SHOWN_PATH,
  METHOD_OVERRIDE_HEADERS,
  pathProblem,
  type RequestDecision,
  requestPath,
  requestRuleLabel,
} from './request-rules.js';
export type {
  DestinationRules,
  HeaderRule,
  HeaderValuePart,
  RequestAction,
  RequestMatch,
  RequestRule,
} from './transform-types.js';
export {
  identityPlaceholder,
  identityTokensOf,
  isIdentityTokenName,
  MAX_IDENTITY_TOKEN_NAME_LENGTH,
  MAX_HEADER_VALUE_LENGTH,
  MAX_RULE_HEADERS,
  MAX_RULE_KEYS,
  MAX_SECRET_NAME_LENGTH,
  MAX_SECRETS_PER_RULE,
  SECRET_NAME,
  canonicalRuleKeys,
  secretsOf,
  secretPlaceholder,
} from './transforms.js';
