/**
 * The one check of a switch to WebSocket (RFC 6455 4), for every path that lets a request
 * switch protocols: the plain-HTTP tunnel guard and intercepted connections. Other protocols
 * are never let through: past a switch Moat reads no more requests (nor, on an intercepted
 * connection, redacts any response), so only a switch the origin proves it understood passes.
 */
import { createHash } from 'node:crypto';
import { fieldTokens, fieldValues, type RequestHead, type ResponseHead } from './http1.js';

/** RFC 6455 1.3: the server proves it read the handshake by hashing the key with this. */
const WEBSOCKET_GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
/** A Sec-WebSocket-Key is 16 bytes in base64 (RFC 6455 4.1). */
const WEBSOCKET_KEY = /^[A-Za-z0-9+/]{22}==$/;

/**
 * What a request asks to switch to: undefined when it has no Upgrade field; the
 * Sec-WebSocket-Accept the origin's 101 must carry for a well-formed WebSocket upgrade; else
 * why it is refused.
 */
export function webSocketUpgrade(
  head: RequestHead,
): { readonly accept: string } | { readonly problem: string } | undefined {
  if (!head.fields.some((field) => field.lower === 'upgrade')) return undefined;
  const protocols = fieldTokens(head.fields, 'upgrade');
  if (protocols.length === 0 || protocols.some((protocol) => protocol !== 'websocket'))
    return {
      problem: `a request asks to switch protocols to ${JSON.stringify(protocols.join(', '))}: only websocket is let through`,
    };
  const keys = fieldValues(head.fields, 'sec-websocket-key');
  if (
    keys.length !== 1 ||
    !WEBSOCKET_KEY.test(keys[0]!) ||
    !fieldTokens(head.fields, 'connection').includes('upgrade')
  )
    return {
      problem:
        'a WebSocket upgrade request needs one Sec-WebSocket-Key (16 bytes in base64) and Connection: Upgrade',
    };
  const accept = createHash('sha1')
    .update(keys[0]! + WEBSOCKET_GUID)
    .digest('base64');
  return { accept };
}

/**
 * Whether a response is a 101 that proves the origin read this handshake (RFC 6455 4.2.2): a
 * canned 101 from an origin that goes on reading HTTP, or echoing, must not end the checks.
 */
export function switchedToWebSocket(head: ResponseHead | undefined, accept: string): boolean {
  return head?.status === 101 && fieldValues(head.fields, 'sec-websocket-accept').join() === accept;
}
