import { X509Certificate } from 'node:crypto';
import type net from 'node:net';
import tls from 'node:tls';
import type { Logger } from 'pino';
import type { EnforcedSandbox } from '../enforce/index.js';
import type { FlowKind, OpenFlow } from '../flows/index.js';
import type { HotCount, InjectionOutcome } from '../metrics/index.js';
import {
  type CanonicalName,
  type Decision,
  formatDestination,
  decideRequest,
  describeRequestDecision,
  type DestinationRules,
  type HeaderRule,
  identityPlaceholder,
  MAX_SHOWN_METHOD,
  MAX_SHOWN_PATH,
  METHOD_OVERRIDE_HEADERS,
  requestPath,
  secretPlaceholder,
} from '../policy/index.js';
import { ArrivingBytes } from '../net/index.js';
import { ClientConnection, type RequestHandler, requestTurn } from './client-connection.js';
import type { Dialled, Refusal, Target } from './dial.js';
import type { HeaderInjection, ProxyOptions } from './options.js';
import { Exchange, type ExchangeContext, type SetField } from './exchange.js';
import { UpstreamPool } from './upstream-pool.js';
import { webSocketUpgrade } from './websocket.js';
import { authorityMismatch } from './host-guard.js';
import { carriedSecret } from './leak-guard.js';
import { fieldValues, isHopByHop, type RequestHead } from './http1.js';
import type { Redaction } from './redact.js';
import { flowAsk } from './tunnels.js';

/** Options of a proxy that intercepts: the proxy's own, with the injection parts. */
export type InterceptOptions = ProxyOptions & { readonly injection: HeaderInjection };

/**
 * The CAs origins of intercepted connections are verified against: Node's roots and the
 * certificates of the PEM bundle `extra`. Throws, naming the problem, when `extra` holds no
 * certificate or one that does not parse (OpenSSL would skip it silently, trusting less).
 */
export function originTrust(extra: string | undefined): tls.SecureContext {
  if (extra === undefined) return tls.createSecureContext({ ca: [...tls.rootCertificates] });
  const blocks = extra.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g);
  if (blocks === null) throw new Error('the upstream CA bundle holds no PEM certificate');
  blocks.forEach((block, i) => {
    try {
      new X509Certificate(block);
    } catch (error) {
      throw new Error(
        `certificate ${i + 1} of the upstream CA bundle does not parse: ${(error as Error).message}`,
        { cause: error },
      );
    }
  });
  return tls.createSecureContext({ ca: [...tls.rootCertificates, ...blocks] });
}

/** Headers a rule may not set: Moat writes them itself, or they describe one connection. */
const RESERVED_FIELDS = new Set(['host', 'content-length', 'transfer-encoding']);
/** What a header value may hold (as the HTTP/1 parser accepts): no CR, LF, NUL or controls. */
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

/** Never read: a refused request was decided by a rule, or refused as invalid. */
const NO_DECISION: Decision = { verdict: 'deny', list: 'invalid', rule: null, reason: '' };

/** A request its destination's rules refused: 403 by a rule, 400 for a path origins differ on. */
export interface RequestRefusal {
  readonly ok: false;
  readonly status: 400 | 403;
  readonly decision: Decision;
}

/** A refusal for breaking a protocol check (recorded as a denial by the `invalid` list). */
/** A request the leak guard could not check, because the stored secrets could not be read. */
function unreadableSecrets(target: Target): Refusal {
  const reason = `Moat could not read its stored secrets to check this request to ${formatDestination(target)}; refused (the operator's log says why)`;
  return {
    status: 502,
    message: reason,
    decision: { verdict: 'deny', list: 'invalid', rule: null, reason },
  };
}

export function protocolRefusal(reason: string): Refusal {
  return {
    status: 403,
    message: reason,
    decision: { verdict: 'deny', list: 'invalid', rule: null, reason },
  };
}

/**
 * Reads a socket (after the bytes `early` already read) until `enough` says what arrived is
 * enough, within `timeoutMs`; undefined when the client left or the time ran out. The socket is
 * left paused, its bytes all in the result.
 */
