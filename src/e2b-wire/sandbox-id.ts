/**
 * A sandbox ID, as the reference service forms them: `i` and 20 characters of `[a-z0-9]`. What
 * a client names a sandbox by is checked against it before any lookup.
 */
export const SANDBOX_ID = /^i[a-z0-9]{20}$/;
