const EMPTY = Buffer.alloc(0);

/**
 * Bytes that arrive in pieces and are read as one run (a request head, a ClientHello). Each
 * piece is copied once into a buffer that doubles as it fills, so n bytes cost O(n) in all;
 * joining every piece onto all before it would cost O(n) per piece, and a client sending a
 * byte at a time would make us copy its whole bounded head once per byte.
 *
 * A run handed out stays valid and unchanged: later pieces go after its end or into a new buffer.
 */
export class ArrivingBytes {
  private storage: Buffer = EMPTY;
  private length = 0;
  /** Whether `storage` is ours to write after `length` (not a caller's buffer). */
  private owned = false;

  /** Everything so far. */
  get bytes(): Buffer {
    return this.storage.subarray(0, this.length);
  }

  /** Adds a piece; returns everything so far. */
  append(piece: Buffer): Buffer {
    if (this.length === 0) return this.restart(piece);
    const needed = this.length + piece.length;
    if (!this.owned || needed > this.storage.length) {
      const grown = Buffer.allocUnsafe(Math.max(2 * needed, 4096));
      this.storage.copy(grown, 0, 0, this.length);
      this.storage = grown;
      this.owned = true;
    }
    piece.copy(this.storage, this.length);
    this.length = needed;
    return this.bytes;
  }

  /**
   * Adds a piece whose buffer its caller may reuse once this returns (a pooled read buffer):
   * nothing kept refers to it.
   */
  appendCopy(piece: Buffer): Buffer {
    return this.length === 0 ? this.restart(Buffer.from(piece)) : this.append(piece);
  }

  /** Starts over from `bytes` (what is left after the front was used), without copying it. */
  restart(bytes: Buffer = EMPTY): Buffer {
    this.storage = bytes;
    this.length = bytes.length;
    this.owned = false;
    return bytes;
  }
}