export function readFirstBytes(
  socket: net.Socket,
  early: Buffer,
  timeoutMs: number,
  enough: (seen: Buffer) => boolean,
): Promise<Buffer | undefined> {
  const arriving = new ArrivingBytes();
  let seen = arriving.restart(early);
  if (seen.length > 0 && enough(seen)) return Promise.resolve(seen);
  return new Promise((resolve) => {
    const finish = (result: Buffer | undefined) => {
      clearTimeout(timer);
      socket.off('data', onData).off('end', gone).off('close', gone);
      socket.pause();
      resolve(result);
    };
    const onData = (chunk: Buffer) => {
      seen = arriving.append(chunk);
      if (enough(seen)) finish(seen);
    };
    const gone = () => finish(undefined);
    const timer = setTimeout(gone, timeoutMs);
    socket.on('data', onData).once('end', gone).once('close', gone);
    socket.resume();
  });
}

/** Why a rule's headers cannot be sent. */
interface Unfilled {
  readonly ok: false;
  readonly outcome: InjectionOutcome | undefined;
  readonly message: string;
}

/** One placeholder's value (a secret's or an identity token), and the placeholder it fills. */
type Filled =
  { readonly ok: true; readonly value: string; readonly placeholder: string } | Unfilled;

/** A rule's headers with their values substituted, or why they cannot be. */
type Substituted =
  | {
      readonly ok: true;
      readonly fields: readonly SetField[];
      /** Each secret value and token set, and its placeholder (for response redaction). */
      readonly secrets: readonly Redaction[];
    }
  | Unfilled;

/**
 * Terminates the TLS of connections to destinations with a header rule, and re-sends each of
 * their requests to the origin over a new, verified TLS connection with the rule's headers set.
 * Only where a rule asks for it: everything else stays an opaque tunnel.
 */
export class Interceptor {
  private readonly pool: UpstreamPool;
  private readonly context: ExchangeContext;
  private readonly sockets = new Set<net.Socket>();
  private draining = false;
  /** The stored secrets as last read, for the leak guard of plain-HTTP tunnels. */
  private lastSecrets: ReadonlyMap<string, string> | 'unreadable' | undefined;

  constructor(private readonly options: InterceptOptions) {
    this.pool = new UpstreamPool(options.maxTunnelsPerSandbox);
    options.table.subscribe((event) => this.pool.drop(event.sandboxID));
    // Made now: a bundle that does not parse stops Moat at start, not at the first request.
    const trust = originTrust(options.upstreamCa);
    this.context = {
      table: options.table,
      dialer: options.dialer,
      pool: this.pool,
      tunnels: options.tunnels,
      idleTimeoutMs: options.idleTimeoutMs,
      onRefusal: ({ sandbox, target }, refusal) => this.refused(sandbox, target, refusal),
      draining: () => this.draining,
      originTls: trust,
    };
    // Read once now, so the first request of a plain-HTTP tunnel has values to be checked by.
    this.readSecrets().catch(() => {});
  }

  /** The header rule a decided target is intercepted for; undefined: it is not. */
  ruleFor(sandbox: EnforcedSandbox, target: Target): DestinationRules | undefined {
    if (target.host === undefined) return undefined;
    return this.options.injection.transformFor(sandbox.sandboxID, target.host);
  }

  /**
   * The refusal of plain HTTP to a destination with rules, or undefined. Headers (credentials)
   * are set over HTTPS only. Methods and paths are checked on plain HTTP only where Moat reads
   * every request (`readsRequests`: the proxy's absolute-form requests); a tunnel or a
   * transparent connection is only read at its start, so there plain HTTP is refused.
   */
  plainRefusal(
    sandbox: EnforcedSandbox,
    target: Target,
    readsRequests = false,
  ): Refusal | undefined {
    const rule = this.ruleFor(sandbox, target);
    if (rule === undefined || (readsRequests && rule.headers.length === 0)) return undefined;
    this.options.logger.info(
      { sandboxID: sandbox.sandboxID, destination: formatDestination(target), rule: rule.ruleKey },
      'plain HTTP to a destination with a rule refused',
    );
    return protocolRefusal(
      rule.headers.length > 0
        ? `${target.host} has a header rule (${rule.ruleKey}): credentials for that rule are added over HTTPS only; use https://${target.host}/`
        : `${target.host} has request rules (${rule.ruleKey}): plain HTTP to it is checked only as the proxy's absolute-form requests (HTTP_PROXY) or over HTTPS; use https://${target.host}/`,
    );
  }

