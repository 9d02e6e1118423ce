/**
 * One long-lived `nft -i` per network namespace. Each line it reads is one transaction, applied
 * whole or not at all; after each line we ask for a fixed one-line description, so everything
 * printed before that answer is the line's error output.
 *
 * Why not `nft -f` per change: closing nft's netlink socket after a set change waits for the
 * kernel to finish releasing the old set data (about 10-15 ms here, measured with strace), long
 * after the change itself is live. A session keeps the socket open and applies a policy change
 * in well under a millisecond.
 */
import { type ChildProcessWithoutNullStreams, execFile, spawn } from 'node:child_process';
import { promisify } from 'node:util';

export const NFT = '/usr/sbin/nft';
export const NSENTER = '/usr/bin/nsenter';

/** A command that changes nothing and prints one fixed line (read once per session). */
const ACK_COMMAND = 'describe meta mark';
const TIMEOUT_MS = 5000;

/** `nft list tables <family>` in Moat's own network namespace. */
export async function listNftTables(family: 'inet' | 'ip' | 'ip6'): Promise<string> {
  const { stdout } = await promisify(execFile)(NFT, ['list', 'tables', family], {
    timeout: TIMEOUT_MS,
  });
  return stdout;
}

interface Waiting {
  /** With what nft printed before the acknowledgement (trimmed). */
  readonly resolve: (printed: string) => void;
  readonly reject: (error: Error) => void;
}

export class NftSession {
  private child: ChildProcessWithoutNullStreams | undefined;
  private output = '';
  /** The line ACK_COMMAND prints, learned from the session's first answer. */
  private ackLine: string | undefined;
  private readonly waiting: Waiting[] = [];
  private tail: Promise<void> = Promise.resolve();

  /** `netns`: the namespace file to run in (`/run/netns/<name>`), or undefined for Moat's own. */
  constructor(
    private readonly netns: string | undefined,
    private readonly where: string,
  ) {}

  /** Applies one transaction; rejects with nft's message when it was refused. */
  async run(commands: string): Promise<void> {
    const printed = await this.queued(commands);
    if (printed !== '') throw this.refused(printed);
  }

  /** What a listing command (`list counters ...`) prints; rejects with nft's message on an error. */
  async read(command: string): Promise<string> {
    const printed = await this.queued(command);
    if (/^Error:/m.test(printed)) throw this.refused(printed);
    return printed;
  }

  private queued(commands: string): Promise<string> {
    if (commands.includes('\n')) throw new Error('nft commands must be one line');
    const result = this.tail.then(() => this.send(commands));
    this.tail = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }

  private refused(printed: string): Error {
    return new Error(`nft in ${this.where} refused the change: ${printed.slice(0, 800)}`);
  }

  /** Ends the session; changes still waiting are reported as failed. */
  close(why = 'the session was closed'): void {
    const child = this.child;
    this.child = undefined;
    this.failAll(new Error(`nft in ${this.where}: ${why}`));
    child?.kill('SIGKILL');
  }

  private start(): ChildProcessWithoutNullStreams {
    const shell = ['/bin/sh', '-c', `exec ${NFT} -i 2>&1`];
    const argv = this.netns ? [NSENTER, `--net=${this.netns}`, '--', ...shell] : shell;
    // Its own process group: a terminal's Ctrl-C must not end a session Moat's stop still uses.
    const child = spawn(argv[0]!, argv.slice(1), { stdio: 'pipe', detached: true });
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => this.onOutput(chunk));
    child.stderr.resume();
    child.stdin.on('error', () => undefined);
    const gone = (why: string) => {
      if (this.child !== child) return;
      this.child = undefined;
      this.failAll(new Error(`nft in ${this.where} ended (${why}) before it answered`));
    };
    child.on('error', (error) => gone(error.message));
    child.on('close', (code, signal) => gone(signal ?? `exit ${code}`));
    this.child = child;
    this.ackLine = undefined;
    this.output = '';
    child.stdin.write(`${ACK_COMMAND}\n`);
    return child;
  }

  private send(commands: string): Promise<string> {
    const child = this.child ?? this.start();
    return new Promise<string>((resolve, reject) => {
      // A hung nft is replaced by the next change; this one is reported as failed.
      const timer = setTimeout(() => this.close(`no answer within ${TIMEOUT_MS} ms`), TIMEOUT_MS);
      this.waiting.push({
        resolve: (printed) => {
          clearTimeout(timer);
          resolve(printed);
        },
        reject: (error) => {
          clearTimeout(timer);
          reject(error);
        },
      });
      child.stdin.write(`${commands}\n${ACK_COMMAND}\n`);
    });
  }

  private onOutput(chunk: string): void {
    this.output += chunk;
    if (this.ackLine === undefined) {
      const end = this.output.indexOf('\n');
      if (end < 0) return;
      this.ackLine = this.output.slice(0, end);
      this.output = this.output.slice(end + 1);
    }
    const ack = `${this.ackLine}\n`;
    for (;;) {
      const at = this.output.indexOf(ack);
      if (at < 0) return;
      const before = this.output.slice(0, at).trim();
      this.output = this.output.slice(at + ack.length);
      this.waiting.shift()?.resolve(before);
    }
  }

  private failAll(error: Error): void {
    this.output = '';
    for (const waiter of this.waiting.splice(0)) waiter.reject(error);
  }
}
