/**
 * Attacker tests: a sandbox's output and input never pile up in Moat. Found in review: a
 * client that started `cat /dev/zero` and stopped reading made Moat buffer the output without
 * bound (RSS +230 MB/s), and input sent to a command that never read it was held in Moat's
 * memory (2 GB for 2 GB sent). Output now waits in the sandbox (the command blocks, as on a
 * full pipe); input is read from the client no faster than the command takes it.
 */
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type EnvdSandbox, SandboxApi } from '../../src/envd/index.js';
import type { RuntimeSandbox } from '../../src/runtime/index.js';
import { envelope } from '../support/connect-client.js';
import { shell } from '../support/sandbox-shell.js';
import { type Harness, skipReason, startHarness } from './runtime-harness.js';

const skip = skipReason('confinement/flow-control');
const MiB = 2 ** 20;
let harness: Harness;
let sandbox: RuntimeSandbox;
let server: http.Server;
let port: number;
/** Moat's side of every connection to the sandbox API. */
const serverSockets = new Set<Socket>();

beforeAll(async () => {
  if (skip) return;
  harness = await startHarness();
  sandbox = await harness.sandbox();
  const api = new SandboxApi(pino({ level: 'silent' }));
  const envd: EnvdSandbox = {
    sandboxID: sandbox.sandboxID,
    accessToken: null,
    envVars: {},
    runtime: sandbox,
    running: () => true,
  };
  server = http.createServer((request, response) => void api.handle(request, response, envd));
  server.on('connection', (socket) => {
    serverSockets.add(socket);
    socket.on('close', () => serverSockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as AddressInfo).port;
}, 60_000);

afterAll(async () => {
  server?.closeAllConnections();
  await new Promise((resolve) => server?.close(resolve));
  await harness?.close();
});

const HEADERS = {
  'Connect-Protocol-Version': '1',
  Authorization: `Basic ${Buffer.from('user:').toString('base64')}`,
};

/** Bytes Moat holds for clients in its sockets' write buffers. */
const moatBuffered = () => [...serverSockets].reduce((sum, s) => sum + s.writableLength, 0);

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Decodes the Connect envelopes of a Start stream as they arrive. */
class OutputCounter {
  pid: number | undefined;
  stdout = 0;
  /** The first KiB of standard output. */
  text = '';
  end: Record<string, unknown> | undefined;
  private pending = Buffer.alloc(0);

  push(chunk: Buffer): void {
    this.pending = Buffer.concat([this.pending, chunk]);
    while (this.pending.length >= 5) {
      const length = this.pending.readUInt32BE(1);
      if (this.pending.length < 5 + length) return;
      const message = JSON.parse(this.pending.subarray(5, 5 + length).toString()) as {
        event?: {
          start?: { pid: number };
          data?: { stdout?: string };
          end?: Record<string, unknown>;
        };
      };
      this.pending = this.pending.subarray(5 + length);
      const data = message.event?.data?.stdout;
      if (data !== undefined) {
        const bytes = Buffer.from(data, 'base64');
        this.stdout += bytes.length;
        if (this.text.length < 1024) this.text += bytes.toString('latin1').slice(0, 1024);
      }
      if (message.event?.start) this.pid = message.event.start.pid;
      if (message.event?.end) this.end = message.event.end;
    }
  }
}

interface Started {
  readonly request: http.ClientRequest;
  readonly response: http.IncomingMessage;
  readonly counter: OutputCounter;
  /** Resolves once the stream has ended. */
  readonly ended: Promise<void>;
}

/** Starts `script` through process.Process/Start; the response is returned paused. */
function startCommand(script: string, stdin = false): Promise<Started> {
  const counter = new OutputCounter();
  const body = envelope({ process: { cmd: '/bin/sh', args: ['-c', script] }, stdin });
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        host: '127.0.0.1',
        port,
        method: 'POST',
        path: '/process.Process/Start',
        headers: {
          ...HEADERS,
          'Content-Type': 'application/connect+json',
          'Content-Length': body.length,
        },
      },
      (response) => {
        response.pause();
        response.on('data', (chunk: Buffer) => counter.push(chunk));
        const ended = new Promise<void>((done) => response.on('end', done));
        resolve({ request, response, counter, ended });
      },
    );
    request.on('error', reject);
    request.end(body);
  });
}

const exists = async (file: string) =>
  (await shell(sandbox, 'test -e "$1" && echo yes || echo no', { args: [file] })).trim() === 'yes';

