/**
 * The sandbox API on the wire, through a real in-process Moat: routing by the sandbox listener
 * (Host label or E2b-* headers, 502 for sandboxes that are not running, autoResume), access
 * tokens and users, the Connect protocol itself (headers, content types, error bodies, stream
 * framing, keepalives, deadlines), process.Process input and signal validation, client streams,
 * pty resize, compose, /envs, and pause/kill reaching forked children. Raw HTTP on loopback
 * only; sandboxes are created through the platform API. The SDK-level behaviour is in
 * test/sdk/commands.test.ts, the filesystem at the raw level in test/envd/filesystem.test.ts.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ApiMoat, type Created, startApiMoat } from '../support/api-client.js';
import { hostPathOf } from '../support/sandbox-shell.js';
import {
  type Frame,
  type HttpReply,
  SandboxClient,
  send,
  type StreamCall,
} from '../support/connect-client.js';
import { hostProcesses } from '../support/local-host.js';

const DOMAIN = 'moat.test';
const NOT_FOUND_ID = `i${'0'.repeat(20)}`;
const NOT_RUNNING = 'The sandbox was not found';

let harness: ApiMoat;
let sandboxBase: string;
/** Shared secure sandbox for most tests (v2 default). */
let secure: SandboxClient;
/** Shared open sandbox (`secure: false`). */
let open: SandboxClient;

// --- Platform API -------------------------------------------------------------------------------

async function create(body: object = {}): Promise<Created> {
  const reply = await harness.api.post('/v2/sandboxes', {
    templateID: 'base',
    timeout: 300,
    ...body,
  });
  expect(reply.status, reply.text).toBe(201);
  return reply.body as Created;
}

async function sandbox(body: object = {}): Promise<SandboxClient> {
  const created = await create(body);
  return new SandboxClient(sandboxBase, created.sandboxID, created.envdAccessToken);
}

async function lifecycle(action: 'pause' | 'connect' | 'kill', sandboxID: string) {
  const reply =
    action === 'kill'
      ? await harness.api.delete(`/sandboxes/${sandboxID}`)
      : await harness.api.post(
          `/sandboxes/${sandboxID}/${action}`,
          action === 'connect' ? { timeout: 300 } : undefined,
        );
  expect(reply.status, reply.text).toBe({ pause: 204, connect: 201, kill: 204 }[action]);
}

const stateOf = async (sandboxID: string) => (await harness.api.detail(sandboxID)).state;

beforeAll(async () => {
  harness = await startApiMoat();
  const { host, port } = harness.moat.listening.sandbox;
  sandboxBase = `http://${host}:${port}`;
  secure = await sandbox();
  open = await sandbox({ secure: false });
});

afterAll(async () => {
  await harness?.stop();
});

// --- Expectations -------------------------------------------------------------------------------

/** The router's and the API's own errors: exactly {message, code: <status>, sandboxID}. */
function expectSandboxError(reply: HttpReply, status: number, sandboxID?: string): void {
  expect({ status: reply.status, text: reply.text }).toMatchObject({ status });
  expect(reply.headers['content-type']).toMatch(/^application\/json/);
  expect(Object.keys(reply.body as object).sort()).toEqual(['code', 'message', 'sandboxID']);
  const body = reply.body as { code: unknown; message: unknown; sandboxID: unknown };
  expect(body.code).toBe(status);
  expect(typeof body.message).toBe('string');
  expect(typeof body.sandboxID).toBe('string');
  if (sandboxID !== undefined) expect(body.sandboxID).toBe(sandboxID);
}

/** A unary Connect error: the mapped HTTP status and a string `code` in a JSON body. */
function expectConnectError(reply: HttpReply, status: number | number[], code: string): void {
  const statuses = Array.isArray(status) ? status : [status];
  expect(statuses, reply.text).toContain(reply.status);
  expect(reply.headers['content-type']).toMatch(/^application\/json/);
  const body = reply.body as { code: unknown; message: unknown };
  expect(body.code, reply.text).toBe(code);
  expect(typeof body.message).toBe('string');
}

function expectOk(reply: HttpReply, body: unknown = {}): void {
  expect({ status: reply.status, body: reply.body }, reply.text).toEqual({ status: 200, body });
}

// --- Processes ----------------------------------------------------------------------------------

const sh = (script: string) => ({ cmd: '/bin/sh', args: ['-c', script] });
const b64 = (text: string) => Buffer.from(text).toString('base64');
const basic = (user: string) => `Basic ${Buffer.from(`${user}:`).toString('base64')}`;

interface EndEvent {
  exitCode?: number;
  exited?: boolean;
  status: string;
  error?: string;
}

/** What a Start/Connect stream said so far. */
interface Summary {
  start: number | undefined;
  stdout: string;
  stderr: string;
  pty: string;
  keepalives: number;
  end: EndEvent | undefined;
  /** The end-stream frame (flag 2). */
  trailer: Record<string, unknown> | undefined;
  /** Frames of no known shape, or anything after the end-stream frame. */
  unexpected: Frame[];
}

