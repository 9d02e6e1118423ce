import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { RuntimeSandbox, SandboxUser } from '../runtime/index.js';
import type { ServerStream } from './connect.js';

/** What the sandbox API needs to know about one running sandbox. */
export interface EnvdSandbox {
  readonly sandboxID: string;
  /** Required as X-Access-Token when set (secure sandboxes). */
  readonly accessToken: string | null;
  /** The create request's envVars (GET /envs). */
  readonly envVars: Readonly<Record<string, string>>;
  readonly runtime: RuntimeSandbox;
  /**
   * False once the sandbox no longer runs here (killed, expired, Moat stopping): its streams are
   * then cut, as they are when the reference service's sandbox goes away.
   */
  running(): boolean;
}

export interface CallContext {
  readonly sandbox: EnvdSandbox;
  readonly user: SandboxUser;
  readonly request: IncomingMessage;
  readonly response: ServerResponse;
  /** Connect-Timeout-Ms, when the client set one. */
  readonly deadlineMs: number | undefined;
  /** Keepalive-Ping-Interval in milliseconds, when the client asked for keepalives. */
  readonly keepaliveMs: number | undefined;
  readonly log: Logger;
}

export type Method =
  | {
      readonly kind: 'unary';
      run(message: Record<string, unknown>, context: CallContext): Promise<object>;
    }
  | {
      readonly kind: 'server-stream';
      run(
        message: Record<string, unknown>,
        context: CallContext,
        stream: ServerStream,
      ): Promise<void>;
    }
  | {
      /** Reads enveloped messages from the request as they arrive, answers one message. */
      readonly kind: 'client-stream';
      run(context: CallContext): Promise<object>;
    };
