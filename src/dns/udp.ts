import dgram from 'node:dgram';
import net from 'node:net';
import { type LoadedAddon, loadAddon } from '../process/index.js';
import { parseIP } from '../policy/index.js';

/**
 * How the interceptor reads and writes UDP. `batched`: native/udp_batch.c, up to 64 datagrams
 * per system call and per call into JavaScript (recvmmsg, sendmmsg); `dgram`: node:dgram, one of
 * each per datagram. Both give the responder the same bytes; an IPv4 peer of an IPv6 socket is
 * `a.b.c.d` from batched and `::ffff:a.b.c.d` from dgram.
 */
export type UdpIo = 'batched' | 'dgram';
/** `auto`: batched where the addon is built and loads, else dgram. */
export type UdpIoSetting = 'auto' | 'dgram';

/**
 * Longest UDP query answered. A query is one question and an OPT record; even padded (RFC 8467
 * pads queries to 128-byte blocks) it is far below this. Longer datagrams are dropped unread.
 */
export const MAX_UDP_QUERY = 4096;

export interface UdpListenerOptions {
  readonly io: UdpIoSetting;
  /** The answer to send back to `source`, or undefined for none. Must not throw. */
  readonly respond: (
    message: Buffer,
    source: string,
  ) => Buffer | undefined | Promise<Buffer | undefined>;
  /** A datagram longer than MAX_UDP_QUERY arrived and was dropped. */
  readonly onOversize: (source: string, length: number) => void;
  /** An answer could not be sent (the client vanished, a full send buffer): UDP drops it. */
  readonly onSendError: (error: Error) => void;
}

export interface UdpListener {
  readonly port: number;
  readonly io: UdpIo;
  close(): Promise<void>;
}

/** Binds UDP on host:port (port 0: any free port) and answers every datagram with `respond`. */
export async function listenUdp(
  host: string,
  port: number,
  options: UdpListenerOptions,
): Promise<UdpListener> {
  const loaded = options.io === 'auto' ? batchedUdp() : undefined;
  const addon = loaded !== undefined && 'addon' in loaded ? loaded.addon : undefined;
  return addon
    ? new BatchedUdpListener(addon, host, port, options)
    : await listenDgram(host, port, options);
}

/** Why `auto` means dgram on this machine, or undefined when batched UDP is available. */
export function batchedUdpUnavailable(): string | undefined {
  const loaded = batchedUdp();
  return 'problem' in loaded ? loaded.problem : undefined;
}

interface OpenedSocket {
  readonly handle: unknown;
  readonly port: number;
  readonly received: Buffer;
  readonly receivedMeta: Buffer;
  readonly replies: Buffer;
  readonly replyMeta: Buffer;
}

interface UdpBatchAddon {
  open(host: string, port: number, onBatch: (count: number) => void): OpenedSocket;
  send(handle: unknown, count: number): { failed: number; code: string } | undefined;
  close(handle: unknown, onClosed: () => void): void;
}

/** Must match native/udp_batch.c. */
const BATCH = 64;
const SLOT = MAX_UDP_QUERY;
const META = 8;

let loaded: LoadedAddon<UdpBatchAddon> | undefined;

function batchedUdp(): LoadedAddon<UdpBatchAddon> {
  loaded ??= loadAddon('moat_udp_batch', 'udp_batch.c', 'batched UDP (recvmmsg, sendmmsg)');
  return loaded;
}

class BatchedUdpListener implements UdpListener {
  readonly io = 'batched';
  readonly port: number;
  private readonly socket: OpenedSocket;
  private readonly receivedMeta: Int32Array;
  private readonly replyMeta: Int32Array;
  private readonly receivedBytes: Uint8Array;
  /** IPv4 sources as text by their 32 bits: the same few sandboxes ask again and again. */
  private readonly sourceText = new Map<number, string>();
  private closed: Promise<void> | undefined;

  constructor(
    private readonly addon: UdpBatchAddon,
    host: string,
    port: number,
    private readonly options: UdpListenerOptions,
  ) {
    this.socket = addon.open(host, port, (count) => this.answerBatch(count));
    this.port = this.socket.port;
    const int32s = (buffer: Buffer) =>
      new Int32Array(buffer.buffer, buffer.byteOffset, buffer.length / 4);
    this.receivedMeta = int32s(this.socket.receivedMeta);
    this.replyMeta = int32s(this.socket.replyMeta);
    this.receivedBytes = this.socket.receivedMeta;
  }

  close(): Promise<void> {
    this.closed ??= new Promise((resolve) => this.addon.close(this.socket.handle, resolve));
    return this.closed;
  }

