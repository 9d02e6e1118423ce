/**
 * An in-process Moat for platform API tests, and a small client that talks to it over real
 * HTTP on loopback the way the e2b SDK does (X-API-KEY header, JSON bodies, encoded IDs).
 */
import { pino } from 'pino';
import { expect } from 'vitest';
import { scratchMoatFlags } from '../../bench/lib/scratch.js';
import { type RunningMoat, startMoat } from '../../src/app/index.js';
import { loadConfig, type MoatConfig } from '../../src/config.js';
import { FakeDns, type ZoneEntry } from './fake-dns.js';

export const API_KEY = 'moat-test-key-0123456789abcdef';

export interface Reply {
  readonly status: number;
  readonly headers: Headers;
  readonly text: string;
  /** The parsed JSON body; undefined when the body is empty. */
  readonly body: unknown;
}

export interface RequestOptions {
  /** Sent as JSON. */
  readonly body?: unknown;
  /** Sent as is, with a JSON content type (for bodies that are not valid JSON). */
  readonly raw?: string;
  /** The API key to send; null sends none. Defaults to the key Moat was started with. */
  readonly key?: string | null;
  readonly headers?: Record<string, string>;
}

/** The create/connect/resume reply, and the detail fields the tests read. */
export interface Created {
  sandboxID: string;
  templateID: string;
  alias: string | null;
  envdVersion: string;
  envdAccessToken: string | null;
  trafficAccessToken: string | null;
}
export interface Detail extends Created {
  state: 'running' | 'paused';
  startedAt: string;
  endAt: string;
  metadata: Record<string, string>;
  allowInternetAccess: boolean | null;
  network: { allowOut: string[]; denyOut: string[] };
  egress: { address: string; proxyUrl: string; dns: string; enforcement: string };
  flows: { allowed: number; denied: number; bytesUp: number; bytesDown: number };
}

export class ApiClient {
  constructor(
    readonly base: string,
    readonly key: string = API_KEY,
  ) {}

  async call(method: string, path: string, options: RequestOptions = {}): Promise<Reply> {
    const key = options.key === undefined ? this.key : options.key;
    const body =
      options.raw ?? (options.body === undefined ? undefined : JSON.stringify(options.body));
    const headers: Record<string, string> = {
      ...(key === null ? {} : { 'X-API-KEY': key }),
      ...(body === undefined ? {} : { 'Content-Type': 'application/json' }),
      ...options.headers,
    };
    const response = await fetch(`${this.base}${path}`, {
      method,
      headers,
      body,
      signal: AbortSignal.timeout(10_000),
    });
    const text = await response.text();
    const json = text !== '' && response.headers.get('content-type')?.includes('json');
    return {
      status: response.status,
      headers: response.headers,
      text,
      body: json ? (JSON.parse(text) as unknown) : undefined,
    };
  }

  get = (path: string, options?: RequestOptions) => this.call('GET', path, options);
  post = (path: string, body?: unknown, options?: RequestOptions) =>
    this.call('POST', path, { ...options, body });
  put = (path: string, body?: unknown, options?: RequestOptions) =>
    this.call('PUT', path, { ...options, body });
  delete = (path: string, options?: RequestOptions) => this.call('DELETE', path, options);

  /** Creates a base sandbox that outlives a test file (300 s unless the body says otherwise). */
  async sandbox(body: object = {}): Promise<Created> {
    // Not secure unless asked: these tests are about the platform API, not envd tokens.
    const reply = await this.post('/v2/sandboxes', {
      templateID: 'base',
      timeout: 300,
      secure: false,
      ...body,
    });
    expect(reply.status, reply.text).toBe(201);
    return reply.body as Created;
  }

  /** Creates `count` sandboxes, twenty at a time; returns their IDs. */
  async sandboxes(count: number, body: object = {}): Promise<string[]> {
    const ids: string[] = [];
    for (let i = 0; i < count; i += 20) {
      const batch = Array.from({ length: Math.min(20, count - i) }, () => this.sandbox(body));
      ids.push(...(await Promise.all(batch)).map((s) => s.sandboxID));
    }
    return ids;
  }

  async detail(sandboxID: string): Promise<Detail> {
    const reply = await this.get(`/sandboxes/${sandboxID}`);
    expect(reply.status, reply.text).toBe(200);
    return reply.body as Detail;
  }

  /** Snapshots the sandbox; returns the snapshot ID. */
  async snapshot(sandboxID: string, name?: string): Promise<string> {
    const reply = await this.post(`/sandboxes/${sandboxID}/snapshots`, name ? { name } : {});
    expect(reply.status, reply.text).toBe(201);
    return (reply.body as { snapshotID: string }).snapshotID;
  }

  /** GET with a query as the SDK writes it. */
  list = (path: string, params: Record<string, string | number | undefined>) =>
    this.get(path + query(params));

  /** The IDs of one list page. */
  async ids(path: string, params: Record<string, string | undefined>, field = 'sandboxID') {
    const reply = await this.list(path, params);
    expect(reply.status, reply.text).toBe(200);
    return idsOf(reply, field);
  }