async function until(check: () => Promise<boolean> | boolean, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms`);
    await pause(100);
  }
}

describe.skipIf(skip)('output waits for the client that reads it', () => {
  const FLOOD = 64 * MiB;

  it('a client that stops reading blocks the command, not Moat’s memory; reading again gets every byte', async () => {
    const marker = '/tmp/flood-done-1';
    const warnings: string[] = [];
    const onWarning = (warning: Error) => warnings.push(warning.name);
    process.on('warning', onWarning);
    const { response, counter, ended } = await startCommand(
      `head -c ${FLOOD} /dev/zero; echo > ${marker}`,
    );
    await pause(3000);
    expect(await exists(marker), 'the command ran to the end with nobody reading').toBe(false);
    expect(moatBuffered()).toBeLessThan(4 * MiB);
    response.resume();
    await ended;
    expect(counter.stdout).toBe(FLOOD);
    expect(counter.end).toMatchObject({ exited: true, status: 'exit status 0' });
    expect(await exists(marker)).toBe(true);
    process.off('warning', onWarning);
    // Waiting for the client adds one listener per stream, not one per chunk held.
    expect(warnings).not.toContain('MaxListenersExceededWarning');
  }, 90_000);

  it('a client that leaves while output waits lets the command run on', async () => {
    const marker = '/tmp/flood-done-2';
    const { request } = await startCommand(`head -c ${FLOOD} /dev/zero; echo > ${marker}`);
    await pause(1000);
    expect(await exists(marker)).toBe(false);
    request.destroy();
    await until(() => exists(marker), 30_000);
  }, 60_000);
});

describe.skipIf(skip)('input waits for the command that reads it', () => {
  /** A command that reads nothing until `go` exists, then counts its input. */
  const counting = (go: string) =>
    startCommand(`while [ ! -e ${go} ]; do sleep 0.1; done; wc -c`, true);

  it('StreamInput is read no faster than the command takes it, and all of it arrives', async () => {
    const go = '/tmp/stream-input-go';
    const command = await counting(go);
    command.response.resume();
    await until(() => command.counter.pid !== undefined, 10_000);
    const total = 24 * MiB;
    const chunk = Buffer.alloc(256 * 1024, 7).toString('base64');
    const input = http.request({
      host: '127.0.0.1',
      port,
      method: 'POST',
      path: '/process.Process/StreamInput',
      headers: { ...HEADERS, 'Content-Type': 'application/connect+json' },
    });
    const status = new Promise<number>((resolve) =>
      input.on('response', (reply) => {
        reply.resume();
        reply.on('end', () => resolve(reply.statusCode ?? 0));
      }),
    );
    input.write(envelope({ start: { process: { pid: command.counter.pid } } }));
    let written = 0;
    const writing = (async () => {
      while (written < total) {
        const more = input.write(envelope({ data: { input: { stdin: chunk } } }));
        written += 256 * 1024;
        if (!more) await new Promise((resolve) => input.once('drain', resolve));
      }
      input.end(envelope({ end: {} }, 2));
    })();
    await pause(3000);
    expect(written, 'the client sent all its input while nothing read it').toBeLessThan(16 * MiB);
    expect(moatBuffered()).toBeLessThan(4 * MiB);
    await shell(sandbox, 'touch "$1"', { args: [go] });
    await writing;
    expect(await status).toBe(200);
    await shell(sandbox, 'sleep 0.2');
    const close = await unary('CloseStdin', { process: { pid: command.counter.pid } });
    expect(close.status).toBe(200);
    await command.ended;
    expect(command.counter.text.trim()).toBe(String(total));
  }, 90_000);

  it('SendInput calls wait while the command has no room, then all of their input arrives', async () => {
    const go = '/tmp/send-input-go';
    const command = await counting(go);
    command.response.resume();
    await until(() => command.counter.pid !== undefined, 10_000);
    const piece = Buffer.alloc(512 * 1024, 1).toString('base64');
    const calls = 8;
    let answered = 0;
    const sending = (async () => {
      for (let i = 0; i < calls; i++) {
        const reply = await unary('SendInput', {
          process: { pid: command.counter.pid },
          input: { stdin: piece },
        });
        expect(reply.status).toBe(200);
        answered++;
      }
    })();
    await pause(2000);
    expect(answered, 'every call was answered while nothing read the input').toBeLessThan(calls);
    await shell(sandbox, 'touch "$1"', { args: [go] });
    await sending;
    await unary('CloseStdin', { process: { pid: command.counter.pid } });
    await command.ended;
    expect(command.counter.text.trim()).toBe(String(calls * 512 * 1024));
  }, 60_000);
});

function unary(method: string, message: unknown): Promise<{ status: number; text: string }> {
  const body = JSON.stringify(message);
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        host: '127.0.0.1',
        port,
        method: 'POST',
        path: `/process.Process/${method}`,
        headers: { ...HEADERS, 'Content-Type': 'application/json' },
      },
      (response) => {
        let text = '';
        response.on('data', (chunk: Buffer) => (text += chunk.toString()));
        response.on('end', () => resolve({ status: response.statusCode ?? 0, text }));
      },
    );
    request.on('error', reject);
    request.end(body);
  });
}
