/**
 * Response redaction for secretless egress: the secret values Moat injected into a request are
 * replaced by their placeholders (`${e2b.secrets.<name>}`) in the response before the sandbox
 * reads it, so an origin that echoes a request (httpbin and the like) cannot hand the
 * credential to the sandbox. Pure byte work, no I/O.
 */

/** One injected value and what the sandbox sees in its place. */
export interface Redaction {
  readonly value: string;
  readonly placeholder: string;
}

interface Needle {
  readonly bytes: Buffer;
  readonly placeholder: Buffer;
}

/**
 * Replaces values in a stream cut anywhere: each occurrence, leftmost first and the longest value
 * where several start at one byte, exactly as if the whole stream had arrived at once. It holds
 * back at most the longest value's length less one byte between pushes (the look-behind).
 */
export class StreamRedactor {
  private readonly needles: readonly Needle[];
  private readonly longest: number;
  private held: Buffer = Buffer.alloc(0);

  constructor(redactions: readonly Redaction[]) {
    // Longest first, so that a tie at one position goes to the longest value.
    this.needles = redactions
      .filter((r) => r.value !== '')
      .map((r) => ({
        bytes: Buffer.from(r.value, 'utf8'),
        placeholder: Buffer.from(r.placeholder),
      }))
      .sort((a, b) => b.bytes.length - a.bytes.length);
    this.longest = this.needles[0]?.bytes.length ?? 0;
  }

  /** The redacted bytes that can be released after `chunk`; `end`: nothing more will come. */
  push(chunk: Buffer, end = false): Buffer[] {
    const text = this.held.length === 0 ? chunk : Buffer.concat([this.held, chunk]);
    // A value can start at a position only once all its bytes could have arrived.
    const settled = end ? text.length : Math.max(0, text.length - this.longest + 1);
    const out: Buffer[] = [];
    let at = 0;
    for (;;) {
      let found = -1;
      let needle: Needle | undefined;
      for (const candidate of this.needles) {
        const index = text.indexOf(candidate.bytes, at);
        if (index >= 0 && (found < 0 || index < found)) [found, needle] = [index, candidate];
      }
      if (needle === undefined || found >= settled) break;
      if (found > at) out.push(text.subarray(at, found));
      out.push(needle.placeholder);
      at = found + needle.bytes.length;
    }
    const release = Math.max(at, settled);
    if (release > at) out.push(text.subarray(at, release));
    // Copied: the caller's buffer may be recycled once this returns.
    this.held = Buffer.from(text.subarray(release));
    return out;
  }
}

/** `text` (a header value, as latin1 bytes) with every value replaced. */
export function redactText(text: string, redactions: readonly Redaction[]): string {
  const parts = new StreamRedactor(redactions).push(Buffer.from(text, 'latin1'), true);
  return Buffer.concat(parts).toString('latin1');
}