function summarize(frames: readonly Frame[]): Summary {
  const summary: Summary = {
    start: undefined,
    stdout: '',
    stderr: '',
    pty: '',
    keepalives: 0,
    end: undefined,
    trailer: undefined,
    unexpected: [],
  };
  for (const frame of frames) {
    const event = (frame.message as { event?: Record<string, Record<string, string>> }).event;
    if (summary.trailer !== undefined) summary.unexpected.push(frame);
    else if (frame.flags === 2) summary.trailer = frame.message;
    else if (frame.flags !== 0 || event === undefined) summary.unexpected.push(frame);
    else if (event.start) summary.start = Number(event.start.pid);
    else if (event.keepalive) summary.keepalives++;
    else if (event.end) summary.end = event.end as unknown as EndEvent;
    else if (event.data) {
      for (const [stream, bytes] of Object.entries(event.data)) {
        summary[stream as 'stdout' | 'stderr' | 'pty'] += Buffer.from(bytes, 'base64').toString();
      }
    } else summary.unexpected.push(frame);
  }
  return summary;
}

/** A Start stream and everything it said. */
class Running {
  readonly frames: Frame[] = [];

  constructor(
    readonly call: StreamCall,
    readonly pid: number,
  ) {}

  get summary(): Summary {
    return summarize(this.frames);
  }

  /** Reads frames until `done` holds; fails when the stream ends or time runs out first. */
  async waitFor(done: (summary: Summary) => boolean, timeoutMs = 5000): Promise<Summary> {
    const deadline = Date.now() + timeoutMs;
    while (!done(this.summary)) {
      const frame = await this.call.next(Math.max(1, deadline - Date.now()));
      if (frame === undefined) throw new Error(`stream ended: ${JSON.stringify(this.summary)}`);
      this.frames.push(frame);
    }
    return this.summary;
  }

  /** Reads to the end of the stream, which must be one end-stream frame after the events. */
  async finish(timeoutMs = 5000): Promise<Summary> {
    this.frames.push(...(await this.call.rest(timeoutMs)));
    const summary = this.summary;
    expect(summary.unexpected).toEqual([]);
    expect(summary.trailer, JSON.stringify(this.frames)).toBeDefined();
    expect(this.call.trailing).toBe(0);
    return summary;
  }
}

interface StartOptions {
  tag?: string;
  stdin?: boolean;
  pty?: { cols: number; rows: number };
  headers?: Record<string, string>;
}

/** Starts `script` and reads the start event: 200, application/connect+json, {start: {pid}}. */
async function start(
  sbx: SandboxClient,
  script: string,
  options: StartOptions = {},
): Promise<Running> {
  const call = sbx.stream(
    'process.Process/Start',
    {
      process: sh(script),
      ...(options.tag !== undefined ? { tag: options.tag } : {}),
      ...(options.stdin !== undefined ? { stdin: options.stdin } : {}),
      ...(options.pty ? { pty: { size: options.pty } } : {}),
    },
    options.headers,
  );
  await call.ready;
  expect(call.status).toBe(200);
  expect(call.contentType).toMatch(/^application\/connect\+json/);
  const first = await call.next();
  expect(first).toEqual({ flags: 0, message: { event: { start: { pid: expect.any(Number) } } } });
  const pid = (first!.message as { event: { start: { pid: number } } }).event.start.pid;
  expect(Number.isSafeInteger(pid) && pid > 0).toBe(true);
  return new Running(call, pid);
}

/** Runs `script` to its end. */
const run = async (sbx: SandboxClient, script: string, options: StartOptions = {}) =>
  (await start(sbx, script, options)).finish();

const listPids = async (sbx: SandboxClient): Promise<number[]> => {
  const reply = await sbx.unary('process.Process/List', {});
  expect(reply.status, reply.text).toBe(200);
  return (reply.body as { processes: Array<{ pid: number }> }).processes.map((p) => p.pid);
};

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

// --- Routing ------------------------------------------------------------------------------------

const viaLabel = (sandboxID: string, request: { path?: string; headers?: object } = {}) =>
  send(sandboxBase, {
    path: request.path ?? '/health',
    headers: { host: `49983-${sandboxID}.${DOMAIN}`, ...request.headers },
  });

const viaHeaders = (sandboxID: string, path = '/health') =>
  send(sandboxBase, {
    path,
    headers: { 'E2b-Sandbox-Id': sandboxID, 'E2b-Sandbox-Port': '49983' },
  });

