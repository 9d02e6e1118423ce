/**
 * The sandbox listener's router: every request for a sandbox's own API or one of its ports
 * arrives here. The sandbox and port come from the Host label `{port}-{sandboxID}.<domain>` or,
 * when the Host is not such a name (one shared sandbox URL, as E2B_SANDBOX_URL gives), from the
 * `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers that the SDK always sends. Port 49983 is the
 * sandbox API; any other port is ingress to that port of the sandbox.
 */
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { ConnectionBudget } from '../enforce/index.js';
import { SANDBOX_API_PORT, sendSandboxError, sendSignatureRefused } from '../e2b-wire/index.js';
import type { IngressProxy, IngressTarget } from './ingress.js';
import type { HostPort } from '../net/index.js';

/** What the router must know of a sandbox to route to it. */
export interface RoutedSandbox {
  readonly sandboxID: string;
  /** Where its ports are reached (the process runtime: 127.0.0.1). */
  readonly address: string;
  readonly trafficToken: string | null;
  readonly maskRequestHost: string | null;
  /** Its ports that serve TLS, reached over TLS. */
  readonly httpsPorts: readonly number[];
  /**
   * The only ports ingress may reach, where the sandbox shares the host's network: those its
   * own sockets listen on (never one of Moat's), each with the address its listener is bound
   * to, which is what ingress dials. Undefined where the address is the sandbox's alone (its
   * own namespace).
   */
  readonly ingressListeners?: () => Promise<ReadonlyMap<number, string>>;
}

export interface SandboxRouterOptions<S extends RoutedSandbox> {
  readonly logger: Logger;
  /**
   * A sandbox that connects here (its own or another's API, a port through ingress) is charged
   * for the connection from accept to close; other clients are not sandboxes and not counted.
   */
  readonly connections: ConnectionBudget;
  /** The sandbox if it is running here (a paused one with autoResume is resumed first). */
  lookup(sandboxID: string): Promise<S | undefined>;
  /**
   * The sandbox listener (host:port) of the node that hosts a sandbox not running here, when
   * many nodes share a store: requests for it are relayed there as they came. Rejects when
   * that cannot be known now (the store is out of reach): the request is answered 503.
   */
  elsewhere?(sandboxID: string): Promise<HostPort | undefined>;
  /** A secure sandbox whose signed /files URL this is (URLs that name no sandbox). */
  bySignature(url: URL): Promise<S | undefined>;
  /** Serves the sandbox API (port 49983). */
  serveApi(request: IncomingMessage, response: ServerResponse, sandbox: S): Promise<void>;
  readonly ingress: IngressProxy;
}

const HOST_LABEL = /^([0-9]{1,5})-([a-z0-9][a-z0-9-]*)\./;

type Route =
  | { readonly kind: 'sandbox'; readonly sandboxID: string; readonly port: number }
  | { readonly kind: 'signed' }
  | { readonly kind: 'bad'; readonly message: string };

function routeOf(request: IncomingMessage, url: URL): Route {
  const label = HOST_LABEL.exec((request.headers.host ?? '').toLowerCase());
  if (label) return { kind: 'sandbox', port: Number(label[1]), sandboxID: label[2]! };
  const id = request.headers['e2b-sandbox-id'];
  const port = request.headers['e2b-sandbox-port'];
  if (typeof id === 'string' && typeof port === 'string') {
    if (!/^[0-9]{1,5}$/.test(port) || Number(port) > 65535) {
      return {
        kind: 'bad',
        message: `E2b-Sandbox-Port must be a port number, not ${JSON.stringify(port)}`,
      };
    }
    return { kind: 'sandbox', sandboxID: id, port: Number(port) };
  }
  if (
    id === undefined &&
    port === undefined &&
    url.pathname === '/files' &&
    url.searchParams.has('signature')
  ) {
    return { kind: 'signed' };
  }
  return {
    kind: 'bad',
    message:
      'name the sandbox: Host {port}-{sandboxID}.<domain>, or both E2b-Sandbox-Id and E2b-Sandbox-Port headers',
  };
}

export const NOT_RUNNING = 'The sandbox was not found';

const relayTo = (node: HostPort, sandboxID: string): IngressTarget => ({
  sandboxID,
  host: node.host,
  port: node.port,
  trafficToken: null,
  maskRequestHost: null,
  relay: true,
});

export class SandboxRouter<S extends RoutedSandbox> {
  readonly server: http.Server;

