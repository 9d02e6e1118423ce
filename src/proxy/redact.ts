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

/** The values of one request, ready to be searched for (built once, used for head and body). */
export class SecretRedaction {
  /** Longest first, so that a tie at one position goes to the longest value. */
  readonly needles: readonly Needle[];
  readonly longest: number;
  /** Each value's bytes as latin1 text, lower-cased (header names are read as latin1). */
  private readonly lowerValues: readonly string[];

  constructor(redactions: readonly Redaction[]) {
    this.needles = redactions
      .filter((r) => r.value !== '')
      .map((r) => ({
        bytes: Buffer.from(r.value, 'utf8'),
        placeholder: Buffer.from(r.placeholder),
      }))
      .sort((a, b) => b.bytes.length - a.bytes.length);
    this.longest = this.needles[0]?.bytes.length ?? 0;
    this.lowerValues = this.needles.map((needle) => needle.bytes.toString('latin1').toLowerCase());
  }

  /**
   * Whether a header name holds a value, in any ASCII case (names are case-insensitive, and an
   * origin may well echo them lower-cased). Such a field is dropped: a placeholder is no token.
   */
  inName(name: string): boolean {
    const lower = name.toLowerCase();
    return this.lowerValues.some((value) => lower.includes(value));
  }

  /** A redactor for one stream (a response body). */
  stream(): StreamRedactor {
    return new StreamRedactor(this);
  }

  /** `text` (a header value or status line, as latin1 bytes) with every value replaced. */
  text(text: string): string {
    const parts = this.stream().push(Buffer.from(text, 'latin1'), true);
    return Buffer.concat(parts).toString('latin1');
  }
}

/**
 * Replaces values in a stream cut anywhere: each occurrence, leftmost first and the longest value
 * where several start at one byte, exactly as if the whole stream had arrived at once. It holds
 * back at most the longest value's length less one byte between pushes (the look-behind).
 */
export class StreamRedactor {
  private held: Buffer = Buffer.alloc(0);

  constructor(private readonly redaction: SecretRedaction) {}

  /** The redacted bytes that can be released after `chunk`; `end`: nothing more will come. */
  push(chunk: Buffer, end = false): Buffer[] {
    const { needles, longest } = this.redaction;
    const text = this.held.length === 0 ? chunk : Buffer.concat([this.held, chunk]);
    // A value can start at a position only once all its bytes could have arrived.
    const settled = end ? text.length : Math.max(0, text.length - longest + 1);
    const out: Buffer[] = [];
    let at = 0;
    for (;;) {
      let found = -1;
      let needle: Needle | undefined;
      for (const candidate of needles) {
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