describe("routing by the sandbox listener's router", () => {
  it('the Host label {port}-{sandboxID}.<domain> routes without any E2b-* header', async () => {
    expect((await viaLabel(secure.sandboxID)).status).toBe(204);
    const list = await send(sandboxBase, {
      method: 'POST',
      path: '/process.Process/List',
      headers: {
        host: `49983-${secure.sandboxID}.${DOMAIN}`,
        'X-Access-Token': secure.token!,
        'Content-Type': 'application/json',
        'Connect-Protocol-Version': '1',
      },
      body: '{}',
    });
    expect(list.status, list.text).toBe(200);
    expect(list.body).toMatchObject({ processes: expect.any(Array) });
    // The label is read first: headers naming another sandbox do not change the route.
    const both = await viaLabel(secure.sandboxID, {
      headers: { 'E2b-Sandbox-Id': NOT_FOUND_ID, 'E2b-Sandbox-Port': '49983' },
    });
    expect(both.status).toBe(204);
  });

  it.each([
    ['only E2b-Sandbox-Id', () => ({ 'E2b-Sandbox-Id': secure.sandboxID })],
    ['only E2b-Sandbox-Port', () => ({ 'E2b-Sandbox-Port': '49983' })],
    ['neither header', () => ({})],
    [
      'a port that is not a number',
      () => ({ 'E2b-Sandbox-Id': secure.sandboxID, 'E2b-Sandbox-Port': 'api' }),
    ],
    [
      'a port over 65535',
      () => ({ 'E2b-Sandbox-Id': secure.sandboxID, 'E2b-Sandbox-Port': '70000' }),
    ],
  ])('%s -> 400 with the sandbox error body', async (_name, headers) => {
    const reply = await send(sandboxBase, { path: '/health', headers: headers() });
    expectSandboxError(reply, 400);
  });

  it('unknown, killed and paused sandboxes are 502 {message, code: 502, sandboxID}', async () => {
    const killed = await create({ secure: false });
    await lifecycle('kill', killed.sandboxID);
    const paused = await create({ secure: false });
    await lifecycle('pause', paused.sandboxID);
    const ids = [NOT_FOUND_ID, 'nope', killed.sandboxID, paused.sandboxID];
    for (const id of ids) {
      for (const [route, reply] of [
        ['headers /health', await viaHeaders(id)],
        ['headers List', await viaHeaders(id, '/process.Process/List')],
        ['label /health', await viaLabel(id)],
      ] as const) {
        expect({ id, route, status: reply.status, body: reply.body }).toEqual({
          id,
          route,
          status: 502,
          body: { message: NOT_RUNNING, code: 502, sandboxID: id },
        });
      }
    }
    // Traffic did not wake a sandbox without autoResume.
    expect(await stateOf(paused.sandboxID)).toBe('paused');
  });

  it('traffic resumes a paused sandbox that has autoResume.enabled', async () => {
    const sbx = await sandbox({ secure: false, autoPause: true, autoResume: { enabled: true } });
    await lifecycle('pause', sbx.sandboxID);
    expect(await stateOf(sbx.sandboxID)).toBe('paused');
    expect((await viaHeaders(sbx.sandboxID)).status).toBe(204);
    expect(await stateOf(sbx.sandboxID)).toBe('running');
    expect((await run(sbx, 'echo awake')).stdout).toBe('awake\n');
  });
});

// --- Auth ---------------------------------------------------------------------------------------

describe('access token and user', () => {
  const protectedRequests: Array<[string, (sbx: SandboxClient) => Promise<HttpReply>]> = [
    ['process.Process/List', (sbx) => sbx.unary('process.Process/List', {})],
    ['process.Process/SendSignal', (sbx) => sbx.unary('process.Process/SendSignal', {})],
    ['filesystem.Filesystem/Stat', (sbx) => sbx.unary('filesystem.Filesystem/Stat', { path: '/' })],
    ['GET /envs', (sbx) => sbx.request({ path: '/envs' })],
    ['GET /files', (sbx) => sbx.request({ path: '/files?path=/home/user' })],
    [
      'POST /files',
      (sbx) =>
        sbx.request({
          method: 'POST',
          path: '/files?path=/home/user/denied.txt',
          headers: { 'Content-Type': 'application/octet-stream' },
          body: 'x',
        }),
    ],
    [
      'POST /files/compose',
      (sbx) =>
        sbx.request({
          method: 'POST',
          path: '/files/compose',
          headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ source_paths: ['a'], destination: 'b' }),
        }),
    ],
  ];

  it('v2 create is secure by default; secure: false gives no token', async () => {
    expect(secure.token).toMatch(/.{16,}/);
    expect(open.token).toBeNull();
  });

  it.each(protectedRequests)(
    '%s on a secure sandbox: 401 without or with a wrong token',
    async (_name, call) => {
      for (const token of [null, 'wrong', `${secure.token!.slice(0, -1)}x`, '']) {
        expectSandboxError(await call(secure.withToken(token)), 401, secure.sandboxID);
      }
      expect((await call(secure)).status).not.toBe(401);
      // An open sandbox takes no token.
      expect((await call(open)).status).not.toBe(401);
    },
  );

  it('GET /health needs no token', async () => {
    expect((await secure.withToken(null).request({ path: '/health' })).status).toBe(204);
  });

  it('Authorization Basic with an unknown user is 401', async () => {
    for (const user of ['mallory', 'nobody', 'User']) {
      const reply = await secure.unary('process.Process/List', {}, { Authorization: basic(user) });
      expectSandboxError(reply, 401, secure.sandboxID);
    }
  });

  it.each([
    ['no Authorization', {}, 'user'],
    ['Basic dXNlcjo= (user)', { Authorization: 'Basic dXNlcjo=' }, 'user'],
    ['Basic cm9vdDo= (root)', { Authorization: 'Basic cm9vdDo=' }, 'root'],
  ])('%s runs as %s', async (_name, headers, expected) => {
    const summary = await run(secure, 'whoami; echo "$HOME"', { headers });
    expect(summary.stdout).toBe(`${expected}\n${expected === 'root' ? '/root' : '/home/user'}\n`);
  });
});

