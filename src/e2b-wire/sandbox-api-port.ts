/** The port E2B's SDK reaches every sandbox's own API on (envd's port): a wire fact. */
export const SANDBOX_API_PORT = 49983;