  /**
   * A request (`head`, and `requestTarget`, its target in origin form) decided by its
   * destination's rules (`rules`, as current now): the headers to set when it may be sent;
   * else the refusal, recorded as an `http` flow naming the method and path (never the query).
   */
  decideRequest(
    sandbox: EnforcedSandbox,
    target: Target,
    rules: DestinationRules,
    head: RequestHead,
    requestTarget: string,
    protocol: 'http' | 'tls',
  ): { ok: true; headers: readonly HeaderRule[] } | RequestRefusal {
    const { method } = head;
    // Read only where a rule matches methods: the one case an override can change.
    const override = rules.matchesMethods
      ? METHOD_OVERRIDE_HEADERS.find((name) => fieldValues(head.fields, name).length > 0)
      : undefined;
    const decided = decideRequest(rules, method, requestTarget, override);
    if (decided.verdict === 'allow') return { ok: true, headers: decided.headers };
    const decision = describeRequestDecision(
      sandbox.policy,
      rules,
      target.host ?? formatDestination(target),
      method,
      requestTarget,
      decided,
      NO_DECISION,
    );
    const path = requestPath(requestTarget).slice(0, MAX_SHOWN_PATH);
    this.options.flows.decided(
      {
        ...flowAsk('http', sandbox, target, protocol),
        request: { method: method.slice(0, MAX_SHOWN_METHOD), path },
      },
      decision,
    );
    // Report mode lets a denied request through, recorded above with what would have denied
    // it; no rule's headers go with it (a credential goes only where its rules send it).
    if (decision.verdict === 'allow') return { ok: true, headers: [] };
    return { ok: false, status: decided.verdict === 'deny' ? 403 : 400, decision };
  }

  /**
   * The refusal of a request whose head (target or a header) carries a stored secret's value,
   * or a placeholder of any name (stored or not), to a destination whose header rule does not
   * name that secret; undefined when it carries none. Bodies are not read. The one leak guard of every request Moat reads:
   * forwarded, intercepted, and (through `leakInspector`) in plain-HTTP tunnels.
   */
  async leakRefusal(
    sandbox: EnforcedSandbox,
    target: Target,
    head: RequestHead,
  ): Promise<Refusal | undefined> {
    let secrets: ReadonlyMap<string, string> | undefined;
    try {
      secrets = await this.readSecrets();
    } catch (error) {
      return this.unchecked(sandbox, target, error);
    }
    return secrets === undefined ? undefined : this.leakIn(secrets, sandbox, target, head);
  }

  /**
   * The leak guard for the requests of a plain-HTTP tunnel, which are checked as they pass and
   * cannot wait for a read: each is checked against the secrets as last read, and asks for a
   * fresh read for the next one (a vault answers from memory until its secrets change).
   * Undefined when there is no leak guard; a problem refuses the request and ends the tunnel.
   */
  leakInspector(
    sandbox: EnforcedSandbox,
    target: Target,
  ): ((head: RequestHead) => string | undefined) | undefined {
    if (this.options.injection.secretValues === undefined) return undefined;
    return (head) => {
      const secrets = this.lastSecrets;
      this.readSecrets().catch(() => {});
      if (secrets === undefined || secrets === 'unreadable')
        return this.unchecked(sandbox, target, undefined).message;
      return this.leakIn(secrets, sandbox, target, head)?.message;
    };
  }

  /** Every stored secret, read now (undefined: no leak guard); remembered for tunnels. */
  private async readSecrets(): Promise<ReadonlyMap<string, string> | undefined> {
    try {
      const secrets = await this.options.injection.secretValues?.();
      this.lastSecrets = secrets;
      return secrets;
    } catch (error) {
      this.lastSecrets = 'unreadable';
      throw error;
    }
  }