// --- Connect protocol ---------------------------------------------------------------------------

describe('Connect protocol', () => {
  const CONNECT = { 'Connect-Protocol-Version': '1' };
  const JSON_TYPE = { 'Content-Type': 'application/json' };
  const UNARY = { ...CONNECT, ...JSON_TYPE };
  /** Where the Connect spec asks for 415 and a 400 is as clear, either is accepted. */
  const MEDIA = [400, 415];

  interface ProtocolCase {
    name: string;
    method?: string;
    headers?: Record<string, string>;
    body?: string;
    status: number[];
    code: string;
  }

  it.each<ProtocolCase>([
    {
      name: 'no Connect-Protocol-Version',
      headers: JSON_TYPE,
      status: [400],
      code: 'invalid_argument',
    },
    {
      name: 'Connect-Protocol-Version: 2',
      headers: { ...JSON_TYPE, 'Connect-Protocol-Version': '2' },
      status: [400],
      code: 'invalid_argument',
    },
    {
      name: 'text/plain on a unary call',
      headers: { ...CONNECT, 'Content-Type': 'text/plain' },
      status: MEDIA,
      code: 'invalid_argument',
    },
    { name: 'no content type', headers: CONNECT, status: MEDIA, code: 'invalid_argument' },
    {
      name: 'application/connect+json on a unary call',
      headers: { ...CONNECT, 'Content-Type': 'application/connect+json' },
      status: MEDIA,
      code: 'invalid_argument',
    },
    {
      name: 'application/json on a server stream',
      method: 'process.Process/Start',
      body: JSON.stringify({ process: sh('true') }),
      status: MEDIA,
      code: 'invalid_argument',
    },
    { name: 'a body that is not JSON', body: '{', status: [400], code: 'invalid_argument' },
    { name: 'a JSON array', body: '[]', status: [400], code: 'invalid_argument' },
    {
      name: 'an unknown method',
      method: 'process.Process/Nope',
      status: [501],
      code: 'unimplemented',
    },
    { name: 'an unknown service', method: 'nope.Nope/List', status: [501], code: 'unimplemented' },
    {
      name: 'a path with no method',
      method: 'process.Process',
      status: [501],
      code: 'unimplemented',
    },
  ])(
    '$name -> $code',
    async ({ method = 'process.Process/List', headers = UNARY, body = '{}', status, code }) => {
      const reply = await secure.request({ method: 'POST', path: `/${method}`, headers, body });
      expectConnectError(reply, status, code);
    },
  );

  it('a unary error carries a string code and the mapped status (not_found 404)', async () => {
    const reply = await secure.unary('process.Process/SendInput', {
      process: { pid: 999_999 },
      input: { stdin: b64('x') },
    });
    expectConnectError(reply, 404, 'not_found');
    expect((reply.body as { message: string }).message).toBe('process with pid 999999 not found');
  });

  it.each([
    [
      'exit 0: no exitCode, no error',
      'echo out; printf err >&2',
      { stdout: 'out\n', stderr: 'err' },
      { exited: true, status: 'exit status 0' },
    ],
    [
      'exit 3: exitCode 3 and error',
      'echo partial; exit 3',
      { stdout: 'partial\n', stderr: '' },
      { exitCode: 3, exited: true, status: 'exit status 3', error: 'exit status 3' },
    ],
  ])(
    'Start streams start, base64 data, end, then an empty end-stream frame (%s)',
    async (_n, script, output, end) => {
      const running = await start(secure, script);
      const summary = await running.finish();
      expect(summary).toMatchObject({ ...output, pty: '', keepalives: 0, end, trailer: {} });
      expect(summary.end).toEqual(end);
      // Every data event is one base64 member of stdout/stderr.
      for (const frame of running.frames.filter((f) => f.flags === 0)) {
        const data = (frame.message as { event: { data?: Record<string, string> } }).event.data;
        if (data === undefined) continue;
        expect(Object.keys(data)).toHaveLength(1);
        expect(Object.values(data)[0]).toMatch(/^[A-Za-z0-9+/]+={0,2}$/);
      }
      // The end event comes right before the end-stream frame.
      expect(running.frames.at(-2)).toEqual({ flags: 0, message: { event: { end } } });
      expect(running.frames.at(-1)).toEqual({ flags: 2, message: {} });
    },
  );

  it('a stream error (Connect to an unknown pid) is 200 with only an end-stream error frame', async () => {
    for (const selector of [{ pid: 999_999 }, { tag: 'no-such-tag' }]) {
      const call = secure.stream('process.Process/Connect', { process: selector });
      await call.ready;
      expect(call.status).toBe(200);
      expect(call.contentType).toMatch(/^application\/connect\+json/);
      expect(await call.rest()).toEqual([
        { flags: 2, message: { error: { code: 'not_found', message: expect.any(String) } } },
      ]);
      expect(call.trailing).toBe(0);
    }
  });

  it('a stream with a malformed request message ends with invalid_argument', async () => {
    const call = secure.stream('process.Process/Start', { process: { args: ['x'] } });
    await call.ready;
    expect(call.status).toBe(200);
    expect(await call.rest()).toEqual([
      { flags: 2, message: { error: { code: 'invalid_argument', message: expect.any(String) } } },
    ]);
  });

  it('Keepalive-Ping-Interval: 1 sends keepalive events while a process runs', async () => {
    const running = await start(secure, 'sleep 1.6; echo done', {
      headers: { 'Keepalive-Ping-Interval': '1' },
    });
    const summary = await running.finish(8000);
    expect(summary.keepalives).toBeGreaterThanOrEqual(1);
    expect(summary).toMatchObject({ stdout: 'done\n', end: { status: 'exit status 0' } });
    const keepalive = { flags: 0, message: { event: { keepalive: {} } } };
    expect(running.frames).toContainEqual(keepalive);
  });

  it('Connect-Timeout-Ms kills the process at the deadline', async () => {
    const began = Date.now();
    const running = await start(secure, 'echo begun; sleep 30', {
      headers: { 'Connect-Timeout-Ms': '500' },
    });
    const summary = await running.finish(8000);
    const took = Date.now() - began;
    expect(took).toBeGreaterThanOrEqual(450);
    expect(took).toBeLessThan(5000);
    expect(summary.stdout).toBe('begun\n');
    expect(summary.end).toMatchObject({ status: 'signal: killed', error: 'signal: killed' });
    expect(summary.end?.exited).not.toBe(true);
    expect(summary.trailer).toEqual({
      error: { code: 'deadline_exceeded', message: expect.any(String) },
    });
    await expect.poll(() => listPids(secure), { timeout: 3000 }).not.toContain(running.pid);
  });
});

