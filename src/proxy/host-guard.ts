import { parseAuthority } from '../policy/index.js';
import { ArrivingBytes } from '../net/index.js';
import type { Target } from './dial.js';
import {
  bodyScanner,
  type BodyScanner,
  fieldValues,
  headEnd,
  MAX_REQUEST_HEAD_BYTES,
  MAX_RESPONSE_HEAD_BYTES,
  parseRequestHead,
  parseResponseHead,
  type RequestHead,
  requestFraming,
} from './http1.js';
import type { Checked, TunnelGuard } from './splice.js';
import { switchedToWebSocket, webSocketUpgrade } from './websocket.js';

const EMPTY = Buffer.alloc(0);
const joined = (parts: readonly Buffer[]): Buffer =>
  parts.length === 1 ? parts[0]! : Buffer.concat(parts);
/** What a client may send after its upgrade request before the origin has answered it. */
const MAX_HELD_FOR_ANSWER = 64 * 1024;

/**
 * Checks every request a client sends through a plain-HTTP tunnel, not only the first: each
 * head must name the authority the tunnel was decided for, in its Host field and in an
 * absolute-form target (an origin routes by the target's authority before Host, RFC 9112
 * 3.2.2). A head is held back until it is whole and checked, so no byte of a refused one, and
 * nothing that is not HTTP, reaches the origin; bodies pass as they come, skipped by their
 * framing.
 *
 * A tunnel's first request may switch to WebSocket (checked like any other): the client's later
 * bytes wait until the origin's answer to it shows. A 101 with the Sec-WebSocket-Accept for the
 * request's key ends the watch (what follows is frames to the origin the checked request
 * chose); any other answer (or none that parses) keeps the tunnel HTTP and the waiting bytes
 * are checked as requests. Other switches are refused: what follows h2c, say, carries requests
 * of its own with authorities this guard could not read, and a later request's answer could
 * only be found by following every earlier one's framing.
 */
export class RequestStreamGuard implements TunnelGuard {
  /** The start of a head not yet whole (held back). */
  private readonly head = new ArrivingBytes();
  private body: BodyScanner | undefined;
  private problem: string | undefined;
  private requests = 0;
  /**
   * 'http' while requests are checked; 'answer' once a WebSocket upgrade request went on,
   * until the origin's final answer to it shows; 'switched' after that answer was 101.
   */
  private state: 'http' | 'answer' | 'switched' = 'http';
  /** Client bytes that came while the origin's answer was awaited. */
  private readonly held = new ArrivingBytes();
  /** The origin's bytes while its answer is awaited, from the start of a head. */
  private readonly answer = new ArrivingBytes();
  /** The Sec-WebSocket-Accept that a real switch answers the upgrade request with. */
  private accept = '';

  /**
   * `mismatch` says why an authority (a Host value, an absolute-form target's, or undefined for
   * a request without Host) is not the tunnel's; undefined when it is. `inspect`, when given,
   * says why a head that passed those checks may still not go on (the leak guard). `admit`,
   * when given, says why a request after the tunnel's first (which came with the tunnel) may
   * not go on now (the sandbox's fair share), asked before any work is done on its head.
   */
  constructor(
    private readonly mismatch: (authority: string | undefined) => string | undefined,
    private readonly inspect?: (head: RequestHead) => string | undefined,
    private readonly admit?: () => string | undefined,
  ) {}

  /** The origin switched to WebSocket: every byte passes as it is from now on. */
  get done(): boolean {
    return this.state === 'switched';
  }

  /** Only the answer to an upgrade request is read; other upstream bytes need not be shown. */
  get watchesUpstream(): boolean {
    return this.state === 'answer';
  }

  /**
   * Takes the next bytes from the client; returns those that may go on to the origin now (held
   * head bytes included once checked), or the problem that ends the tunnel.
   */
  fromClient(chunk: Buffer): Checked {
    if (this.problem !== undefined) return { problem: this.problem };
    if (this.state === 'switched') return { pass: chunk };
    const passed: Buffer[] = [];
    let data = chunk;
    while (this.problem === undefined && data.length > 0) {
      if (this.body !== undefined) {
        const taken = this.body.scan(data);
        if (typeof taken === 'string') {
          this.problem = `request body: ${taken}`;
          break;
        }
        passed.push(data.subarray(0, taken));
        data = data.subarray(taken);
        if (this.body.done) this.body = undefined;
        continue;
      }
      if (this.state === 'answer') return this.hold(data, passed);
      const scanned = this.head.bytes.length;
      const seen = this.head.append(data);
      const end = headEnd(seen, MAX_REQUEST_HEAD_BYTES, scanned);
      if (end === 'incomplete') break;
      this.head.restart();
      if (typeof end !== 'number') {
        this.problem = `request head: ${end.message}`;
        break;
      }
      this.problem = this.check(seen.subarray(0, end));
      if (this.problem === undefined) passed.push(seen.subarray(0, end));
      data = seen.subarray(end);
    }
    if (this.problem !== undefined) return { problem: this.problem };
    return { pass: joined(passed) };
  }