  /** Fail closed: a request that cannot be checked is not sent. */
  private unchecked(sandbox: EnforcedSandbox, target: Target, error: unknown): Refusal {
    // The cause (a store outage, another node's key) is the operator's to read, not the
    // sandbox's.
    this.options.logger.error(
      { err: error, sandboxID: sandbox.sandboxID, destination: formatDestination(target) },
      'stored secrets unreadable; request refused',
    );
    this.count('store_error');
    return unreadableSecrets(target);
  }

  private leakIn(
    secrets: ReadonlyMap<string, string>,
    sandbox: EnforcedSandbox,
    target: Target,
    head: RequestHead,
  ): Refusal | undefined {
    const rule = this.ruleFor(sandbox, target);
    const bound = new Set(
      rule?.headers.flatMap((header) =>
        header.value.flatMap((part) => ('secret' in part ? [part.secret] : [])),
      ),
    );
    const carried = carriedSecret(secrets, bound, head);
    if (carried === undefined) return undefined;
    this.count('leak');
    const destination = formatDestination(target);
    // A value's name is no news to a sandbox that holds the value; a placeholder's is not
    // echoed, whether stored or not (which names are stored is the operator's to read).
    const reason =
      carried.by === 'value'
        ? `the request carries secret ${JSON.stringify(carried.name)} to ${destination}, which no header rule binds to it`
        : `the request carries a secret placeholder to ${destination}, which no header rule there names: placeholders are filled in only in a rule's headers`;
    this.options.logger.warn(
      { sandboxID: sandbox.sandboxID, destination, secret: carried.name, by: carried.by },
      'secret leak refused',
    );
    return protocolRefusal(reason);
  }

  /**
   * Serves the sandbox's TLS connection `socket` (its ClientHello, already checked to name the
   * target, in `hello`) with Moat's leaf certificate for the target, as a connection of the
   * sandbox (`at`: the address it was decided for) registered with the tunnel registry, so a
   * policy change that denies it closes it. Its client connection is charged to the sandbox's
   * connection budget from accept to close.
   */
  async intercept(
    kind: FlowKind,
    sandbox: EnforcedSandbox,
    target: Target & { readonly host: CanonicalName },
    at: Dialled,
    decision: Decision,
    rule: DestinationRules,
    socket: net.Socket,
    hello: Buffer,
  ): Promise<void> {
    const { logger, flows, tunnels, fairShare } = this.options;
    // Leaves are minted in turn across sandboxes: one asking for name after name waits for its
    // own turns, not every other sandbox.
    const turn = fairShare?.mintTurn(sandbox.sandboxID);
    if (fairShare !== undefined && turn === undefined) {
      fairShare.refuse('leaf_mints', sandbox.sandboxID, `the TLS connection to ${target.host}`);
      return void socket.resetAndDestroy();
    }
    const endTurn = await turn;
    if (socket.destroyed) return endTurn?.();
    let context: tls.SecureContext;
    try {
      context = await this.options.injection.leafContext(target.host);
    } catch (error) {
      logger.error(
        { err: error, sandboxID: sandbox.sandboxID, destination: target.host },
        'no certificate to intercept with',
      );
      socket.destroy();
      return;
    } finally {
      endTurn?.();
    }
    if (socket.destroyed || this.draining) return void socket.destroy();
    const flow = flows.opened(
      { ...flowAsk(kind, sandbox, at, 'tls'), ruleKey: rule.ruleKey },
      decision,
    );
    // The ClientHello goes back into the socket: the TLS server reads it first.
    socket.unshift(hello);
    const secure = new tls.TLSSocket(socket, {
      isServer: true,
      secureContext: context,
      ALPNProtocols: ['http/1.1'],
    });
    this.sockets.add(socket);
    const remove = tunnels.add({
      sandbox,
      target: at,
      close: (denied) => {
        if (denied !== undefined) flow.refused(denied);
        secure.destroy();
        socket.destroy();
      },
    });
    const handshake = setTimeout(() => secure.destroy(), this.options.handshakeTimeoutMs);
    secure.on('error', () => secure.destroy());
    secure.once('secure', () => {
      clearTimeout(handshake);
      new ClientConnection(new InterceptedConnection(this, sandbox, target, flow), secure);
    });
    secure.once('close', () => {
      clearTimeout(handshake);
      socket.destroy();
      this.sockets.delete(socket);
      remove();
      const { bytesRead: up, bytesWritten: down } = socket;
      this.options.metrics.proxyBytes.inc({ direction: 'up' }, up);
      this.options.metrics.proxyBytes.inc({ direction: 'down' }, down);
      flow.closed(up, down);
    });
  }