// --- SendInput / SendSignal / CloseStdin / StreamInput / Update ---------------------------------

type Body = (pid: number) => unknown;

describe('SendInput and SendSignal validation', () => {
  const TAG = 'validation-cat';
  let cat: Running;

  beforeAll(async () => {
    cat = await start(secure, 'cat', { stdin: true, tag: TAG });
  });

  afterAll(async () => {
    await secure.unary('process.Process/SendSignal', {
      process: { pid: cat.pid },
      signal: 'SIGNAL_SIGKILL',
    });
    cat.call.close();
  });

  const input = { stdin: b64('x') };
  const selectorCases: Array<[string, Body]> = [
    ['both pid and tag', (pid) => ({ pid, tag: TAG })],
    ['neither pid nor tag', () => ({})],
    ['an unknown member', (pid) => ({ pid, extra: 1 })],
    ['a pid that is not a number', () => ({ pid: 'one' })],
    ['a boolean pid', () => ({ pid: true })],
    ['a fractional pid', (pid) => ({ pid: pid + 0.5 })],
    ['a negative pid', () => ({ pid: -1 })],
    ['a numeric tag', () => ({ tag: 5 })],
    ['a string selector', () => 'pid'],
    ['an array selector', (pid) => [pid]],
  ];

  it.each([
    ...selectorCases.map(([name, selector]): [string, Body] => [
      `process: ${name}`,
      (pid) => ({ process: selector(pid), input }),
    ]),
    ['no process', () => ({ input })],
    [
      'input with both stdin and pty',
      (pid) => ({ process: { pid }, input: { stdin: b64('a'), pty: b64('b') } }),
    ],
    ['input with neither stdin nor pty', (pid) => ({ process: { pid }, input: {} })],
    [
      'input with an unknown member',
      (pid) => ({ process: { pid }, input: { stdin: b64('a'), x: 1 } }),
    ],
    ['stdin that is not base64', (pid) => ({ process: { pid }, input: { stdin: 'not base64!' } })],
    ['stdin that is a number', (pid) => ({ process: { pid }, input: { stdin: 5 } })],
    ['no input', (pid) => ({ process: { pid } })],
    ['input that is a string', (pid) => ({ process: { pid }, input: b64('a') })],
    [
      'an unknown top-level member',
      (pid) => ({ process: { pid }, input, signal: 'SIGNAL_SIGKILL' }),
    ],
  ] satisfies Array<[string, Body]>)('SendInput with %s -> invalid_argument', async (_n, body) => {
    expectConnectError(
      await secure.unary('process.Process/SendInput', body(cat.pid)),
      400,
      'invalid_argument',
    );
  });

  it.each([
    ...selectorCases.map(([name, selector]): [string, Body] => [
      `process: ${name}`,
      (pid) => ({ process: selector(pid), signal: 'SIGNAL_SIGTERM' }),
    ]),
    ['an unknown signal name', (pid) => ({ process: { pid }, signal: 'SIGNAL_SIGHUP' })],
    ['SIGNAL_UNSPECIFIED', (pid) => ({ process: { pid }, signal: 'SIGNAL_UNSPECIFIED' })],
    ['an unknown signal number', (pid) => ({ process: { pid }, signal: 1 })],
    ['no signal', (pid) => ({ process: { pid } })],
    [
      'an unknown top-level member',
      (pid) => ({ process: { pid }, signal: 'SIGNAL_SIGTERM', input }),
    ],
  ] satisfies Array<[string, Body]>)('SendSignal with %s -> invalid_argument', async (_n, body) => {
    expectConnectError(
      await secure.unary('process.Process/SendSignal', body(cat.pid)),
      400,
      'invalid_argument',
    );
  });

  it.each([
    ['SendInput', { input }],
    ['SendSignal', { signal: 'SIGNAL_SIGTERM' }],
    ['CloseStdin', {}],
    ['Update', { pty: { size: { cols: 10, rows: 10 } } }],
  ])('%s to an unknown pid or tag -> not_found 404', async (method, rest) => {
    for (const process of [{ pid: 999_999 }, { tag: 'no-such-tag' }]) {
      const reply = await secure.unary(`process.Process/${method}`, { process, ...rest });
      expectConnectError(reply, 404, 'not_found');
    }
  });

  it('the refused calls above fed and signalled nothing: cat runs, its output is ours only', async () => {
    expect(await listPids(secure)).toContain(cat.pid);
    expectOk(
      await secure.unary('process.Process/SendInput', {
        process: { pid: cat.pid },
        input: { stdin: b64('marker\n') },
      }),
    );
    const summary = await cat.waitFor((s) => s.stdout.includes('marker\n'));
    expect(summary).toMatchObject({ stdout: 'marker\n', end: undefined });
  });

  it('Update of a process without a terminal -> failed_precondition', async () => {
    const reply = await secure.unary('process.Process/Update', {
      process: { pid: cat.pid },
      pty: { size: { cols: 10, rows: 10 } },
    });
    expectConnectError(reply, 400, 'failed_precondition');
  });
});

