import { spawn } from 'node:child_process';
import type { HostPort } from '../../src/net/index.js';

/**
 * What the flooding process runs: `concurrency` loops, each opening a CONNECT tunnel through the
 * proxy to a name never asked before (`<prefix><n>.<domain>`), completing a TLS handshake over
 * it and closing, until `durationMs` or `maxNames` handshakes have been tried. Prints how many
 * handshakes completed, how many failed, and the median time of a completed one (ms). A process of its own, as a sandbox's client is: its own TLS
 * work is not done on the event loop of the Moat under test.
 */
const FLOOD = `
import net from 'node:net';
import tls from 'node:tls';
const [host, port, localAddress, auth, prefix, domain, concurrency, durationMs, maxNames] =
  process.argv.slice(1);
const until = Date.now() + Number(durationMs);
let next = 0;
let failed = 0;
const took = [];
const once = (name) =>
  new Promise((resolve) => {
    const started = performance.now();
    const socket = net.connect({ host, port: Number(port), localAddress });
    const done = (ok) => {
      socket.destroy();
      resolve(ok);
    };
    socket.once('error', () => done(false));
    socket.once('connect', () =>
      socket.write('CONNECT ' + name + ':443 HTTP/1.1\\r\\nHost: ' + name + ':443\\r\\nProxy-Authorization: Basic ' + auth + '\\r\\n\\r\\n'),
    );
    let head = '';
    const onData = (chunk) => {
      head += chunk.toString('latin1');
      if (!head.includes('\\r\\n\\r\\n')) return;
      socket.off('data', onData);
      if (!head.startsWith('HTTP/1.1 200')) return done(false);
      const secure = tls.connect({ socket, servername: name, rejectUnauthorized: false });
      secure.once('secureConnect', () => {
        took.push(performance.now() - started);
        secure.destroy();
        done(true);
      });
      secure.once('error', () => done(false));
    };
    socket.on('data', onData);
    socket.setTimeout(10000, () => done(false));
  });
const loop = async () => {
  while (Date.now() < until && next < Number(maxNames)) {
    if (!(await once(prefix + next++ + '.' + domain))) failed++;
  }
};
await Promise.all(Array.from({ length: Number(concurrency) }, loop));
took.sort((a, b) => a - b);
const medianMs = took.length === 0 ? 0 : took[Math.floor(took.length / 2)];
process.stdout.write(JSON.stringify({ handshakes: took.length, failed, medianMs }));
`;

export interface TlsFloodOptions {
  readonly proxy: HostPort;
  readonly localAddress: string;
  /** `sandboxID:secret`, sent as Proxy-Authorization. */
  readonly auth: string;
  readonly prefix: string;
  readonly domain: string;
  readonly concurrency: number;
  readonly durationMs: number;
  readonly maxNames: number;
}

/** Runs one flood of new TLS names through a proxy in a child process; bounded in time and count. */
export interface TlsFloodResult {
  readonly handshakes: number;
  readonly failed: number;
  /** Median time from connecting to the proxy to a completed handshake, ms. */
  readonly medianMs: number;
}

export function tlsFlood(options: TlsFloodOptions): Promise<TlsFloodResult> {
  const args = [
    options.proxy.host,
    String(options.proxy.port),
    options.localAddress,
    Buffer.from(options.auth).toString('base64'),
    options.prefix,
    options.domain,
    String(options.concurrency),
    String(options.durationMs),
    String(options.maxNames),
  ];
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--input-type=module', '-e', FLOOD, ...args], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.setEncoding('utf8').on('data', (text: string) => (out += text));
    const killer = setTimeout(() => child.kill('SIGKILL'), options.durationMs + 15_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(killer);
      if (code !== 0) return reject(new Error(`the TLS flood ended with ${code}: ${out}`));
      resolve(JSON.parse(out) as TlsFloodResult);
    });
  });
}