  /** Ends every intercepted connection and idle origin connection. */
  close(): void {
    this.draining = true;
    for (const socket of this.sockets) socket.destroy();
    this.pool.closeAll();
  }

  get isDraining(): boolean {
    return this.draining;
  }

  get handlerOptions(): InterceptOptions {
    return this.options;
  }

  get exchangeContext(): ExchangeContext {
    return this.context;
  }

  /** Counted on every intercepted request: each outcome's cell is made once. */
  private readonly counts: Partial<Record<InjectionOutcome, HotCount>> = {};

  count(outcome: InjectionOutcome): void {
    const { metrics } = this.options;
    (this.counts[outcome] ??= metrics.hotCount(metrics.secretInjections, { outcome })).count++;
  }

  /**
   * The values of every header `rule` sets, to be redacted from answers; `sent` (those of the
   * request's own headers) when the others cannot be had now.
   */
  async redactionsOf(
    rule: DestinationRules,
    sandboxID: string,
    sent: readonly Redaction[],
  ): Promise<readonly Redaction[]> {
    const all = await this.substitute(rule, rule.headers, sandboxID);
    return all.ok ? all.secrets : sent;
  }

  /** A rule's headers with every secret's current value and identity token in place. */
  async substitute(
    rule: DestinationRules,
    headers: readonly HeaderRule[],
    sandboxID: string,
  ): Promise<Substituted> {
    const fields: SetField[] = [];
    const secrets: Redaction[] = [];
    for (const header of headers) {
      if (RESERVED_FIELDS.has(header.name.toLowerCase()) || isHopByHop(header.name.toLowerCase()))
        return {
          ok: false,
          outcome: undefined,
          message: `header rule ${rule.ruleKey} sets ${header.name}, which Moat does not let a rule set`,
        };
      let value = '';
      for (const part of header.value) {
        if ('literal' in part) {
          value += part.literal;
          continue;
        }
        const filled =
          'secret' in part
            ? await this.secretFor(rule, header.name, part.secret)
            : await this.tokenFor(rule, header.name, part.identity, sandboxID);
        if (!filled.ok) return filled;
        value += filled.value;
        secrets.push({ value: filled.value, placeholder: filled.placeholder });
      }
      // A value that could end the header line would let a stored value write the request.
      if (!FIELD_VALUE.test(value))
        return {
          ok: false,
          outcome: undefined,
          message: `header ${header.name} of rule ${rule.ruleKey} would hold a control character (CR, LF or NUL): not sent`,
        };
      fields.push({ name: header.name, value });
    }
    return { ok: true, fields, secrets };
  }

  /** A stored secret's current value, for one header of a rule. */
  private async secretFor(rule: DestinationRules, header: string, name: string): Promise<Filled> {
    let secret: string | undefined;
    try {
      secret = await this.options.injection.secretValue(name);
    } catch (error) {
      this.options.logger.error(
        { err: error, rule: rule.ruleKey, secret: name },
        'stored secret unreadable; request refused',
      );
      return {
        ok: false,
        outcome: 'store_error',
        message: `Moat could not read secret ${JSON.stringify(name)} of header rule ${rule.ruleKey}; request not sent (the operator's log says why)`,
      };
    }
    if (secret === undefined)
      return {
        ok: false,
        outcome: 'missing_secret',
        message: `header rule ${rule.ruleKey} names secret ${JSON.stringify(name)} for ${header}, and no secret of that name is stored`,
      };
    return { ok: true, value: secret, placeholder: secretPlaceholder(name) };
  }

