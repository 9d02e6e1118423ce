import { parseAuthority } from '../policy/index.js';
import { ArrivingBytes } from '../arriving-bytes.js';
import type { Target } from './dial.js';
import {
  bodyScanner,
  type BodyScanner,
  fieldValues,
  headEnd,
  MAX_REQUEST_HEAD_BYTES,
  parseRequestHead,
  requestFraming,
} from './http1.js';
import type { Checked, TunnelGuard } from './splice.js';

/**
 * Checks every request a client sends through a plain-HTTP tunnel, not only the first: each
 * head must name the authority the tunnel was decided for, in its Host field and in an
 * absolute-form target (an origin routes by the target's authority before Host, RFC 9112
 * 3.2.2). A head is held back until it is whole and checked, so no byte of a refused one, and
 * nothing that is not HTTP, reaches the origin; bodies pass as they come, skipped by their
 * framing. Protocol upgrades are refused: what follows one could not be read as requests.
 */
export class RequestStreamGuard implements TunnelGuard {
  /** The start of a head not yet whole (held back). */
  private readonly head = new ArrivingBytes();
  private body: BodyScanner | undefined;
  private problem: string | undefined;

  /**
   * `mismatch` says why an authority (a Host value, an absolute-form target's, or undefined for
   * a request without Host) is not the tunnel's; undefined when it is.
   */
  constructor(private readonly mismatch: (authority: string | undefined) => string | undefined) {}

  /**
   * Takes the next bytes from the client; returns those that may go on to the origin now (held
   * head bytes included once checked), or the problem that ends the tunnel.
   */
  fromClient(chunk: Buffer): Checked {
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
    return { pass: passed.length === 1 ? passed[0]! : Buffer.concat(passed) };
  }

  private check(bytes: Buffer): string | undefined {
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
    if (head.method === 'CONNECT' || head.fields.some((field) => field.lower === 'upgrade'))
      return 'a request asks to switch protocols, which this tunnel would no longer see';
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