  /** Follows X-Next-Token to the last page (which has none); returns each page's IDs. */
  async pages(
    path: string,
    params: Record<string, string | number | undefined>,
    field = 'sandboxID',
  ): Promise<string[][]> {
    const pages: string[][] = [];
    let nextToken: string | undefined;
    for (let i = 0; i < 50; i++) {
      const reply = await this.list(path, { ...params, nextToken });
      expect(reply.status, reply.text).toBe(200);
      pages.push(idsOf(reply, field));
      nextToken = reply.headers.get('x-next-token') ?? undefined;
      if (nextToken === undefined) return pages;
      expect(nextToken).not.toBe('');
    }
    throw new Error('more than 50 pages');
  }
}

/** The IDs in a list reply, in order. */
export const idsOf = (reply: Reply, field = 'sandboxID'): string[] =>
  (reply.body as Array<Record<string, string>>).map((item) => item[field]!);

/** Waits for the clock to tick, so that things made one after another get distinct times. */
export async function nextMillisecond(): Promise<void> {
  const start = Date.now();
  while (Date.now() === start) await new Promise((resolve) => setTimeout(resolve, 1));
}

export interface ApiMoat {
  readonly moat: RunningMoat;
  readonly upstream: FakeDns;
  readonly api: ApiClient;
  stop(): Promise<void>;
}

/**
 * Moat's configuration for an in-process test: a scratch data folder, every listener on a free
 * loopback port, the known API key, the given loopback DNS upstream, silent logs.
 */
export function testMoatConfig(
  upstreamPort: number,
  flags: Record<string, string> = {},
): { config: MoatConfig; scratch: ReturnType<typeof scratchMoatFlags> } {
  const scratch = scratchMoatFlags();
  const config = loadConfig({
    flags: {
      ...scratch.flags,
      'api-keys': API_KEY,
      'dns-listen': '127.0.0.1:0',
      'dns-upstream': `127.0.0.1:${upstreamPort}`,
      'proxy-listen': '127.0.0.1:0',
      'transparent-listen': 'off',
      'log-level': 'silent',
      ...flags,
    },
  });
  if (!config.ok) throw new Error(config.error);
  return { config: config.value, scratch };
}

/**
 * Starts Moat on loopback with free ports, a known key and a FakeDns upstream. `logs`: when
 * given, Moat's log lines (JSON, debug and up) are appended to it, for tests of what Moat logs.
 */
export async function startApiMoat(
  zone: Map<string, ZoneEntry> = new Map(),
  flags: Record<string, string> = {},
  logs?: string[],
): Promise<ApiMoat> {
  const upstream = await new FakeDns(zone).start();
  const { config, scratch } = testMoatConfig(upstream.port, flags);
  const logger =
    logs === undefined
      ? pino({ level: 'silent' })
      : pino({ level: 'debug' }, { write: (line: string) => void logs.push(line) });
  const moat = await startMoat(config, logger, { defaultMetrics: false });
  const { host, port } = moat.listening.api;
  return {
    moat,
    upstream,
    api: new ApiClient(`http://${host}:${port}`),
    stop: async () => {
      await moat.stop();
      await upstream.stop();
      scratch.remove();
    },
  };
}

/** The `metadata` query value exactly as the e2b SDK builds it (/tmp/e2b-platform-api.md §3.3). */
export const sdkMetadata = (metadata: Record<string, string>): string =>
  new URLSearchParams(
    Object.fromEntries(
      Object.entries(metadata).map(([k, v]) => [encodeURIComponent(k), encodeURIComponent(v)]),
    ),
  ).toString();

/** A query string as openapi-fetch writes it: each value encodeURIComponent'ed once more. */
export const query = (params: Record<string, string | number | undefined>): string => {
  const parts = Object.entries(params)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${encodeURIComponent(String(v))}`);
  return parts.length === 0 ? '' : `?${parts.join('&')}`;
};

/** Every platform error is exactly {code: <the status>, message: <text>}. */
export function expectError(reply: Reply, status: number, message?: string | RegExp): void {
  expect({ status: reply.status, text: reply.text }).toMatchObject({ status });
  expect(reply.headers.get('content-type')).toMatch(/^application\/json/);
  expect(Object.keys(reply.body as object).sort()).toEqual(['code', 'message']);
  const body = reply.body as { code: unknown; message: unknown };
  expect(body.code).toBe(status);
  expect(typeof body.message).toBe('string');
  if (typeof message === 'string') expect(body.message).toBe(message);
  else if (message) expect(body.message).toMatch(message);
}

/** A create, connect or resume reply: exactly the wire fields (`fields` overrides). */
export function expectCreated(reply: Reply, status: number, fields: Partial<Created> = {}): void {
  expect(reply.status, reply.text).toBe(status);
  expect(reply.body).toEqual({
    templateID: 'base',
    sandboxID: expect.stringMatching(/^i[a-z0-9]{20}$/),
    clientID: expect.any(String),
    envdVersion: expect.stringMatching(/^\d+\.\d+\.\d+$/),
    alias: 'base',
    envdAccessToken: null,
    trafficAccessToken: null,
    domain: null,
    ...fields,
  });
}

/** A 204 with nothing after the headers (the SDK must not try to parse a body). */
export function expectNoContent(reply: Reply): void {
  expect({ status: reply.status, text: reply.text }).toEqual({ status: 204, text: '' });
}