  /**
   * The sandbox's identity token `name`, minted (or reused from the cache) for this request. No
   * message or log line here holds a token: only its name.
   */
  private async tokenFor(
    rule: DestinationRules,
    header: string,
    name: string,
    sandboxID: string,
  ): Promise<Filled> {
    const { injection } = this.options;
    if (injection.identityToken === undefined)
      return {
        ok: false,
        outcome: 'identity_error',
        message: `header rule ${rule.ruleKey} names identity token ${JSON.stringify(name)} for ${header}, and this Moat mints no identity tokens (its operator has not set --identity-issuer)`,
      };
    let token: string | undefined;
    try {
      token = await injection.identityToken(sandboxID, name);
    } catch (error) {
      this.options.logger.error(
        { err: (error as Error).message, rule: rule.ruleKey, identityToken: name, sandboxID },
        'identity token not minted; request refused',
      );
      return {
        ok: false,
        outcome: 'identity_error',
        message: `Moat could not mint identity token ${JSON.stringify(name)} of header rule ${rule.ruleKey}; request not sent (the operator's log says why)`,
      };
    }
    if (token === undefined)
      return {
        ok: false,
        outcome: 'identity_error',
        message: `header rule ${rule.ruleKey} names identity token ${JSON.stringify(name)} for ${header}, which the sandbox's iam.tokens does not define`,
      };
    return { ok: true, value: token, placeholder: identityPlaceholder(name) };
  }

  /** Logs a refusal an intercepted request's exchange answered (the origin's 502/504). */
  private refused(sandbox: EnforcedSandbox, target: Target, refusal: Refusal): Refusal {
    if (refusal.cause === 'origin-tls') this.count('upstream_refused');
    if (refusal.cause === 'switch') this.count('upgrade_refused');
    this.options.logger.warn(
      {
        sandboxID: sandbox.sandboxID,
        kind: 'intercepted',
        destination: formatDestination(target),
        status: refusal.status,
        reason: refusal.message,
      },
      'egress failed',
    );
    return refusal;
  }
}

/** The requests of one intercepted TLS connection: checked, given the rule's headers, sent. */
class InterceptedConnection implements RequestHandler {
  /** The last Host value found to name the target (the check is pure: not parsed again). */
  private matchedHost: string | undefined;

  constructor(
    private readonly interceptor: Interceptor,
    private readonly sandbox: EnforcedSandbox,
    private readonly target: Target & { readonly host: CanonicalName },
    private readonly flow: OpenFlow,
  ) {}

  get draining(): boolean {
    return this.interceptor.isDraining;
  }

  get logger(): Logger {
    return this.interceptor.handlerOptions.logger;
  }

  get handshakeTimeoutMs(): number {
    return this.interceptor.handlerOptions.handshakeTimeoutMs;
  }

  forget(): void {}

