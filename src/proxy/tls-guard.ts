import { ArrivingBytes } from '../net/index.js';
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
  private readonly held = new ArrivingBytes();
  /** The server's bytes until its first handshake message shows. */
  private readonly answer = new ArrivingBytes();

  /** `problem` says why a ClientHello's server name (undefined: none) is not the tunnel's. */
  constructor(private readonly problem: (name: string | undefined) => string | undefined) {}

  /** The server answered without a retry, or the second ClientHello passed: nothing to hold. */
  get done(): boolean {
    return this.state === 'done';
  }

  /** Only the server's first answer is read (client handshake records wait for it). */
  get watchesUpstream(): boolean {
    return this.state === 'answer';
  }

  fromClient(chunk: Buffer): Checked {
    if (this.state === 'done') return { pass: chunk };
    return this.advance(this.held.append(chunk));
  }

  fromUpstream(chunk: Buffer): Checked {
    if (this.state !== 'answer') return { pass: EMPTY };
    // Upstream reads may land in pooled buffers, reused once the chunk has gone on.
    const seen = this.answer.appendCopy(chunk);
    const answer = readServerHello(seen);
    if (answer === 'incomplete' && seen.length <= MAX_PEEK_BYTES) return { pass: EMPTY };
    this.answer.restart();
    if (answer === 'retry') {
      this.state = 'second';
      return this.advance(this.held.bytes);
    }
    this.state = 'done';
    const held = this.held.bytes;
    this.held.restart();
    return { pass: held };
  }

  /** Passes what the current state lets through of `held` (all not passed yet), holding the rest. */
  private advance(held: Buffer): Checked {
    const passed: Buffer[] = [];
    let rest = held;
    const take = (length: number) => {
      passed.push(rest.subarray(0, length));
      rest = rest.subarray(length);
    };
    for (;;) {
      if (this.state === 'first' || this.state === 'second') {
        // Before the second ClientHello may come change_cipher_spec (middlebox compatibility),
        // the rest of early data sent before the retry arrived (the server skips it), and an
        // alert (a client giving up; a warning one would not stop a lenient server reading on,
        // so the watch goes on).
        const skipped =
          this.state === 'second'
            ? leadingRecord(rest, [CHANGE_CIPHER_SPEC, ALERT, APPLICATION_DATA])
            : undefined;
        if (skipped === 'partial') break;
        if (skipped !== undefined) {
          take(skipped);
          continue;
        }
        const hello = readClientHello(rest);
        if (hello.status === 'invalid') return { problem: hello.reason };
        if (hello.status === 'incomplete') break;
        const problem = this.problem(hello.name);
        if (problem !== undefined) return { problem };
        take(hello.end);
        this.state = this.state === 'first' ? 'answer' : 'done';
        if (this.state === 'done') take(rest.length);
        continue;
      }
      if (this.state === 'answer') {
        const record = leadingRecord(rest, [CHANGE_CIPHER_SPEC, ALERT, APPLICATION_DATA]);
        if (typeof record !== 'number') break;
        take(record);
        continue;
      }
      break;
    }
    // Restarting copies the rest at the next arrival: only worth it once some was passed.
    if (rest !== held) this.held.restart(rest);
    // The ClientHello reader bounds a hello; this bounds what waits for the server's answer.
    if (rest.length > MAX_PEEK_BYTES)
      return { problem: 'the client sent over 64 KiB before the server answered its ClientHello' };
    return { pass: passed.length === 1 ? passed[0]! : Buffer.concat(passed) };
  }
}
