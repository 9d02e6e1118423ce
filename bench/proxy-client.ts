/**
 * The load client of `npm run bench:proxy`, run as its own process (forked by bench/proxy.ts).
 * The same code drives Moat, squid and the direct connection: a job names where to send
 * (a proxy, or the origin itself) and the client does the same work in each case, only
 * without the proxy step when direct. Raw sockets and a small response reader, so that the
 * client costs little next to what it measures.
 *
 * Jobs (sent over IPC, answered with `{ result }`):
 * - tunnels: `concurrency` workers, each in a loop: TCP connect, CONNECT, wait for 200, one
 *   small GET (Connection: close), read the answer, close; for `seconds`. Direct: TCP connect
 *   to the origin, the same GET. Reports tunnels/s and latency of the whole iteration.
 * - rate: the same iteration started on a fixed schedule (open loop, `rate` per second), and
 *   the latency of the setup: TCP connect + CONNECT 200, or the TCP connect alone when direct,
 *   timed from the moment the connect was issued.
 * - bulk: one tunnel (or direct connection) to the bulk source, which sends `bytes` bytes;
 *   the client reads them into one reused 1 MiB buffer (socket `onread`) and drops them.
 * - get: `connections` keep-alive connections, each sending `GET http://origin/...` (absolute
 *   form, to a proxy) or `GET /` (origin form, direct) one after the other for `seconds`.
 *
 * argv: <origin ip> <origin http port> <origin bulk port> <lifetime seconds>. Every loop is
 * bounded in time and count, every socket has a timeout; exits when the parent disconnects.
 */
import net from 'node:net';
import {
  BENCH_SANDBOX_ID,
  BENCH_SECRET,
  type BulkResult,
  type ClosedLoopResult,
  type Job,
  type JobResult,
  ORIGIN_NAME,
  type RateResult,
  ResponseReader,
  summarise,
  type Via,
} from './proxy-common.js';
import { endWithParent } from './lib/procs.js';

const SOCKET_TIMEOUT_MS = 5000;
/** After this many errors a job stops early (something is broken; no point hammering on). */
const MAX_ERRORS = 2000;
/** Latency samples kept per job (more than any run here produces). */
const MAX_SAMPLES = 2_000_000;

const [originIp = '', httpPortText = '', bulkPortText = '', lifetimeText = '900'] =
  process.argv.slice(2);
const httpPort = Number(httpPortText);
const bulkPort = Number(bulkPortText);
const authority = `${ORIGIN_NAME}:${httpPort}`;
const auth = `Proxy-Authorization: Basic ${Buffer.from(`${BENCH_SANDBOX_ID}:${BENCH_SECRET}`).toString('base64')}\r\n`;
const connectRequest = (port: number) =>
  Buffer.from(
    `CONNECT ${ORIGIN_NAME}:${port} HTTP/1.1\r\nHost: ${ORIGIN_NAME}:${port}\r\n${auth}\r\n`,
    'latin1',
  );
const CONNECT_HTTP = connectRequest(httpPort);
const CONNECT_BULK = connectRequest(bulkPort);
/** The small request each tunnel carries (and the direct iteration sends). */
const TUNNEL_GET = Buffer.from(
  `GET / HTTP/1.1\r\nHost: ${authority}\r\nUser-Agent: moat-bench\r\nConnection: close\r\n\r\n`,
  'latin1',
);
const ABSOLUTE_GET = Buffer.from(
  `GET http://${authority}/ HTTP/1.1\r\nHost: ${authority}\r\nUser-Agent: moat-bench\r\n${auth}\r\n`,
  'latin1',
);
const ORIGIN_GET = Buffer.from(
  `GET / HTTP/1.1\r\nHost: ${authority}\r\nUser-Agent: moat-bench\r\n\r\n`,
  'latin1',
);
const CRLF2 = Buffer.from('\r\n\r\n');

const now = () => performance.now();

/** Where a connection goes: the proxy, or the origin port itself. */
const endpoint = (via: Via, originPort: number) =>
  via.proxy ? { host: via.proxy.host, port: via.proxy.port } : { host: originIp, port: originPort };

