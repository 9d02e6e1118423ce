/** Errors are values: every fallible step in the policy part returns one of these. */
export type Result<T> = { ok: true; value: T } | { ok: false; error: string };

/** What is wrong with a policy (an error) or doubtful in it (a lint warning), and where. */
export interface PolicyProblem {
  /** Where the problem is: a list entry (`allowOut[3]`) or a field. */
  readonly at: string;
  readonly entry?: string;
  readonly message: string;
}

export const ok = <T>(value: T): Result<T> => ({ ok: true, value });
export const err = <T = never>(error: string): Result<T> => ({ ok: false, error });
