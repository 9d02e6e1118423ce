import { MAX_PEEK_BYTES, readClientHello, readServerHello } from './peek.js';
import type { Checked, TunnelGuard } from './splice.js';

const EMPTY = Buffer.alloc(0);
const CHANGE_CIPHER_SPEC = 0x14;
const ALERT = 0x15;
const APPLICATION_DATA = 0x17;

/**
 * The TLS record at the start of `data` if it is one of `types`: its length when it is all
 * here, 'partial' while it is still arriving, undefined when it is not such a record.
 */
function leadingRecord(data: Buffer, types: readonly number[]): number | 'partial' | undefined {
  if (data.length === 0 || !types.includes(data[0]!)) return undefined;
  if (data.length < 3) return data.length < 2 || data[1] === 0x03 ? 'partial' : undefined;
  if (data[1] !== 0x03 || data[2]! > 0x04) return undefined;
  if (data.length < 5) return 'partial';
  const length = 5 + data.readUInt16BE(3);
  return length <= data.length ? length : 'partial';
}

/**
 * Checks every ClientHello a TLS server acts on, not only the first. A TLS 1.3 server that
 * answers with a HelloRetryRequest reads a second ClientHello, and a server that routes by name
 * could follow that one to another host. So after the first ClientHello (checked, then passed)
 * the client's handshake records wait until the server's first answer shows: a
 * HelloRetryRequest makes the next ClientHello pass the same check before any of it goes on;
 * any other answer ends the watch. Legitimate clients send no handshake record in that window
 * (early data and change_cipher_spec are other record types, and pass).
 */
export class TlsHelloGuard implements TunnelGuard {
  private state: 'first' | 'answer' | 'second' | 'done' = 'first';
  /** Client bytes not passed yet. */
  private held: Buffer = EMPTY;
  /** The server's bytes until its first handshake message shows. */
  private answer: Buffer = EMPTY;

  /** `problem` says why a ClientHello's server name (undefined: none) is not the tunnel's. */
  constructor(private readonly problem: (name: string | undefined) => string | undefined) {}

  fromClient(chunk: Buffer): Checked {
    if (this.state === 'done') return { pass: chunk };
    this.held = this.held.length === 0 ? chunk : Buffer.concat([this.held, chunk]);
    return this.advance();
  }

  fromUpstream(chunk: Buffer): Checked {
    if (this.state !== 'answer') return { pass: EMPTY };
    this.answer = this.answer.length === 0 ? chunk : Buffer.concat([this.answer, chunk]);
    const answer = readServerHello(this.answer);
    if (answer === 'incomplete' && this.answer.length <= MAX_PEEK_BYTES) return { pass: EMPTY };
    this.answer = EMPTY;
    if (answer === 'retry') {
      this.state = 'second';
      return this.advance();
    }
    this.state = 'done';
    const held = this.held;
    this.held = EMPTY;
    return { pass: held };
  }

  /** Passes what the current state lets through, holding the rest. */
  private advance(): Checked {
    const passed: Buffer[] = [];
    const take = (length: number) => {
      passed.push(this.held.subarray(0, length));
      this.held = this.held.subarray(length);
    };
    for (;;) {
      if (this.state === 'first' || this.state === 'second') {
        // Before the second ClientHello may come change_cipher_spec (middlebox compatibility),
        // the rest of early data sent before the retry arrived (the server skips it), and an
        // alert (a client giving up; a warning one would not stop a lenient server reading on,
        // so the watch goes on).
        const skipped =
          this.state === 'second'
            ? leadingRecord(this.held, [CHANGE_CIPHER_SPEC, ALERT, APPLICATION_DATA])
            : undefined;
        if (skipped === 'partial') break;
        if (skipped !== undefined) {
          take(skipped);
          continue;
        }
        const hello = readClientHello(this.held);
        if (hello.status === 'invalid') return { problem: hello.reason };
        if (hello.status === 'incomplete') break;
        const problem = this.problem(hello.name);
        if (problem !== undefined) return { problem };
        take(hello.end);
        this.state = this.state === 'first' ? 'answer' : 'done';
        if (this.state === 'done') take(this.held.length);
        continue;
      }
      if (this.state === 'answer') {
        const record = leadingRecord(this.held, [CHANGE_CIPHER_SPEC, ALERT, APPLICATION_DATA]);
        if (typeof record !== 'number') break;
        take(record);
        continue;
      }
      break;
    }
    // The ClientHello reader bounds a hello; this bounds what waits for the server's answer.
    if (this.held.length > MAX_PEEK_BYTES)
      return { problem: 'the client sent over 64 KiB before the server answered its ClientHello' };
    return { pass: passed.length === 1 ? passed[0]! : Buffer.concat(passed) };
  }
}
