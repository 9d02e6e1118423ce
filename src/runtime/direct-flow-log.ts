/**
 * The kernel's record of direct flows: each sandbox's firewall logs the first packet of every
 * flow it lets out directly or refuses (to an NFLOG group in its own namespace, rate-limited
 * there), and one reader process (supervisor/flow_log.py) for all namespaces hands them here, a
 * line each. Moat pays per flow, never per packet, and nothing when no sandbox makes one.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { FLOW_LOG, PYTHON } from './supervisor.js';

/** The NFLOG group of the firewall's log statements (each namespace has its own groups). */
export const FLOW_LOG_GROUP = 7;
/** A line is about 80 bytes; anything longer is not the reader's. */
const MAX_LINE = 1024;

export interface DirectFlow {
  readonly sandboxID: string;
  readonly verdict: 'allow' | 'deny';
  readonly protocol: 'tcp' | 'udp' | 'icmp' | 'other';
  readonly address: string;
  /** 0 for a protocol without ports. */
  readonly port: number;
}

const LINE =
  /^([a-z0-9]{1,64}) (allow|deny) (tcp|udp|icmp|other) (\d{1,3}(?:\.\d{1,3}){3}) (\d{1,5})$/;

export class DirectFlowLog {
  private readonly child: ChildProcess;
  private pending = '';
  private closing = false;

  constructor(onFlow: (flow: DirectFlow) => void, onProblem: (message: string) => void) {
    this.child = spawn(PYTHON, ['-I', '-S', '-B', FLOW_LOG, String(FLOW_LOG_GROUP)], {
      stdio: ['pipe', 'pipe', 'pipe'],
      // Its own process group: a terminal's Ctrl-C reaches Moat, which ends it, not the reader
      // (Python's KeyboardInterrupt traceback in the middle of a clean stop).
      detached: true,
    });
    this.child.on('error', (error) => onProblem(`the flow log reader: ${error.message}`));
    this.child.on('exit', (code, signal) => {
      if (!this.closing && (code !== 0 || signal !== null))
        onProblem(`the flow log reader ended (${signal ?? code}); direct flows go unrecorded`);
    });
    this.child.stdin!.on('error', () => undefined);
    this.child
      .stderr!.setEncoding('utf8')
      .on('data', (text: string) => onProblem(`the flow log reader: ${text.trim().slice(0, 500)}`));
    this.child.stdout!.setEncoding('latin1').on('data', (text: string) => {
      const lines = (this.pending + text).split('\n');
      this.pending = lines.pop()!.slice(-MAX_LINE);
      for (const line of lines) {
        const match = LINE.exec(line);
        if (match === null) {
          if (/ error /.test(line)) onProblem(`the flow log reader: ${line.slice(0, 200)}`);
          continue;
        }
        onFlow({
          sandboxID: match[1]!,
          verdict: match[2] as DirectFlow['verdict'],
          protocol: match[3] as DirectFlow['protocol'],
          address: match[4]!,
          port: Number(match[5]),
        });
      }
    });
  }

  /** Starts reading the log of `sandboxID`'s namespace (its file under /run/netns). */
  add(sandboxID: string, namespaceFile: string): void {
    this.child.stdin!.write(`add ${sandboxID} ${namespaceFile}\n`);
  }

  remove(sandboxID: string): void {
    this.child.stdin!.write(`remove ${sandboxID}\n`);
  }

  close(): void {
    this.closing = true;
    this.child.stdin!.end();
    this.child.kill();
  }
}
