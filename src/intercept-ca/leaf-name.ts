/**
 * Which names a leaf certificate may be minted for: one canonical DNS name (lower-case A-labels,
 * as the policy normaliser writes them). Never an IP address (a certificate for one would let a
 * sandbox's client accept Moat for a bare address), never a wildcard (one leaf must not speak for
 * a whole zone), never anything a certificate's dNSName cannot hold.
 */
import type { Result } from '../policy/index.js';

const MAX_NAME = 253;
const LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;

export function checkLeafName(name: string): Result<string> {
  const refuse = (why: string): Result<string> => ({
    ok: false,
    error: `no certificate for ${JSON.stringify(name.slice(0, MAX_NAME + 1))}: ${why}`,
  });
  if (name.length === 0) return refuse('the name is empty');
  if (name.length > MAX_NAME) return refuse(`longer than ${MAX_NAME} characters`);
  if (name.includes('*')) return refuse('a wildcard name is never minted');
  if (name.endsWith('.')) return refuse('not canonical (trailing dot)');
  if (name !== name.toLowerCase()) return refuse('not canonical (upper-case letters)');
  const labels = name.split('.');
  const bad = labels.find((label) => !LABEL.test(label));
  if (bad !== undefined) {
    return refuse(
      bad === ''
        ? 'an empty label'
        : bad.length > 63
          ? 'a label longer than 63 characters'
          : `label ${JSON.stringify(bad)} is not letters, digits and inner hyphens`,
    );
  }
  // An all-numeric last label is an IPv4 address or a number, never a host name (RFC 3696 2).
  if (/^[0-9]+$/.test(labels.at(-1)!)) return refuse('an IP address or a numeric top label');
  return { ok: true, value: name };
}
