/**
 * The load client of `npm run bench:tls`, run as its own process (forked by bench/tls.ts). The
 * same code drives Moat and squid: TCP connect to the proxy, CONNECT <name>:<origin port> with
 * Proxy-Authorization (squid ignores it), Node's TLS client over the tunnel with SNI <name>,
 * verifying the certificate against the proxies' CA (intercepted) or the origin's (opaque),
 * then small GETs read with bench:proxy's response reader. One TLS context per trust, made
 * once; no session is resumed (every new connection is a full handshake).
 *
 * Jobs (over IPC, answered with `{ result }`), see TlsJob in tls-common.ts: `connections`
 * (one GET per connection, closed loop), `keepalive` (GETs back to back on open connections),
 * `check` (one GET, the answer's head).
 *
 * argv: <proxy CA file> <origin CA file> <origin port> <lifetime seconds>. Every loop is
 * bounded in time and count, every socket has a timeout; exits when the parent disconnects.
 */
import { readFileSync } from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import { type ClosedLoopResult, ResponseReader, summarise } from './proxy-common.js';
import {
  BENCH_SANDBOX_ID,
  BENCH_SECRET,
  type CheckResult,
  type TlsJob,
  type Trust,
} from './tls-common.js';
import { endWithParent } from './lib/procs.js';
import type { HostPort } from '../src/net/index.js';

const SOCKET_TIMEOUT_MS = 5000;
/** After this many errors a job stops early (something is broken; no point hammering on). */
const MAX_ERRORS = 500;
const MAX_SAMPLES = 1_000_000;

const [proxyCaFile = '', originCaFile = '', portText = '', lifetimeText = '900'] =
  process.argv.slice(2);
const originPort = Number(portText);
const contexts: Record<Trust, tls.SecureContext> = {
  proxy: tls.createSecureContext({ ca: readFileSync(proxyCaFile, 'utf8') }),
  origin: tls.createSecureContext({ ca: readFileSync(originCaFile, 'utf8') }),
};
const auth = `Proxy-Authorization: Basic ${Buffer.from(`${BENCH_SANDBOX_ID}:${BENCH_SECRET}`).toString('base64')}\r\n`;
const connectRequest = (name: string) =>
  `CONNECT ${name}:${originPort} HTTP/1.1\r\nHost: ${name}:${originPort}\r\n${auth}\r\n`;
const getRequest = (name: string, close: boolean) =>
  `GET / HTTP/1.1\r\nHost: ${name}:${originPort}\r\nUser-Agent: moat-bench\r\n` +
  `${close ? 'Connection: close\r\n' : ''}\r\n`;
const CRLF2 = Buffer.from('\r\n\r\n');

const now = () => performance.now();

class Samples {
  readonly values: Float64Array;
  count = 0;
  constructor(capacity: number) {
    this.values = new Float64Array(capacity);
  }
  add(value: number): void {
    if (this.count < this.values.length) this.values[this.count++] = value;
  }
}

class Errors {
  count = 0;
  first: string | undefined;
  add(message: string): void {
    this.count++;
    this.first ??= message;
  }
}

/** A TLS connection through the proxy's CONNECT tunnel to `name`; calls back once. */
function open(
  proxy: HostPort,
  name: string,
  trust: Trust,
  done: (error: string | undefined, secure: tls.TLSSocket | undefined) => void,
): void {
  const socket = net.connect({ host: proxy.host, port: proxy.port, noDelay: true });
  let finished = false;
  let secure: tls.TLSSocket | undefined;
  const finish = (error: string | undefined) => {
    if (finished) return;
    finished = true;
    clearTimeout(timer);
    if (error !== undefined) {
      secure?.destroy();
      socket.destroy();
    }
    done(error, error === undefined ? secure : undefined);
  };
  const timer = setTimeout(() => finish('timeout opening the connection'), SOCKET_TIMEOUT_MS);
  let head: Buffer | undefined;
  const onData = (chunk: Buffer) => {
    const data = head === undefined ? chunk : Buffer.concat([head, chunk]);
    const end = data.indexOf(CRLF2);
    if (end < 0) {
      if (data.length > 16 * 1024) finish('CONNECT answer head too long');
      head = data;
      return;
    }
    const status = Number(data.toString('latin1', 9, 12));
    if (status !== 200)
      return finish(`CONNECT answered ${data.toString('latin1', 0, Math.min(end, 200))}`);
    if (data.length > end + 4) return finish('bytes after the CONNECT answer');
    socket.off('data', onData);
    socket.pause();
    secure = tls.connect({ socket, servername: name, secureContext: contexts[trust] });
    secure.once('secureConnect', () => finish(undefined));
    secure.once('error', (error: NodeJS.ErrnoException) =>
      finish(`TLS: ${error.code ?? error.message}`),
    );
  };
  socket.on('error', (error: NodeJS.ErrnoException) => finish(error.code ?? error.message));
  socket.once('close', () => finish('closed while opening'));
  socket.on('data', onData);
  socket.write(connectRequest(name));
}