describe('process input and signals', () => {
  it('SendInput by tag feeds stdin; CloseStdin ends cat with exit 0', async () => {
    const tag = `cat-${randomBytes(4).toString('hex')}`;
    const cat = await start(secure, 'cat', { stdin: true, tag });
    const listed = await secure.unary('process.Process/List', {});
    expect((listed.body as { processes: object[] }).processes).toContainEqual(
      expect.objectContaining({
        pid: cat.pid,
        tag,
        config: expect.objectContaining({ cmd: '/bin/sh' }),
      }),
    );
    expectOk(
      await secure.unary('process.Process/SendInput', {
        process: { tag },
        input: { stdin: b64('hello\n') },
      }),
    );
    await cat.waitFor((s) => s.stdout === 'hello\n');
    expectOk(await secure.unary('process.Process/CloseStdin', { process: { tag } }));
    const summary = await cat.finish();
    expect(summary).toMatchObject({
      stdout: 'hello\n',
      end: { exited: true, status: 'exit status 0' },
      trailer: {},
    });
  });

  it('SendInput to a process started without stdin -> failed_precondition', async () => {
    const sleeper = await start(secure, 'sleep 5');
    const reply = await secure.unary('process.Process/SendInput', {
      process: { pid: sleeper.pid },
      input: { stdin: b64('x') },
    });
    expectConnectError(reply, 400, 'failed_precondition');
    await secure.unary('process.Process/SendSignal', {
      process: { pid: sleeper.pid },
      signal: 'SIGNAL_SIGKILL',
    });
    await sleeper.finish();
  });

  it.each([
    ['SIGNAL_SIGTERM', 'signal: terminated'],
    ['SIGNAL_SIGKILL', 'signal: killed'],
  ])('SendSignal %s ends a running process with %s', async (signal, status) => {
    const sleeper = await start(secure, 'echo ready; sleep 30');
    await sleeper.waitFor((s) => s.stdout === 'ready\n');
    expectOk(
      await secure.unary('process.Process/SendSignal', { process: { pid: sleeper.pid }, signal }),
    );
    const summary = await sleeper.finish();
    expect(summary.end).toMatchObject({ status, error: status });
    expect(summary.end?.exited).not.toBe(true);
    expect(summary.trailer).toEqual({});
    await expect.poll(() => listPids(secure), { timeout: 3000 }).not.toContain(sleeper.pid);
  });

  it.each([
    ['SIGNAL_SIGTERM', 'signal: terminated'],
    ['SIGNAL_SIGKILL', 'signal: killed'],
  ])('SendSignal %s right after the start event still ends the process', async (signal) => {
    // Signalled while the process may still be starting up: it must end all the same.
    const sbx = await sandbox({ secure: false });
    const marker = `moatsig${randomBytes(6).toString('hex')}`;
    const sleepers: Running[] = [];
    for (let i = 0; i < 20; i++) {
      const sleeper = await start(sbx, `: ${marker}; sleep 30`);
      sleepers.push(sleeper);
      expectOk(
        await sbx.unary('process.Process/SendSignal', { process: { pid: sleeper.pid }, signal }),
      );
    }
    const ends = await Promise.all(
      sleepers.map((sleeper) =>
        sleeper.call.rest(3000).then(
          (frames) => summarize(frames).end?.status ?? 'no end event',
          () => 'still running after 3 s',
        ),
      ),
    );
    const leftovers = hostProcesses().filter((line) => line.includes(marker)).length;
    await lifecycle('kill', sbx.sandboxID);
    expect({ ends, leftovers }).toEqual({
      ends: ends.map(() => expect.stringMatching(/^signal: /)),
      leftovers: 0,
    });
  });

  it('StreamInput: several envelopes in one body feed cat in order', async () => {
    const cat = await start(secure, 'cat', { stdin: true });
    const call = secure.clientStream('process.Process/StreamInput', [
      { start: { process: { pid: cat.pid } } },
      { data: { input: { stdin: b64('one\n') } } },
      { keepalive: {} },
      { data: { input: { stdin: b64('two\n') } } },
    ]);
    call.end();
    await call.ready;
    expect(call.status).toBe(200);
    expect(call.contentType).toMatch(/^application\/connect\+json/);
    expect(await call.rest()).toEqual([
      { flags: 0, message: {} },
      { flags: 2, message: {} },
    ]);
    await cat.waitFor((s) => s.stdout === 'one\ntwo\n');
    expectOk(await secure.unary('process.Process/CloseStdin', { process: { pid: cat.pid } }));
    expect((await cat.finish()).end).toEqual({ exited: true, status: 'exit status 0' });
  });

  it('StreamInput applies each message as it arrives', async () => {
    const cat = await start(secure, 'cat', { stdin: true });
    const call = secure.clientStream('process.Process/StreamInput', [
      { start: { process: { pid: cat.pid } } },
      { data: { input: { stdin: b64('first\n') } } },
    ]);
    await cat.waitFor((s) => s.stdout === 'first\n');
    call.write({ data: { input: { stdin: b64('second\n') } } });
    await cat.waitFor((s) => s.stdout === 'first\nsecond\n');
    call.end();
    await call.ready;
    expect(call.status).toBe(200);
    expect(await call.rest()).toEqual([
      { flags: 0, message: {} },
      { flags: 2, message: {} },
    ]);
    await secure.unary('process.Process/CloseStdin', { process: { pid: cat.pid } });
    await cat.finish();
  });

  it('StreamInput that does not begin with start ends with invalid_argument', async () => {
    const call = secure.clientStream('process.Process/StreamInput', [
      { data: { input: { stdin: b64('x') } } },
    ]);
    call.end();
    await call.ready;
    expect(call.status).toBe(200);
    expect(await call.rest()).toEqual([
      { flags: 2, message: { error: { code: 'invalid_argument', message: expect.any(String) } } },
    ]);
  });

  it('Update resizes a pty process', async () => {
    const terminal = await start(secure, 'stty size; read line; stty size', {
      pty: { cols: 80, rows: 24 },
    });
    await terminal.waitFor((s) => s.pty.includes('24 80'));
    expectOk(
      await secure.unary('process.Process/Update', {
        process: { pid: terminal.pid },
        pty: { size: { cols: 100, rows: 40 } },
      }),
    );
    expectOk(
      await secure.unary('process.Process/SendInput', {
        process: { pid: terminal.pid },
        input: { pty: b64('\n') },
      }),
    );
    const summary = await terminal.finish();
    expect(summary.pty).toMatch(/24 80\r?\n[\s\S]*40 100/);
    expect(summary).toMatchObject({ stdout: '', stderr: '', end: { status: 'exit status 0' } });
  });
});

