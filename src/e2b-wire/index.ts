/**
 * Facts of E2B's wire that several parts answer by: the form of a sandbox ID, the port of a
 * sandbox's own API, and the JSON bodies (platform errors, sandbox errors, refused signatures)
 * E2B's SDK reads.
 */
export {
  errorBody,
  jsonAnswer,
  sandboxErrorBody,
  sendJson,
  sendSandboxError,
  sendSignatureRefused,
} from './http-answers.js';
export { SANDBOX_API_PORT } from './sandbox-api-port.js';
export { SANDBOX_ID } from './sandbox-id.js';