class Samples {
  readonly values: Float64Array;
  count = 0;
  constructor(capacity: number) {
    this.values = new Float64Array(capacity);
  }
  add(value: number): void {
    if (this.count < this.values.length) this.values[this.count++] = value;
  }
  summary() {
    return summarise(this.values, this.count);
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

/**
 * Reads a CONNECT answer: returns 'more', the bytes that followed a 200 (possibly empty), or
 * an error string.
 */
function connectAnswer(
  state: { head: Buffer | undefined },
  chunk: Buffer,
): 'more' | Buffer | string {
  const data = state.head === undefined ? chunk : Buffer.concat([state.head, chunk]);
  const end = data.indexOf(CRLF2);
  if (end < 0) {
    if (data.length > 16 * 1024) return 'CONNECT answer head too long';
    state.head = data;
    return 'more';
  }
  state.head = undefined;
  const status = Number(data.toString('latin1', 9, 12));
  if (status !== 200) return `CONNECT answered ${data.toString('latin1', 0, Math.min(end, 200))}`;
  return data.subarray(end + 4);
}

interface Iteration {
  /** ms from connect() to tunnel established (CONNECT 200) or TCP connect when direct. */
  setup: number;
  /** ms from connect() to the last byte of the answer. */
  full: number;
}

/** One tunnel (or direct connection) carrying one small GET; calls back once. */
function tunnelOnce(via: Via, done: (error: string | undefined, timing: Iteration) => void): void {
  const started = now();
  const timing: Iteration = { setup: Number.NaN, full: Number.NaN };
  const target = endpoint(via, httpPort);
  const socket = net.connect({ host: target.host, port: target.port, noDelay: true });
  const reader = new ResponseReader();
  const state = { head: undefined as Buffer | undefined };
  let tunnelled = via.proxy === undefined;
  let finished = false;
  const finish = (error: string | undefined) => {
    if (finished) return;
    finished = true;
    socket.destroy();
    done(error, timing);
  };
  const onResponse = (chunk: Buffer) => {
    const outcome = reader.push(chunk);
    if (outcome === 'more') return;
    if (outcome !== 'done') return finish(outcome);
    if (reader.status !== 200) return finish(`GET answered ${reader.head.split('\r\n')[0]}`);
    timing.full = now() - started;
    finish(undefined);
  };
  socket.setTimeout(SOCKET_TIMEOUT_MS, () => finish('timeout'));
  socket.on('error', (error: NodeJS.ErrnoException) => finish(error.code ?? error.message));
  socket.on('close', () => finish('closed before the answer was complete'));
  socket.on('connect', () => {
    if (tunnelled) timing.setup = now() - started;
    socket.write(tunnelled ? TUNNEL_GET : CONNECT_HTTP);
  });
  socket.on('data', (chunk: Buffer) => {
    if (tunnelled) return onResponse(chunk);
    const answer = connectAnswer(state, chunk);
    if (answer === 'more') return;
    if (typeof answer === 'string') return finish(answer);
    timing.setup = now() - started;
    tunnelled = true;
    socket.write(TUNNEL_GET);
    if (answer.length > 0) onResponse(answer);
  });
}

/** Closed loop: `concurrency` workers doing tunnel iterations back to back for `seconds`. */
async function tunnels(via: Via, concurrency: number, seconds: number): Promise<ClosedLoopResult> {
  const full = new Samples(MAX_SAMPLES);
  const setup = new Samples(MAX_SAMPLES);
  const errors = new Errors();
  const start = now();
  const end = start + seconds * 1000;
  let completed = 0;
  const worker = () =>
    new Promise<void>((resolve) => {
      const next = () => {
        if (now() >= end || errors.count >= MAX_ERRORS) return resolve();
        tunnelOnce(via, (error, timing) => {
          if (error !== undefined) {
            errors.add(error);
            // A short pause, so that a broken setup does not spin.
            return void setTimeout(next, 10);
          }
          if (now() <= end) {
            completed++;
            full.add(timing.full);
            setup.add(timing.setup);
          }
          next();
        });
      };
      next();
    });
  await Promise.all(Array.from({ length: concurrency }, worker));
  return {
    completed,
    perSecond: completed / seconds,
    errors: errors.count,
    firstError: errors.first,
    latency: full.summary(),
    setup: setup.summary(),
  };
}

/** Open loop: iterations started on a fixed schedule, `rate` per second for `seconds`. */
async function fixedRate(via: Via, rate: number, seconds: number): Promise<RateResult> {
  const total = Math.round(rate * seconds);
  const interval = 1000 / rate;
  const setup = new Samples(total);
  const full = new Samples(total);
  const lag = new Samples(total);
  const errors = new Errors();
  let launched = 0;
  let settled = 0;
  let completed = 0;
  const start = now() + 5;
  await new Promise<void>((resolve) => {
    const hardStop = setTimeout(resolve, seconds * 1000 + SOCKET_TIMEOUT_MS + 2000);
    const settle = () => {
      settled++;
      if (launched === total && settled === total) {
        clearTimeout(hardStop);
        resolve();
      }
    };
    const tick = () => {
      const t = now();
      while (launched < total && start + launched * interval <= t) {
        lag.add(t - (start + launched * interval));
        launched++;
        if (errors.count >= MAX_ERRORS) {
          settle();
          continue;
        }
        tunnelOnce(via, (error, timing) => {
          if (error !== undefined) errors.add(error);
          else {
            completed++;
            setup.add(timing.setup);
            full.add(timing.full);
          }
          settle();
        });
      }
      if (launched < total)
        setTimeout(tick, Math.max(0, start + launched * interval - now() - 0.5));
    };
    tick();
  });
  const elapsed = (now() - start) / 1000;
  return {
    launched,
    completed,
    errors: errors.count,
    firstError: errors.first,
    achievedRate: completed / Math.max(elapsed, seconds),
    setup: setup.summary(),
    full: full.summary(),
    lag: lag.summary(),
  };
}

/** One tunnel (or direct connection) to the bulk source; `bytes` read into one reused buffer. */
function bulk(via: Via, bytes: number): Promise<BulkResult> {
  return new Promise((resolve) => {
    const target = endpoint(via, bulkPort);
    const buffer = Buffer.allocUnsafe(1 << 20);
    const state = { head: undefined as Buffer | undefined };
    let tunnelled = via.proxy === undefined;
    let received = 0;
    let started = 0;
    let finished = false;
    const finish = (error?: string) => {
      if (finished) return;
      finished = true;
      const seconds = (now() - started) / 1000;
      socket.destroy();
      resolve({ bytes: received, seconds, mbPerSecond: received / 1e6 / seconds, error });
    };
    const begin = () => {
      tunnelled = true;
      started = now();
      socket.write(`${bytes}\n`);
    };
    const count = (n: number) => {
      received += n;
      if (received >= bytes)
        finish(received > bytes ? `${received - bytes} bytes too many` : undefined);
    };
    const socket = net.connect({
      host: target.host,
      port: target.port,
      noDelay: true,
      onread: {
        buffer,
        callback: (nread: number, chunk: Uint8Array) => {
          if (tunnelled) {
            count(nread);
            return true;
          }
          const answer = connectAnswer(state, Buffer.from(chunk.subarray(0, nread)));
          if (answer === 'more') return true;
          if (typeof answer === 'string') {
            finish(answer);
            return false;
          }
          begin();
          if (answer.length > 0) count(answer.length);
          return true;
        },
      },
    });
    socket.setTimeout(SOCKET_TIMEOUT_MS, () => finish('timeout'));
    socket.on('error', (error: NodeJS.ErrnoException) => finish(error.code ?? error.message));
    socket.on('close', () => finish(`closed after ${received} of ${bytes} bytes`));
    socket.on('connect', () => (tunnelled ? begin() : socket.write(CONNECT_BULK)));
  });
}

/** Closed loop over keep-alive connections, one request at a time on each. */
async function keepAliveGets(
  via: Via,
  connections: number,
  seconds: number,
): Promise<ClosedLoopResult> {
  const latency = new Samples(MAX_SAMPLES);
  const errors = new Errors();
  const request = via.proxy ? ABSOLUTE_GET : ORIGIN_GET;
  const target = endpoint(via, httpPort);
  const start = now();
  const end = start + seconds * 1000;
  let completed = 0;
  const connection = () =>
    new Promise<void>((resolve) => {
      const open = () => {
        if (now() >= end || errors.count >= MAX_ERRORS) return resolve();
        const socket = net.connect({ host: target.host, port: target.port, noDelay: true });
        const reader = new ResponseReader();
        let sent = 0;
        let closed = false;
        const send = () => {
          reader.reset();
          sent = now();
          socket.write(request);
        };
        const close = (error: string | undefined) => {
          if (closed) return;
          closed = true;
          socket.destroy();
          if (error !== undefined) errors.add(error);
          if (now() >= end) return resolve();
          setTimeout(open, error === undefined ? 0 : 10);
        };
        socket.setTimeout(SOCKET_TIMEOUT_MS, () => close('timeout'));
        socket.on('error', (error: NodeJS.ErrnoException) => close(error.code ?? error.message));
        socket.on('close', () =>
          close(sent === 0 ? 'closed' : 'closed while a request was outstanding'),
        );
        socket.on('connect', send);
        socket.on('data', (chunk: Buffer) => {
          const outcome = reader.push(chunk);
          if (outcome === 'more') return;
          if (outcome !== 'done') return close(outcome);
          if (reader.status !== 200) return close(`GET answered ${reader.head.split('\r\n')[0]}`);
          if (reader.rest !== undefined) return close('bytes after the answer');
          const t = now();
          if (t <= end) {
            completed++;
            latency.add(t - sent);
          }
          if (t >= end) {
            closed = true;
            socket.destroy();
            return resolve();
          }
          send();
        });
      };
      open();
    });
  await Promise.all(Array.from({ length: connections }, connection));
  return {
    completed,
    perSecond: completed / seconds,
    errors: errors.count,
    firstError: errors.first,
    latency: latency.summary(),
  };
}

function run(job: Job): Promise<JobResult> {
  switch (job.type) {
    case 'tunnels':
      return tunnels(job.via, job.concurrency, job.seconds);
    case 'rate':
      return fixedRate(job.via, job.rate, job.seconds);
    case 'bulk':
      return bulk(job.via, job.bytes);
    case 'get':
      return keepAliveGets(job.via, job.connections, job.seconds);
  }
}

if (!originIp || !Number.isInteger(httpPort) || !Number.isInteger(bulkPort)) {
  process.stderr.write('usage: proxy-client.js <origin ip> <http port> <bulk port> [seconds]\n');
  process.exit(2);
}
endWithParent(Number(lifetimeText));
process.on('message', (message: { job?: Job }) => {
  if (message?.job === undefined) return;
  run(message.job).then(
    (result) => process.send?.({ result }),
    (error: unknown) => process.send?.({ error: (error as Error).stack ?? String(error) }),
  );
});
process.send?.({ ready: true });
