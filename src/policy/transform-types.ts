/**
 * What a `network.rules` entry asks of requests to a destination: headers Moat sets on them, over
 * intercepted TLS only. A value is a sequence of pieces, literal text, references to stored
 * secrets (`${e2b.secrets.<name>}`) and to the sandbox's workload identity tokens
 * (`${e2b.identity.tokens.<name>}`), substituted when each request is sent.
 */
export type HeaderValuePart =
  { readonly literal: string } | { readonly secret: string } | { readonly identity: string };

export interface HeaderRule {
  /** As the rule writes it (an HTTP token); replaces any header of that name, case-insensitively. */
  readonly name: string;
  readonly value: readonly HeaderValuePart[];
}

export interface HeaderTransform {
  /** The rule's key in canonical form: `api.example.com` or `*.example.com`. */
  readonly ruleKey: string;
  readonly headers: readonly HeaderRule[];
}