/** Sends one GET on an open connection and reads its answer; calls back once with the head. */
function get(
  secure: tls.TLSSocket,
  request: string,
  done: (error: string | undefined, head: string) => void,
): void {
  const reader = new ResponseReader();
  let finished = false;
  const finish = (error: string | undefined) => {
    if (finished) return;
    finished = true;
    clearTimeout(timer);
    secure.off('data', onData).off('close', onClose).off('error', onError);
    done(error, reader.head);
  };
  const timer = setTimeout(() => finish('timeout waiting for the answer'), SOCKET_TIMEOUT_MS);
  const onData = (chunk: Buffer) => {
    const outcome = reader.push(chunk);
    if (outcome === 'more') return;
    if (outcome !== 'done') return finish(outcome);
    if (reader.status !== 200) return finish(`GET answered ${reader.head.split('\r\n')[0]}`);
    if (reader.rest !== undefined) return finish('bytes after the answer');
    finish(undefined);
  };
  const onClose = () => finish('closed before the answer was complete');
  const onError = (error: NodeJS.ErrnoException) => finish(error.code ?? error.message);
  secure.on('data', onData).once('close', onClose).once('error', onError);
  secure.write(request);
}

/** One new connection carrying one GET (Connection: close); calls back with its duration. */
function once(
  proxy: HostPort,
  name: string,
  trust: Trust,
  done: (error: string | undefined, ms: number) => void,
): void {
  const started = now();
  open(proxy, name, trust, (error, secure) => {
    if (error !== undefined || secure === undefined) return done(error ?? 'no connection', 0);
    get(secure, getRequest(name, true), (failed) => {
      secure.destroy();
      done(failed, now() - started);
    });
  });
}

function result(
  completed: number,
  seconds: number,
  errors: Errors,
  samples: Samples,
): ClosedLoopResult {
  return {
    completed,
    perSecond: completed / seconds,
    errors: errors.count,
    firstError: errors.first,
    latency: summarise(samples.values, samples.count),
  };
}

async function connections(job: Extract<TlsJob, { type: 'connections' }>) {
  const samples = new Samples(MAX_SAMPLES);
  const errors = new Errors();
  const start = now();
  const end = start + job.seconds * 1000;
  let completed = 0;
  let next = 0;
  let last = start;
  const worker = () =>
    new Promise<void>((resolve) => {
      const step = () => {
        if (now() >= end || errors.count >= MAX_ERRORS) return resolve();
        if (job.once && next >= job.names.length) return resolve();
        const name = job.names[next++ % job.names.length]!;
        once(job.proxy, name, job.trust, (error, ms) => {
          if (error !== undefined) {
            errors.add(`${name}: ${error}`);
            // A short pause, so that a broken setup does not spin.
            return void setTimeout(step, 10);
          }
          if (now() <= end) {
            completed++;
            samples.add(ms);
            last = now();
          }
          step();
        });
      };
      step();
    });
  await Promise.all(Array.from({ length: job.concurrency }, worker));
  // Each name once: the rate over the time it took (to the last answer).
  const seconds = job.once ? Math.max(1e-3, (last - start) / 1000) : job.seconds;
  return result(completed, seconds, errors, samples);
}

async function keepalive(job: Extract<TlsJob, { type: 'keepalive' }>) {
  const errors = new Errors();
  const opened = await Promise.all(
    Array.from(
      { length: job.connections },
      () =>
        new Promise<tls.TLSSocket | undefined>((resolve) =>
          open(job.proxy, job.name, job.trust, (error, secure) => {
            if (error !== undefined) errors.add(`opening: ${error}`);
            resolve(secure);
          }),
        ),
    ),
  );
  const sockets = opened.filter((s): s is tls.TLSSocket => s !== undefined);
  const samples = new Samples(MAX_SAMPLES);
  const request = getRequest(job.name, false);
  const start = now();
  const end = start + job.seconds * 1000;
  let completed = 0;
  await Promise.all(
    sockets.map(
      (secure) =>
        new Promise<void>((resolve) => {
          const step = () => {
            if (now() >= end || errors.count >= MAX_ERRORS) return resolve();
            const sent = now();
            get(secure, request, (error) => {
              if (error !== undefined) {
                errors.add(error);
                return resolve();
              }
              if (now() <= end) {
                completed++;
                samples.add(now() - sent);
              }
              step();
            });
          };
          step();
        }),
    ),
  );
  for (const secure of sockets) secure.destroy();
  return result(completed, job.seconds, errors, samples);
}

function check(job: Extract<TlsJob, { type: 'check' }>): Promise<CheckResult> {
  return new Promise((resolve) =>
    open(job.proxy, job.name, job.trust, (error, secure) => {
      if (error !== undefined || secure === undefined)
        return resolve({ error: error ?? 'no connection' });
      get(secure, getRequest(job.name, true), (failed, head) => {
        secure.destroy();
        resolve(failed === undefined ? { head } : { error: failed });
      });
    }),
  );
}

process.on('message', (message: { job?: TlsJob }) => {
  const job = message?.job;
  if (job === undefined) return;
  const run =
    job.type === 'connections'
      ? connections(job)
      : job.type === 'keepalive'
        ? keepalive(job)
        : check(job);
  run.then(
    (value) => process.send?.({ result: value }),
    (error: unknown) => process.send?.({ result: { error: String(error) } }),
  );
});
endWithParent(Number(lifetimeText));
process.send?.({ ready: true });
