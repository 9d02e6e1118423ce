/**
 * What a `network.rules` key asks of requests to a destination: headers Moat sets on them (over
 * intercepted TLS only), and (a Moat extension) which methods and paths may be sent at all.
 * A header value is a sequence of pieces, literal text, references to stored secrets
 * (`${e2b.secrets.<name>}`) and to the sandbox's workload identity tokens
 * (`${e2b.identity.tokens.<name>}`), substituted when each request is sent.
 */
export type HeaderValuePart =
  { readonly literal: string } | { readonly secret: string } | { readonly identity: string };

export interface HeaderRule {
  /** As the rule writes it (an HTTP token); replaces any header of that name, case-insensitively. */
  readonly name: string;
  readonly value: readonly HeaderValuePart[];
}

export type RequestAction = 'allow' | 'deny';

export interface RequestMatch {
  /** Upper-case method tokens; undefined: every method. */
  readonly methods: readonly string[] | undefined;
  /** Path patterns as written (`*` matches any run of characters); undefined: every path. */
  readonly paths: readonly string[] | undefined;
}

/** One rule of a destination, as `decideRequest` walks it. */
export interface RequestRule {
  /** Its place in the destination's list, from 1: how decisions name it (`api.github.com #1`). */
  readonly number: number;
  readonly match: RequestMatch | undefined;
  readonly action: RequestAction | undefined;
  readonly headers: readonly HeaderRule[];
}

export interface DestinationRules {
  /** The rule's key in canonical form: `api.example.com` or `*.example.com`. */
  readonly ruleKey: string;
  readonly rules: readonly RequestRule[];
  /** Every header any of its rules sets, in order: what names secrets and identity tokens. */
  readonly headers: readonly HeaderRule[];
  /** Some rule matches paths: a request's path must then be one every origin reads alike. */
  readonly matchesPaths: boolean;
  /** Some rule matches methods: a request's method must then be upper case, and not overridden. */
  readonly matchesMethods: boolean;
  /** Some rule has a match or an action: requests are decided one by one. */
  readonly decidesRequests: boolean;
}