  constructor(private readonly options: SandboxRouterOptions<S>) {
    this.server = http.createServer((request, response) => void this.onRequest(request, response));
    this.server.on(
      'upgrade',
      (request: IncomingMessage, socket: Duplex, head: Buffer) =>
        void this.onUpgrade(request, socket, head),
    );
    this.server.on('clientError', (_error, socket) => socket.destroy());
    this.server.on('connection', (socket: Socket) => {
      const hold = options.connections.admit('ingress', socket.remoteAddress, true);
      if (hold === undefined) return void socket.resetAndDestroy();
      socket.once('close', () => hold.release());
    });
  }

  private async onRequest(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const url = new URL(request.url ?? '/', 'http://sandbox');
    const route = routeOf(request, url);
    try {
      if (route.kind === 'bad') {
        sendSandboxError(response, 400, route.message, '');
        return;
      }
      const sandbox =
        route.kind === 'signed'
          ? await this.options.bySignature(url)
          : await this.options.lookup(route.sandboxID);
      if (sandbox === undefined) {
        const node =
          route.kind === 'sandbox' ? await this.options.elsewhere?.(route.sandboxID) : undefined;
        if (node !== undefined && route.kind === 'sandbox') {
          await this.options.ingress.request(request, response, relayTo(node, route.sandboxID));
        } else if (route.kind === 'signed') {
          // No sandbox's token signed it: to the client, as to E2B's, an invalid signature.
          sendSignatureRefused(response);
        } else sendSandboxError(response, 502, NOT_RUNNING, route.sandboxID);
        return;
      }
      if (route.kind === 'signed' || route.port === SANDBOX_API_PORT) {
        await this.options.serveApi(request, response, sandbox);
        return;
      }
      await this.options.ingress.request(request, response, this.target(sandbox, route.port));
    } catch (error) {
      this.options.logger.error(
        { err: error, sandboxID: route.kind === 'sandbox' ? route.sandboxID : undefined },
        'sandbox listener request failed',
      );
      if (!response.headersSent) {
        const unavailable = (error as { status?: unknown }).status === 503;
        sendSandboxError(
          response,
          unavailable ? 503 : 500,
          unavailable ? (error as Error).message : 'internal error',
          route.kind === 'sandbox' ? route.sandboxID : '',
        );
      } else response.destroy();
    }
  }

  private async onUpgrade(request: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    socket.on('error', () => socket.destroy());
    const route = routeOf(request, new URL(request.url ?? '/', 'http://sandbox'));
    if (route.kind !== 'sandbox') {
      this.options.ingress.refuse(
        socket,
        400,
        route.kind === 'bad' ? route.message : 'upgrades need a sandbox',
        '',
      );
      return;
    }
    let sandbox: S | undefined;
    let node: HostPort | undefined;
    try {
      sandbox = await this.options.lookup(route.sandboxID);
      if (sandbox === undefined) node = await this.options.elsewhere?.(route.sandboxID);
    } catch (error) {
      this.options.logger.error(
        { err: error, sandboxID: route.sandboxID },
        'sandbox lookup failed',
      );
      this.options.ingress.refuse(
        socket,
        503,
        'the sandbox cannot be looked up now',
        route.sandboxID,
      );
      return;
    }
    if (sandbox === undefined) {
      if (node !== undefined)
        await this.options.ingress.upgrade(request, socket, head, relayTo(node, route.sandboxID));
      else this.options.ingress.refuse(socket, 502, NOT_RUNNING, route.sandboxID);
      return;
    }
    if (route.port === SANDBOX_API_PORT) {
      this.options.ingress.refuse(
        socket,
        400,
        'the sandbox API takes no upgrades',
        route.sandboxID,
      );
      return;
    }
    await this.options.ingress.upgrade(request, socket, head, this.target(sandbox, route.port));
  }

  private target(sandbox: S, port: number): IngressTarget {
    const { ingressListeners, sandboxID } = sandbox;
    return {
      sandboxID,
      host: sandbox.address,
      port,
      locate:
        ingressListeners &&
        (async () => {
          const host = (await ingressListeners()).get(port);
          return host === undefined
            ? { refused: `no process of sandbox ${sandboxID} listens on port ${port}` }
            : { host };
        }),
      trafficToken: sandbox.trafficToken,
      maskRequestHost: sandbox.maskRequestHost,
      tls: sandbox.httpsPorts.includes(port),
    };
  }

  async listen(at: HostPort): Promise<number> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(at.port, at.host, () => {
        this.server.off('error', reject);
        resolve();
      });
    });
    const address = this.server.address();
    return typeof address === 'object' && address ? address.port : at.port;
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}
