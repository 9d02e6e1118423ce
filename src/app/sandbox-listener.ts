/**
 * Wires the sandbox listener: the router (src/proxy) routes each request to the sandbox API
 * (src/envd) or to ingress, and finds sandboxes through the lifecycle (src/sandbox) and the
 * runtime (src/runtime).
 */
import type { Logger } from 'pino';
import type { ConnectionBudget } from '../enforce/index.js';
import { type EnvdSandbox, SandboxApi, signatureMatches } from '../envd/index.js';
import { type RoutedSandbox, IngressProxy, SandboxRouter } from '../proxy/index.js';
import type { SandboxRuntime } from '../runtime/index.js';
import type { FlowRecorder } from '../flows/index.js';
import {
  networkOnlyRefusal,
  SANDBOX_ID,
  type SandboxError,
  type SandboxService,
} from '../sandbox/index.js';
import { sendSandboxError } from '../e2b-wire/index.js';
import type { HostPort } from '../net/index.js';

interface HostedSandbox extends RoutedSandbox {
  /** Its sandbox API; a network-only sandbox has none, only why (answered with 501). */
  readonly envd: EnvdSandbox | { readonly refusal: SandboxError };
}

export interface SandboxListenerParts {
  readonly sandboxes: SandboxService;
  readonly runtime: SandboxRuntime;
  readonly logger: Logger;
  /** Sandboxes' own connections to the sandbox listener are charged here. */
  readonly connections: ConnectionBudget;
  /** Where ingress requests are recorded. */
  readonly flows: FlowRecorder;
  readonly connectTimeoutMs: number;
  readonly idleTimeoutMs: number;
  /** Ports Moat itself listens on: never an ingress target, whatever a sandbox listens on. */
  readonly moatPorts: () => ReadonlySet<number>;
  /** The sandbox listener of the node hosting a sandbox that is not here (many nodes). */
  readonly elsewhere?: (sandboxID: string) => Promise<HostPort | undefined>;
}

export function createSandboxListener(parts: SandboxListenerParts): {
  router: SandboxRouter<HostedSandbox>;
  ingress: IngressProxy;
} {
  const { sandboxes, runtime, logger } = parts;
  const api = new SandboxApi(logger);
  const ingress = new IngressProxy({
    logger,
    flows: parts.flows,
    connectTimeoutMs: parts.connectTimeoutMs,
    idleTimeoutMs: parts.idleTimeoutMs,
  });

  const hosted = async (sandboxID: string): Promise<HostedSandbox | undefined> => {
    if (!SANDBOX_ID.test(sandboxID)) return undefined;
    let record = await sandboxes.find(sandboxID);
    // Traffic for a paused sandbox with autoResume resumes it; otherwise it is not running.
    // (Only here: a sandbox hosted by another node is woken by that node, see `elsewhere`.)
    if (record?.state === 'paused' && record.autoResume && runtime.sandbox(sandboxID))
      record = await sandboxes.wake(sandboxID);
    if (record?.state === 'running' && record.link !== undefined)
      return {
        sandboxID,
        address: record.sourceAddress,
        trafficToken: record.trafficAccessToken,
        maskRequestHost: record.network.maskRequestHost,
        httpsPorts: record.network.httpsPorts ?? [],
        // No ingress: what listens at its address is the runtime's (a VMM, a container's
        // processes), never published by Moat; a guest behind it has an address of its own.
        ingressListeners: () => Promise.resolve(new Map()),
        envd: { refusal: networkOnlyRefusal(sandboxID, '') },
      };
    const live = runtime.sandbox(sandboxID);
    if (record === undefined || record.state !== 'running' || live === undefined) return undefined;
    return {
      sandboxID,
      address: live.address,
      trafficToken: record.trafficAccessToken,
      maskRequestHost: record.network.maskRequestHost,
      httpsPorts: record.network.httpsPorts ?? [],
      // Its address is the host's loopback: only its own listening ports are its.
      ingressListeners:
        runtime.enforcement === 'proxy'
          ? async () => {
              const own = parts.moatPorts();
              const listening = await live.listeningPorts();
              return new Map([...listening].filter(([port]) => !own.has(port)));
            }
          : undefined,
      envd: {
        sandboxID,
        accessToken: record.envdAccessToken,
        envVars: record.envVars,
        runtime: live,
        running: () => runtime.sandbox(sandboxID) === live,
      },
    };
  };

  const router = new SandboxRouter<HostedSandbox>({
    logger,
    connections: parts.connections,
    lookup: hosted,
    elsewhere: parts.elsewhere,
    // A signed URL names no sandbox: the secure sandbox whose token signed it is the one.
    async bySignature(url) {
      const page = await sandboxes.list({
        states: ['running'],
        metadata: {},
        order: 'desc',
        limit: Number.MAX_SAFE_INTEGER,
      });
      for (const record of page.items) {
        if (record.envdAccessToken !== null && signatureMatches(url, record.envdAccessToken)) {
          return hosted(record.sandboxID);
        }
      }
      return undefined;
    },
    serveApi: async (request, response, { sandboxID, envd }) => {
      if ('refusal' in envd)
        sendSandboxError(response, envd.refusal.status, envd.refusal.message, sandboxID);
      else await api.handle(request, response, envd);
    },
    ingress,
  });
  return { router, ingress };
}