  private answerBatch(count: number): void {
    const { received, replies } = this.socket;
    let staged = 0;
    let offset = 0;
    for (let i = 0; i < count; i++) {
      const row = i * META;
      const length = this.receivedMeta[row]!;
      const source = this.sourceOf(row);
      if (length > SLOT) {
        this.options.onOversize(source, length);
        continue;
      }
      // A copy: an answer that waits for upstream outlives this batch's buffer.
      const message = Buffer.from(received.subarray(i * SLOT, i * SLOT + length));
      const reply = this.options.respond(message, source);
      // Port 0 cannot be answered (a raw socket can send from it); nor can a silent query.
      if (reply === undefined || this.receivedMeta[row + 2] === 0) continue;
      if (reply instanceof Promise) {
        const peer = this.receivedMeta.slice(row, row + META);
        void reply.then((late) => {
          if (late !== undefined && this.closed === undefined && this.stage(0, 0, late, peer, 0))
            this.send(1);
        });
        continue;
      }
      if (staged === BATCH || offset + reply.length > replies.length) {
        this.send(staged);
        staged = 0;
        offset = 0;
      }
      if (this.stage(staged, offset, reply, this.receivedMeta, row)) {
        offset += reply.length;
        staged++;
      }
    }
    if (staged > 0) this.send(staged);
  }

  /** Puts a reply to the peer in `peer[row..]` at reply slot `index`; false if it cannot go. */
  private stage(index: number, offset: number, reply: Buffer, peer: Int32Array, row: number) {
    if (reply.length > this.socket.replies.length) {
      this.options.onSendError(new Error(`a ${reply.length}-byte answer is too long for UDP`));
      return false;
    }
    reply.copy(this.socket.replies, offset);
    const to = index * META;
    this.replyMeta[to] = reply.length;
    for (let k = 1; k < META; k++) this.replyMeta[to + k] = peer[row + k]!;
    return true;
  }

  private send(count: number): void {
    const failure = this.addon.send(this.socket.handle, count);
    if (failure !== undefined) {
      const error = new Error(`${failure.failed} of ${count} answers not sent (${failure.code})`);
      this.options.onSendError(Object.assign(error, { code: failure.code }));
    }
  }

  private sourceOf(row: number): string {
    const key = this.receivedMeta[row + 3]!;
    const at = (row + 3) * 4;
    const bytes = this.receivedBytes;
    if (this.receivedMeta[row + 1] === 4) {
      let text = this.sourceText.get(key);
      if (text === undefined) {
        if (this.sourceText.size >= 4096) this.sourceText.clear();
        text = `${bytes[at]}.${bytes[at + 1]}.${bytes[at + 2]}.${bytes[at + 3]}`;
        this.sourceText.set(key, text);
      }
      return text;
    }
    const groups: string[] = [];
    for (let g = 0; g < 16; g += 2)
      groups.push(((bytes[at + g]! << 8) | bytes[at + g + 1]!).toString(16));
    const expanded = groups.join(':');
    const parsed = parseIP(expanded);
    const text = parsed.ok ? parsed.value.text : expanded;
    // A link-local peer's scope: its interface index (node:dgram gives the interface's name).
    const scope = this.receivedMeta[row + 7]!;
    return scope === 0 ? text : `${text}%${scope}`;
  }
}

async function listenDgram(
  host: string,
  port: number,
  options: UdpListenerOptions,
): Promise<UdpListener> {
  const udp = dgram.createSocket({ type: net.isIPv6(host) ? 'udp6' : 'udp4' });
  let closing = false;
  udp.on('message', (message, from) => {
    if (message.length > MAX_UDP_QUERY) return options.onOversize(from.address, message.length);
    const send = (reply: Buffer | undefined) => {
      // Port 0 cannot be answered (a raw socket can send from it), and dgram throws for it.
      if (reply === undefined || from.port === 0 || closing) return;
      try {
        udp.send(reply, from.port, from.address);
      } catch (error) {
        options.onSendError(error as Error);
      }
    };
    const reply = options.respond(message, from.address);
    if (reply instanceof Promise) void reply.then(send);
    else send(reply);
  });
  await new Promise<void>((resolve, reject) => {
    udp.once('error', reject);
    udp.bind(port, host, () => {
      udp.off('error', reject);
      // A send error (e.g. the client vanished) must never end the listener.
      udp.on('error', options.onSendError);
      resolve();
    });
  });
  const closed = new Promise<void>((resolve) => udp.once('close', resolve));
  return {
    port: udp.address().port,
    io: 'dgram',
    close: () => {
      if (!closing) udp.close();
      closing = true;
      return closed;
    },
  };
}