// --- Compose, /envs -----------------------------------------------------------------------------

describe('POST /files/compose through the sandbox listener', () => {
  const upload = async (file: string, data: string, username?: string) => {
    const query = new URLSearchParams({ path: file, ...(username ? { username } : {}) });
    const reply = await open.request({
      method: 'POST',
      path: `/files?${query}`,
      headers: { 'Content-Type': 'application/octet-stream' },
      body: data,
    });
    expect(reply.status, reply.text).toBe(200);
  };
  const download = (file: string, username?: string) =>
    open.request({
      path: `/files?${new URLSearchParams({ path: file, ...(username ? { username } : {}) })}`,
    });
  const compose = (body: unknown) =>
    open.request({
      method: 'POST',
      path: '/files/compose',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
    });

  it('keeps the order of the sources and removes them after success', async () => {
    // Names sort differently from the order given, so order cannot come from the folder.
    const parts: Array<[string, string]> = [
      ['/home/user/cmp/c', 'first|'],
      ['/home/user/cmp/a', 'second|'],
      ['/home/user/cmp/b', 'third'],
    ];
    for (const [file, data] of parts) await upload(file, data);
    const reply = await compose({
      source_paths: parts.map(([file]) => file),
      destination: '/home/user/cmp/out/all.txt',
    });
    expectOk(reply, { path: '/home/user/cmp/out/all.txt', name: 'all.txt', type: 'file' });
    expect((await download('/home/user/cmp/out/all.txt')).text).toBe('first|second|third');
    for (const [file] of parts) expect((await download(file)).status).toBe(404);
  });

  it('username root: relative paths against /root, and the result belongs to root', async () => {
    await upload('r1', 'root-', 'root');
    await upload('r2', 'owned', 'root');
    const reply = await compose({
      source_paths: ['r1', 'r2'],
      destination: 'rr',
      username: 'root',
    });
    expectOk(reply, { path: '/root/rr', name: 'rr', type: 'file' });
    const seen = await run(open, 'stat -c "%U %s" /root/rr; cat /root/rr; echo; ls /root', {
      headers: { Authorization: basic('root') },
    });
    expect(seen.stdout).toBe('root 10\nroot-owned\nrr\n');
  });

  it('a missing source fails with 404, leaving every source and no destination', async () => {
    await upload('/home/user/fail/a', 'A');
    await upload('/home/user/fail/b', 'B');
    const reply = await compose({
      source_paths: ['/home/user/fail/a', '/home/user/fail/missing', '/home/user/fail/b'],
      destination: '/home/user/fail/out',
    });
    expectSandboxError(reply, 404, open.sandboxID);
    expect((await download('/home/user/fail/a')).text).toBe('A');
    expect((await download('/home/user/fail/b')).text).toBe('B');
    expect((await download('/home/user/fail/out')).status).toBe(404);
    const listed = await run(open, 'ls -A /home/user/fail');
    expect(listed.stdout).toBe('a\nb\n');
  });

  it.each([
    ['an unknown field', { source_paths: ['/home/user/x'], destination: '/home/user/y', mode: 1 }],
    ['sourcePaths in camel case', { sourcePaths: ['/home/user/x'], destination: '/home/user/y' }],
    ['no destination', { source_paths: ['/home/user/x'] }],
  ])('%s -> 400', async (_name, body) => {
    expectSandboxError(await compose(body), 400, open.sandboxID);
  });
});