  /**
   * Reads the origin's answer to the upgrade request (its bytes go on to the client whatever
   * this returns); returns the client bytes the answer lets go on.
   */
  fromUpstream(chunk: Buffer): Checked {
    if (this.problem !== undefined) return { problem: this.problem };
    if (this.state !== 'answer') return { pass: EMPTY };
    let scanned = this.answer.bytes.length;
    // Upstream reads may land in pooled buffers, reused once the chunk has gone on.
    let seen = this.answer.appendCopy(chunk);
    for (;;) {
      const end = headEnd(seen, MAX_RESPONSE_HEAD_BYTES, scanned);
      if (end === 'incomplete') return { pass: EMPTY };
      // A head too long or with a bare LF is no answer that switches: undefined.
      const length = typeof end === 'number' ? end : 0;
      const parsed = length > 0 ? parseResponseHead(seen.subarray(0, length)) : undefined;
      const head = parsed?.ok === true ? parsed.value : undefined;
      // An interim answer (100 Continue, 103 Early Hints) comes before the one that counts.
      if (head !== undefined && head.status < 200 && head.status !== 101) {
        seen = this.answer.restart(seen.subarray(length));
        scanned = 0;
        continue;
      }
      this.answer.restart();
      const held = this.held.bytes;
      this.held.restart();
      if (switchedToWebSocket(head, this.accept)) {
        this.state = 'switched';
        return { pass: held };
      }
      this.state = 'http';
      return this.fromClient(held);
    }
  }

  /**
   * Keeps client bytes that came while the answer to the upgrade request is awaited; what was
   * checked before them (the request itself) goes on.
   */
  private hold(chunk: Buffer, passed: readonly Buffer[]): Checked {
    if (this.held.append(chunk).length > MAX_HELD_FOR_ANSWER)
      this.problem = 'the client sent over 64 KiB before the origin answered its upgrade request';
    return this.problem === undefined ? { pass: joined(passed) } : { problem: this.problem };
  }

  private check(bytes: Buffer): string | undefined {
    const first = this.requests++ === 0;
    const refused = first ? undefined : this.admit?.();
    if (refused !== undefined) return refused;
    const parsed = parseRequestHead(bytes);
    if (!parsed.ok) return `request head: ${parsed.message}`;
    const head = parsed.value;
    const hosts = fieldValues(head.fields, 'host');
    if (hosts.length > 1) return 'a request has two Host headers';
    const byHost = this.mismatch(hosts[0]);
    if (byHost !== undefined) return byHost;
    const target = head.target;
    if (!target.startsWith('/') && target !== '*') {
      const absolute = /^http:\/\/([^/?#]*)/i.exec(target);
      if (absolute === null) return `request target ${JSON.stringify(target)} is not a path`;
      const byTarget = this.mismatch(absolute[1]!);
      if (byTarget !== undefined) return byTarget;
    }
    const inspected = this.inspect?.(head);
    if (inspected !== undefined) return inspected;
    if (head.method === 'CONNECT') return 'a request asks to switch protocols (CONNECT)';
    const upgrade = webSocketUpgrade(head);
    if (upgrade !== undefined) {
      if ('problem' in upgrade) return upgrade.problem;
      if (!first)
        return "a request other than the tunnel's first asks to switch protocols: only the first may";
      this.accept = upgrade.accept;
      this.state = 'answer';
    }
    const framing = requestFraming(head);
    if (!framing.ok) return `request head: ${framing.message}`;
    this.body = framing.value.kind === 'none' ? undefined : bodyScanner(framing.value);
    return undefined;
  }
}

/**
 * Why an HTTP authority (a Host value, an absolute-form target's; undefined when a request has
 * no Host) is not the one a tunnel was decided for: its host, or for a tunnel to an address,
 * that address or none.
 */
export function authorityMismatch(
  target: Target,
  authority: string | undefined,
): string | undefined {
  if (authority === undefined)
    return target.host === undefined ? undefined : `a request to ${target.host} has no Host header`;
  const parsed = parseAuthority(authority);
  if (target.host === undefined)
    return parsed.ok && parsed.value.ip?.text === target.ip?.text
      ? undefined
      : `the authority ${JSON.stringify(authority)} names a host, but the tunnel is to an address`;
  return parsed.ok && parsed.value.host === target.host
    ? undefined
    : `the authority ${JSON.stringify(authority)} is not ${target.host} (domain fronting)`;
}