  async onRequest(head: RequestHead, connection: ClientConnection): Promise<void> {
    const { sandbox, target, flow, interceptor } = this;
    const options = interceptor.handlerOptions;
    const { framing, hasBody, lastRequest, keepAlive } = requestTurn(head, this.draining);
    const answer = (status: number, message: string, keep = keepAlive) =>
      connection.refuse(head, keep, status, message);
    if (!framing.ok) return answer(framing.status, `request ${head.target}: ${framing.message}`);
    const wait = options.fairShare?.wait(sandbox.sandboxID, 'a request to', target);
    if (wait !== undefined) {
      const over = await wait;
      if (over !== undefined) return answer(429, over);
    }
    if (!head.target.startsWith('/') && !(head.method === 'OPTIONS' && head.target === '*'))
      return answer(
        400,
        `request target ${JSON.stringify(head.target.slice(0, 200))}: requests to ${target.host} over its intercepted TLS connection are in origin form (GET /path)`,
      );
    const hosts = fieldValues(head.fields, 'host');
    const fronting =
      hosts.length !== 1
        ? `a request to ${target.host} has ${hosts.length} Host headers`
        : hosts[0] === this.matchedHost
          ? undefined
          : authorityMismatch(target, hosts[0]);
    if (fronting === undefined) this.matchedHost = hosts[0];
    else {
      interceptor.count('fronting');
      flow.refused({ verdict: 'deny', list: 'invalid', rule: null, reason: fronting });
      return answer(421, `${fronting}; refused`, false);
    }
    // Past a switch nothing more is read or redacted: only a WebSocket one may be asked for.
    const upgrade = webSocketUpgrade(head);
    if (upgrade !== undefined && 'problem' in upgrade) {
      interceptor.count('upgrade_refused');
      flow.refused({ verdict: 'deny', list: 'invalid', rule: null, reason: upgrade.problem });
      return answer(400, `${upgrade.problem}; refused`, false);
    }
    // Rules change: each request is given the rule current now, or none (then the client
    // reconnects, and gets an opaque tunnel).
    const rule = interceptor.ruleFor(sandbox, target);
    const leak =
      rule === undefined ? undefined : await interceptor.leakRefusal(sandbox, target, head);
    if (leak !== undefined) {
      if (leak.decision !== undefined) flow.refused(leak.decision);
      return answer(leak.status, leak.message, false);
    }
    if (rule === undefined)
      return answer(
        421,
        `${target.host} no longer has a header rule for this sandbox; reconnect`,
        false,
      );
    const decided = interceptor.decideRequest(sandbox, target, rule, head, head.target, 'tls');
    if (!decided.ok)
      return connection.refuse(
        head,
        keepAlive,
        decided.status,
        decided.decision.reason,
        decided.decision,
      );
    const plan = await options.dialer.plan(sandbox, target);
    if (connection.socket.destroyed) return;
    if (!plan.ok) {
      if (plan.decision !== undefined) flow.refused(plan.decision);
      return answer(plan.status, plan.message, false);
    }
    // A connection report mode let through (the sandbox's rules deny it) gets no rule's
    // headers: a credential goes only where the rules let a connection go.
    const headers = plan.decision.wouldDeny === undefined ? decided.headers : [];
    // The connection's budget charge (taken at accept) covers the one request it carries.
    const substituted = await interceptor.substitute(rule, headers, sandbox.sandboxID);
    if (!substituted.ok || connection.socket.destroyed) {
      if (substituted.ok) return;
      if (substituted.outcome !== undefined) interceptor.count(substituted.outcome);
      this.logger.warn(
        { sandboxID: sandbox.sandboxID, destination: target.host, rule: rule.ruleKey },
        substituted.message,
      );
      return answer(502, substituted.message);
    }
    const names = substituted.fields.map((field) => field.name);
    // Every value any of the destination's rules may send is redacted from every answer: an
    // origin may echo one given to an earlier request into this one's.
    const redactions =
      options.redactSecretsInResponses !== true
        ? []
        : headers.length === rule.headers.length
          ? substituted.secrets
          : await interceptor.redactionsOf(rule, sandbox.sandboxID, substituted.secrets);
    if (connection.socket.destroyed) return;
    connection.exchange(
      new Exchange(
        interceptor.exchangeContext,
        {
          sandbox,
          target,
          head,
          path: head.target,
          framing: framing.value,
          lastRequest,
          flow: { dialled: (ip) => flow.dialled(ip), refused: (d) => flow.refused(d), closed() {} },
          ...(options.redactSecretsInResponses === true
            ? {
                // A coded (gzip) body could not be searched for the values.
                setFields: [
                  ...substituted.fields.filter((f) => f.name.toLowerCase() !== 'accept-encoding'),
                  { name: 'Accept-Encoding', value: 'identity' },
                ],
                redactions,
              }
            : { setFields: substituted.fields }),
          ...(upgrade === undefined ? {} : { webSocketAccept: upgrade.accept }),
          onSent: () => {
            interceptor.count('injected');
            flow.injectedHeaders(names);
            this.logger.info(
              {
                sandboxID: sandbox.sandboxID,
                destination: target.host,
                rule: rule.ruleKey,
                headers: names,
              },
              'secret headers injected',
            );
          },
        },
        connection.inbox,
        // Retrying another address is only safe while no body has been sent.
        hasBody ? plan.addresses.slice(0, 1) : plan.addresses,
        (result) => connection.exchangeDone(result.keepAlive),
      ),
    );
  }
}