describe('GET /envs', () => {
  it("returns exactly the create's envVars, never the proxy credential", async () => {
    const envVars = { ALPHA: '1', BETA: 'two words', EMPTY: '' };
    const sbx = await sandbox({ envVars });
    const reply = await sbx.request({ path: '/envs' });
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toMatch(/^application\/json/);
    expect(reply.body).toEqual(envVars);
    // The processes do get the proxy (with the credential); /envs must not show it.
    const proxy = (await run(sbx, 'printf %s "$HTTPS_PROXY"')).stdout;
    expect(proxy).toMatch(/^http:\/\/[^:]+:[^@]+@/);
    expect(reply.text).not.toContain(new URL(proxy).password);
  });

  it('a sandbox created without envVars has {}', async () => {
    const reply = await open.request({ path: '/envs' });
    expect({ status: reply.status, body: reply.body }).toEqual({ status: 200, body: {} });
  });
});

// --- Pause and kill reach forked children -------------------------------------------------------

describe('pause and kill reach every process of the sandbox', () => {
  it('pause freezes a forked child; connect thaws it; kill leaves nothing on the host', async () => {
    const sbx = await sandbox({ secure: false });
    const marker = `moatmark${randomBytes(6).toString('hex')}`;
    const loop = await start(
      sbx,
      `: ${marker}; i=0; (while true; do i=$((i+1)); echo $i > /tmp/child.next; mv /tmp/child.next /tmp/child; sleep 0.05; done) & while true; do sleep 1; done`,
    );
    // The count is renamed into place, so a pause between opening and writing the file (which
    // truncates it) never shows an empty count. The client leaves; the process lives on.
    loop.call.close();
    const childFile = hostPathOf(harness.moat.config.dataDir, sbx.sandboxID, '/tmp/child');
    const read = () => (existsSync(childFile) ? readFileSync(childFile, 'utf8').trim() : '');
    await expect.poll(() => Number(read()), { timeout: 15_000 }).toBeGreaterThan(2);
    expect(hostProcesses().filter((line) => line.includes(marker)).length).toBeGreaterThanOrEqual(
      2,
    );

    await lifecycle('pause', sbx.sandboxID);
    const first = read();
    await sleep(300);
    const second = read();
    expect(first).toMatch(/^\d+$/);
    expect(second).toBe(first);

    await lifecycle('connect', sbx.sandboxID);
    await expect.poll(() => Number(read()), { timeout: 15_000 }).toBeGreaterThan(Number(first) + 2);
    expect(await listPids(sbx)).toContain(loop.pid);

    await lifecycle('kill', sbx.sandboxID);
    await expect
      .poll(() => hostProcesses().filter((line) => line.includes(marker)), { timeout: 15_000 })
      .toEqual([]);
  });
});
