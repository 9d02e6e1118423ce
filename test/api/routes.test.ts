/**
 * The platform API over real HTTP: each route's codes, wire shapes and declared errors, auth,
 * listing as the e2b SDK queries it, snapshots, /openapi.json, /metrics, and enforcement of
 * published rules by the DNS interceptor.
 */
import { X509Certificate } from 'node:crypto';
import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROUTES } from '../../src/api/routes.js';
import { unsupportedRoutes } from '../../src/api/routes/unsupported.js';
import { DEFAULT_INTERNAL_DENY } from '../../src/policy/index.js';
import { ALL_TRAFFIC_MESSAGE } from '../../src/policy/rules.js';
import {
  API_KEY,
  type ApiClient,
  type ApiMoat,
  type Created,
  type Detail,
  expectCreated,
  expectError,
  expectNoContent,
  idsOf,
  nextMillisecond,
  query,
  sdkMetadata,
  startApiMoat,
} from '../support/api-client.js';
import { udpQuery } from '../support/dns-client.js';

interface BodySchema {
  properties: Record<string, { minimum?: number; maximum?: number }>;
  required?: string[];
  additionalProperties?: boolean;
}
type Operation = {
  security?: unknown;
  requestBody?: { content: Record<string, { schema: BodySchema }> };
};

const ZONE = new Map([
  ['allowed.test', { A: ['93.184.216.30'] }],
  ['denied.test', { A: ['93.184.216.31'] }],
]);
/** Well-formed, never issued. */
const UNKNOWN = `i${'0'.repeat(20)}`;
const notFound = (id: string) => `Sandbox "${id}" doesn't exist or you don't have access to it`;
const startsWith = (text: string) => new RegExp(`^${text.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}`);

/** Every platform route (wire-compat.md), each with a body its schema accepts. */
const PLATFORM_ROUTES: ReadonlyArray<{ method: string; url: string; body?: object }> = [
  { method: 'POST', url: '/sandboxes', body: { templateID: 'base' } },
  { method: 'POST', url: '/v2/sandboxes', body: { templateID: 'base' } },
  { method: 'GET', url: '/sandboxes' },
  { method: 'GET', url: '/v2/sandboxes' },
  { method: 'GET', url: '/sandboxes/:sandboxID' },
  { method: 'GET', url: '/flows' },
  { method: 'GET', url: '/ca.pem' },
  { method: 'GET', url: '/internal-deny' },
  { method: 'DELETE', url: '/sandboxes/:sandboxID' },
  { method: 'POST', url: '/sandboxes/:sandboxID/timeout', body: { timeout: 30 } },
  { method: 'POST', url: '/sandboxes/:sandboxID/refreshes', body: { duration: 30 } },
  { method: 'POST', url: '/sandboxes/:sandboxID/pause', body: {} },
  { method: 'POST', url: '/sandboxes/:sandboxID/resume', body: { timeout: 30 } },
  { method: 'POST', url: '/sandboxes/:sandboxID/connect', body: { timeout: 30 } },
  { method: 'POST', url: '/v2/sandboxes/:sandboxID/connect', body: { timeout: 30 } },
  { method: 'PUT', url: '/sandboxes/:sandboxID/network', body: {} },
  { method: 'POST', url: '/sandboxes/:sandboxID/snapshots', body: {} },
  { method: 'POST', url: '/sandboxes/:sandboxID/fork', body: { count: 1 } },
  { method: 'GET', url: '/sandboxes/:sandboxID/metrics' },
  { method: 'GET', url: '/sandboxes/metrics' },
  { method: 'GET', url: '/snapshots' },
  { method: 'GET', url: '/templates' },
  { method: 'DELETE', url: '/templates/:templateID' },
  { method: 'GET', url: '/secrets' },
  { method: 'POST', url: '/secrets', body: { name: 'n', value: 'v' } },
  { method: 'GET', url: '/secrets/:secretID' },
  { method: 'POST', url: '/secrets/:secretID', body: { value: 'v' } },
  { method: 'DELETE', url: '/secrets/:secretID' },
];
const SANDBOX_ROUTES = PLATFORM_ROUTES.filter((r) => r.url.includes(':sandboxID'));
const at = (url: string, id: string) =>
  url.replace(':sandboxID', id).replace(':templateID', encodeURIComponent(id));
const label = (r: { method: string; url: string }) => `${r.method} ${r.url}`;

let env: ApiMoat;
let api: ApiClient;
beforeAll(async () => {
  env = await startApiMoat(ZONE);
  api = env.api;
});
afterAll(() => env?.stop());

describe('auth', () => {
  it.each(PLATFORM_ROUTES)('$method $url refuses a missing or wrong key', async (route) => {
    const path = at(route.url, route.url.includes('templates') ? 'moat/x:default' : UNKNOWN);
    for (const key of [null, '', 'wrong-key-0123456789', API_KEY.toUpperCase()]) {
      expectError(await api.call(route.method, path, { body: route.body, key }), 401);
    }
  });

  it('reads the key under any header casing, as the SDK sends X-API-KEY', async () => {
    // node:http sends header names as written (fetch would lower-case them first).
    const { port } = env.moat.listening.api;
    const statusWith = (headers: Record<string, string>) =>
      new Promise<number>((resolve, reject) => {
        const options = { host: '127.0.0.1', port, path: '/templates', headers, timeout: 5000 };
        http.get(options, (res) => resolve(res.resume().statusCode!)).on('error', reject);
      });
    for (const name of ['X-API-KEY', 'x-api-key', 'X-Api-Key']) {
      expect(await statusWith({ [name]: API_KEY })).toBe(200);
    }
    expect(await statusWith({ 'X-API-KEY': `${API_KEY}x` })).toBe(401);
  });

  it('serves /health, /metrics and /openapi.json without a key', async () => {
    const health = await api.get('/health', { key: null });
    expect([health.status, health.body]).toEqual([200, { status: 'ok' }]);
    expect((await api.get('/metrics', { key: null })).status).toBe(200);
    expect((await api.get('/openapi.json', { key: null })).status).toBe(200);
  });

  it("GET /ca.pem serves the node's CA certificate (PEM) and nothing of its key", async () => {
    const reply = await api.get('/ca.pem');
    expect(reply.status).toBe(200);
    expect(reply.headers.get('content-type')).toBe('application/x-pem-file');
    expect(reply.text).toBe(env.moat.ca.certificatePem);
    expect(new X509Certificate(reply.text).ca).toBe(true);
    expect(reply.text).not.toContain('PRIVATE KEY');
  });

  it("GET /internal-deny serves the node's internal deny list, each range as written with its note", async () => {
    const reply = await api.get('/internal-deny');
    expect(reply.status).toBe(200);
    expect(reply.body).toEqual({
      internalDeny: DEFAULT_INTERNAL_DENY.map(({ entry, description }) => ({ entry, description })),
    });
    const own = await startApiMoat(new Map(), { 'internal-deny': 'default,-198.18.5.0/24' });
    try {
      const { internalDeny } = (await own.api.get('/internal-deny')).body as {
        internalDeny: Array<{ entry: string }>;
      };
      expect(internalDeny.map((r) => r.entry)).toEqual(
        own.moat.internal.ranges.map((r) => r.entry),
      );
      expect(internalDeny.map((r) => r.entry)).toContain('198.18.4.0/24');
      expect(internalDeny.map((r) => r.entry)).not.toContain('198.18.0.0/15');
    } finally {
      await own.stop();
    }
  });

  it('requires the key on /metrics when metrics-require-key is set', async () => {
    const guarded = await startApiMoat(new Map(), { 'metrics-require-key': 'true' });
    try {
      expectError(await guarded.api.get('/metrics', { key: null }), 401);
      expectError(await guarded.api.get('/metrics', { key: 'wrong-key-0123456789' }), 401);
      const metrics = await guarded.api.get('/metrics');
      expect(metrics.status).toBe(200);
      expect(metrics.text).toMatch(/^moat_sandboxes\{state="running"\} 0$/m);
      expect((await guarded.api.get('/health', { key: null })).status).toBe(200);
    } finally {
      await guarded.stop();
    }
  });
});

describe('errors', () => {
  const MALFORMED = ['nope', `I${'a'.repeat(20)}`, `i${'a'.repeat(21)}`, `i${'a'.repeat(19)}-`];
  // No sandbox has a malformed ID, so it is not found: the SDK's kill() then resolves false.
  it.each(SANDBOX_ROUTES)('$method $url: a malformed ID is 404', async ({ method, url, body }) => {
    for (const id of MALFORMED) {
      expectError(await api.call(method, at(url, id), { body }), 404, notFound(id));
    }
  });

  it.each(SANDBOX_ROUTES)('$method $url: an unknown sandbox is 404', async (r) => {
    const reply = await api.call(r.method, at(r.url, UNKNOWN), { body: r.body });
    expectError(reply, 404, notFound(UNKNOWN));
  });

  const [V2, S] = ['/v2/sandboxes', `/sandboxes/${UNKNOWN}`];
  const base = (fields: object) => ({ templateID: 'base', ...fields });
  const badToken = Buffer.from('[1,2]').toString('base64url');
  it.each<[string, string, unknown, string]>([
    ['POST', V2, {}, 'body.templateID is required'],
    ['POST', V2, { templateID: 7 }, 'body.templateID must be string'],
    ['POST', V2, base({ timeout: -1 }), 'body.timeout must be >= 0'],
    ['POST', '/sandboxes', base({ timeout: '5' }), 'body.timeout must be integer'],
    ['POST', V2, base({ timeot: 5 }), 'body has unknown field "timeot"'],
    [
      'POST',
      V2,
      base({ network: { rules: { 'a.test': [{ inject: {} }] } } }),
      'body.network.rules.a.test[0] has unknown field "inject"',
    ],
    ['POST', V2, base({ network: { allowOut: [1] } }), 'body.network.allowOut[0] must be string'],
    ['POST', V2, base({ metadata: { a: 1 } }), 'body.metadata.a must be string'],
    ['POST', V2, base({ mcp: {} }), 'MCP gateways are not supported by Moat'],
    ['POST', V2, base({ mcp: 'x' }), 'MCP gateways are not supported by Moat'],
    [
      'POST',
      V2,
      base({ volumeMounts: [{ name: 'v', path: '/v' }] }),
      'volume mounts are not supported by Moat',
    ],
    ['POST', `${S}/timeout`, {}, 'body.timeout is required'],
    ['POST', `${S}/timeout`, { timeout: 1.5 }, 'body.timeout must be integer'],
    ['POST', `${S}/refreshes`, { duration: 3601 }, 'body.duration must be <= 3600'],
    ['POST', `${S}/pause`, { memory: 'yes' }, 'body.memory must be boolean'],
    ['PUT', `${S}/network`, { allowOut: 'x.test' }, 'body.allowOut must be array'],
    ['PUT', `${S}/network`, { rules: { 'a.test': 'x' } }, 'body.rules.a.test must be array'],
    ['POST', `${S}/snapshots`, { name: '' }, 'body.name must NOT have fewer than 1 characters'],
    ['GET', `${V2}?order=up`, undefined, 'query.order must be one of "asc", "desc"'],
    ['GET', `${V2}?limit=ten`, undefined, 'query.limit must be integer'],
    [
      'GET',
      `${V2}?startedAfter=notadate`,
      undefined,
      'query.startedAfter must be an RFC 3339 date-time such as 2026-01-31T12:00:00Z',
    ],
    [
      'GET',
      `${V2}?startedAfter=2026-02-31T00:00:00Z`,
      undefined,
      'query.startedAfter must be an RFC 3339 date-time such as 2026-01-31T12:00:00Z',
    ],
    ['GET', `${V2}?bogus=1`, undefined, 'query has unknown field "bogus"'],
    ['GET', `${V2}?nextToken=garbage`, undefined, 'Invalid next token'],
    ['GET', `${V2}?nextToken=${badToken}`, undefined, 'Invalid next token'],
    ['GET', '/sandboxes?state=running', undefined, 'query has unknown field "state"'],
    ['GET', '/snapshots?limit=0', undefined, 'query.limit must be >= 1'],
    ['GET', '/snapshots?limit=101', undefined, 'query.limit must be <= 100'],
    ['GET', '/snapshots?nextToken=garbage', undefined, 'Invalid next token'],
  ])('%s %s %j -> 400 %s', async (method, path, body, message) => {
    expectError(await api.call(method, path, { body }), 400, message);
  });

  // The E2B routes Moat lacks: a 501 naming the feature, never a 404 the SDK reads as
  // "sandbox not found"; the key is still required.
  it.each(unsupportedRoutes(ROUTES).map((r) => [label(r), r] as const))(
    '%s answers 501 naming the feature',
    async (_label, route) => {
      const path = route.url.replace(/:(\w+)/g, (_m, name: string) =>
        name === 'sandboxID' ? UNKNOWN : `some-${name}`,
      );
      const body = route.method === 'GET' || route.method === 'DELETE' ? undefined : {};
      const reply = await api.call(route.method, path, { body });
      expectError(reply, 501, /^[A-Z][a-z]+( [a-z]+)* is not supported by Moat$/);
      expectError(await api.call(route.method, path, { body, key: null }), 401);
    },
  );

  it('names the sandbox logs feature in its 501', async () => {
    const reply = await api.get(`/sandboxes/${UNKNOWN}/logs`);
    expect([reply.status, reply.body]).toEqual([
      501,
      { code: 501, message: 'Sandbox logs is not supported by Moat' },
    ]);
  });

  it('answers a body that is not JSON, and an unknown route, with the error body', async () => {
    expectError(await api.call('POST', V2, { raw: '{"templateID":' }), 400);
    expectError(await api.get('/v3/sandboxes'), 404, 'no route for GET /v3/sandboxes');
  });

  it.each<[object, RegExp]>([
    [{ allowOut: ['example.test'] }, startsWith(ALL_TRAFFIC_MESSAGE)],
    [{ allowOut: ['example.test'], denyOut: ['10.0.0.0/8'] }, startsWith(ALL_TRAFFIC_MESSAGE)],
    [{ denyOut: ['example..test'] }, startsWith('invalid denied CIDR example..test ')],
    [
      { allowOut: ['example.test:0'], denyOut: ['0.0.0.0/0'] },
      startsWith('invalid allowed domain example.test:0 (allowOut[0]): port "0"'),
    ],
    [{ denyOut: ['192.0.2.1:70000'] }, startsWith('invalid denied CIDR 192.0.2.1:70000 ')],
    [{ denyOut: ['0.0.0.0/8'] }, startsWith('invalid denied CIDR 0.0.0.0/8 ')],
    [{ allowOut: ['0.0.0.0'] }, startsWith('invalid allowed address 0.0.0.0 ')],
  ])('refuses the egress rules %j on create and on PUT network', async (rules, message) => {
    expectError(await api.post(V2, base({ network: rules })), 400, message);
    const network = { allowOut: ['192.0.2.1'], denyOut: ['0.0.0.0/0'] };
    const { sandboxID } = await api.sandbox({ network });
    expectError(await api.put(`/sandboxes/${sandboxID}/network`, rules), 400, message);
    // A refused update leaves the rules as they were.
    expect((await api.detail(sandboxID)).network).toMatchObject(network);
    expectNoContent(await api.delete(`/sandboxes/${sandboxID}`));
  });
});

describe('create and detail', () => {
  it('creates on both paths with the wire reply, and details with every field', async () => {
    const { listening } = env.moat;
    for (const path of ['/sandboxes', '/v2/sandboxes']) {
      const body = { templateID: 'base', timeout: 300, mcp: null, volumeMounts: [] };
      const reply = await api.post(path, body);
      // v2 (the SDK's path) secures the sandbox API by default; v1 does not.
      const secure = path === '/v2/sandboxes';
      const envdAccessToken = secure ? expect.stringMatching(/^[A-Za-z0-9_-]{20,}$/) : null;
      expectCreated(reply, 201, { envdAccessToken });
      const { sandboxID, envdVersion } = reply.body as Created;
      expect(await api.detail(sandboxID)).toEqual({
        templateID: 'base',
        alias: 'base',
        sandboxID,
        clientID: expect.any(String),
        startedAt: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
        endAt: expect.stringMatching(/Z$/),
        cpuCount: expect.any(Number),
        memoryMB: expect.any(Number),
        diskSizeMB: expect.any(Number),
        metadata: {},
        state: 'running',
        envdVersion,
        envdAccessToken,
        allowInternetAccess: null,
        domain: null,
        network: {
          allowPublicTraffic: true,
          allowOut: [],
          denyOut: [],
          maskRequestHost: null,
          egressProxy: null,
          httpsPorts: [],
          bandwidth: { egressMbps: 0, ingressMbps: 0 },
          mode: 'enforce',
        },
        lifecycle: { autoResume: false, onTimeout: 'kill' },
        egress: {
          address: expect.stringMatching(/^127\.77\.\d+\.\d+$/),
          proxyUrl: `http://127.0.0.1:${listening.proxy.port}`,
          dns: `127.0.0.1:${listening.dns.port}`,
          enforcement: 'proxy',
          bandwidthEnforced: false,
          node: null,
        },
        flows: { allowed: 0, denied: 0, bytesUp: 0, bytesDown: 0 },
        confinement: expect.stringMatching(/^(confined|unconfined)$/),
      });
    }
  });

  it('echoes what create asked for in the detail', async () => {
    const network = { allowOut: ['api.allowed.test', '192.0.2.0/24'], denyOut: ['0.0.0.0/0'] };
    const { sandboxID } = await api.sandbox({
      autoPause: true,
      autoResume: { enabled: true },
      allow_internet_access: false,
      metadata: { owner: 'ann', 'a b': 'c&d' },
      network: { ...network, maskRequestHost: 'localhost:${PORT}' },
    });
    expect(await api.detail(sandboxID)).toMatchObject({
      metadata: { owner: 'ann', 'a b': 'c&d' },
      allowInternetAccess: false,
      network: { ...network, allowPublicTraffic: true, maskRequestHost: 'localhost:${PORT}' },
      lifecycle: { autoResume: true, onTimeout: 'pause' },
    });
  });

  it('issues access tokens by secure and allowPublicTraffic', async () => {
    const token = expect.stringMatching(/^[A-Za-z0-9_-]{20,}$/);
    const cases: Array<[string, object, Partial<Created>]> = [
      [
        '/v2/sandboxes',
        { secure: true, network: { allowPublicTraffic: false } },
        { trafficAccessToken: token },
      ],
      ['/v2/sandboxes', { network: { allowPublicTraffic: false } }, { trafficAccessToken: token }],
      ['/v2/sandboxes', { secure: true }, {}],
      ['/v2/sandboxes', {}, {}],
      ['/v2/sandboxes', { secure: false }, { envdAccessToken: null }],
      ['/sandboxes', {}, { envdAccessToken: null }],
    ];
    for (const [path, body, tokens] of cases) {
      const reply = await api.post(path, { templateID: 'base', ...body });
      expectCreated(reply, 201, { envdAccessToken: token, ...tokens });
      const { sandboxID, envdAccessToken } = reply.body as Created;
      expect((await api.detail(sandboxID)).envdAccessToken).toBe(envdAccessToken);
    }
    const open = { templateID: 'base', secure: false, network: { allowPublicTraffic: false } };
    const message = /allowPublicTraffic false requires secure/;
    expectError(await api.post('/v2/sandboxes', open), 400, message);
  });

  it('lives 15 s by default, and timeout 0 expires the sandbox at once', async () => {
    const reply = await api.post('/v2/sandboxes', { templateID: 'base' });
    const { sandboxID } = reply.body as Created;
    const { startedAt, endAt } = await api.detail(sandboxID);
    expect(Date.parse(endAt) - Date.parse(startedAt)).toBe(15_000);
    expectNoContent(await api.delete(`/sandboxes/${sandboxID}`));
    const brief = await api.sandbox({ timeout: 0 });
    expectError(await api.get(`/sandboxes/${brief.sandboxID}`), 404, notFound(brief.sandboxID));
  });

  it('refuses an unknown template with 404', async () => {
    const message = `template "nope" doesn't exist or you don't have access to it`;
    expectError(await api.post('/v2/sandboxes', { templateID: 'nope' }), 404, message);
  });
});

describe('lifecycle', () => {
  it('answers each transition with its documented status', async () => {
    const { sandboxID: id } = await api.sandbox();
    const path = `/sandboxes/${id}`;
    expectNoContent(await api.post(`${path}/timeout`, { timeout: 120 }));
    expectNoContent(await api.post(`${path}/refreshes`, { duration: 60 }));
    expectNoContent(await api.post(`${path}/refreshes`));
    expectNoContent(await api.put(`${path}/network`, {}));
    expectCreated(await api.post(`${path}/connect`, { timeout: 10 }), 200, { sandboxID: id });
    expectError(await api.post(`${path}/resume`, {}), 409, `Sandbox "${id}" is already running`);
    expectNoContent(await api.post(`${path}/pause`));
    expectError(await api.post(`${path}/pause`, {}), 409);
    expect((await api.detail(id)).state).toBe('paused');
    // Only a running sandbox has a lifetime and rules to change: paused is "not found" to these.
    for (const [method, sub, body] of [
      ['POST', 'timeout', { timeout: 5 }],
      ['POST', 'refreshes', { duration: 5 }],
      ['PUT', 'network', {}],
    ] as const) {
      expectError(await api.call(method, `${path}/${sub}`, { body }), 404, notFound(id));
    }
    expectCreated(await api.post(`/v2${path}/connect`, {}), 201, { sandboxID: id });
    expectCreated(await api.post(`/v2${path}/connect`), 200, { sandboxID: id });
    expectNoContent(await api.post(`${path}/pause`, { memory: true }));
    expectCreated(await api.post(`${path}/resume`, { timeout: 60 }), 201, { sandboxID: id });
    expectNoContent(await api.post(`${path}/pause`));
    expectNoContent(await api.delete(path));
    expectError(await api.delete(path), 404, notFound(id));
    expectError(await api.get(path), 404, notFound(id));
  });

  it('lets timeout shorten the lifetime, while refreshes and connect only extend it', async () => {
    const { sandboxID: id } = await api.sandbox({ timeout: 600 });
    const expectLeft = async (seconds: number) => {
      const left = (Date.parse((await api.detail(id)).endAt) - Date.now()) / 1000;
      expect(left).toBeGreaterThan(seconds - 5);
      expect(left).toBeLessThanOrEqual(seconds);
    };
    const change = async (path: string, body: object, status: number) =>
      expect((await api.post(`/sandboxes/${id}/${path}`, body)).status).toBe(status);
    await change('timeout', { timeout: 100 }, 204);
    await expectLeft(100);
    await change('refreshes', { duration: 10 }, 204);
    await change('connect', { timeout: 10 }, 200);
    await expectLeft(100);
    await change('refreshes', { duration: 200 }, 204);
    await expectLeft(200);
    await change('connect', { timeout: 300 }, 200);
    await expectLeft(300);
  });
});

describe('network', () => {
  it('replaces the rules with exactly the new lists; {} clears them', async () => {
    const network = { allowOut: ['192.0.2.1'], denyOut: ['0.0.0.0/0'] };
    const { sandboxID: id } = await api.sandbox({ network });
    const rules = { allowOut: ['allowed.test', '*.allowed.test'], denyOut: ['0.0.0.0/0', '::/0'] };
    const none = { allowOut: [], denyOut: [] };
    for (const [body, after, allowInternetAccess] of [
      [rules, rules, null],
      [{ allow_internet_access: false }, none, false],
      [{}, none, null],
    ] as const) {
      expectNoContent(await api.put(`/sandboxes/${id}/network`, body));
      expect(await api.detail(id)).toMatchObject({ network: after, allowInternetAccess });
    }
  });

  it('publishes the rules: the sandbox resolves what they allow and nothing else', async () => {
    const { sandboxID: id } = await api.sandbox();
    const { egress } = await api.detail(id);
    // Queries from the sandbox's own source address, as its resolver sends them.
    const resolve = async (name: string) => {
      const reply = await udpQuery(env.moat.listening.dns.port, egress.address, name);
      return [reply.rcode, ...(reply.answers ?? []).map((a) => a.data)];
    };
    const rules = { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] };
    expectNoContent(await api.put(`/sandboxes/${id}/network`, rules));
    expect(await resolve('allowed.test')).toEqual(['NOERROR', '93.184.216.30']);
    expect(await resolve('denied.test')).toEqual(['NXDOMAIN']);
    expect(env.upstream.asked('denied.test')).toEqual([]);
    expectNoContent(await api.put(`/sandboxes/${id}/network`, {}));
    expect(await resolve('denied.test')).toEqual(['NOERROR', '93.184.216.31']);
  });
});

describe('listing sandboxes', () => {
  it('pages with limit and X-Next-Token, newest first by default, no gaps or repeats', async () => {
    const made: string[] = [];
    for (let i = 0; i < 7; i++) {
      await nextMillisecond();
      made.push((await api.sandbox({ metadata: { run: 'pages' } })).sandboxID);
    }
    const newestFirst = [...made].reverse();
    const metadata = sdkMetadata({ run: 'pages' });
    for (const [order, expected] of [
      [undefined, newestFirst],
      ['desc', newestFirst],
      ['asc', made],
    ] as const) {
      const pages = await api.pages('/v2/sandboxes', { metadata, order, limit: 3 });
      expect(pages.map((p) => p.length)).toEqual([3, 3, 1]);
      expect(pages.flat()).toEqual(expected);
    }
    // A page that takes the last item exactly is the last page: no token, no empty page after.
    expect(await api.pages('/v2/sandboxes', { metadata, limit: 7 })).toEqual([newestFirst]);
    const startedAfter = (await api.detail(made[3]!)).startedAt;
    // "At or after", as the SDK documents it: the sandbox started at that moment is in.
    const after = await api.ids('/v2/sandboxes', { metadata, order: 'asc', startedAfter });
    expect(after).toEqual(made.slice(3));
  });

  it('clamps limit into 1..100 (default 100)', async () => {
    const made = await api.sandboxes(101, { metadata: { run: 'clamp' } });
    const metadata = sdkMetadata({ run: 'clamp' });
    for (const limit of [0, -5]) {
      const reply = await api.list('/v2/sandboxes', { metadata, limit });
      expect(idsOf(reply)).toHaveLength(1);
      expect(reply.headers.get('x-next-token')).toBeTruthy();
    }
    for (const limit of [1000, undefined]) {
      const pages = await api.pages('/v2/sandboxes', { metadata, limit });
      expect(pages.map((p) => p.length)).toEqual([100, 1]);
      expect(pages.flat().sort()).toEqual([...made].sort());
    }
    // 101 confined sandboxes: about 10 s on a quiet machine, several times that on a loaded one.
  }, 120_000);

  it('decodes metadata as the SDK encodes it; every pair must match', async () => {
    // The wire example of the SDK notes: the helper encodes exactly as the SDK does.
    expect(query({ metadata: sdkMetadata({ user: 'a b', 'k&': 'v=1' }) })).toBe(
      '?metadata=user%3Da%252520b%26k%252526%3Dv%25253D1',
    );
    const run = 'metadata';
    const a = await api.sandbox({ metadata: { run, user: 'a b', 'k&': 'v=1' } });
    const b = await api.sandbox({ metadata: { run, user: 'a b' } });
    const c = await api.sandbox({ metadata: { run, user: 'a b', 'k&': 'v=2', 'p+q': '100%' } });
    const cases: Array<[Record<string, string>, Created[]]> = [
      [{ run, user: 'a b', 'k&': 'v=1' }, [a]],
      [{ run, user: 'a b' }, [a, b, c]],
      [{ run, 'p+q': '100%' }, [c]],
      [{ run, user: 'a+b' }, []],
      [{ run, user: 'a b', missing: 'x' }, []],
    ];
    for (const [filter, expected] of cases) {
      for (const path of ['/v2/sandboxes', '/sandboxes']) {
        const ids = await api.ids(path, { metadata: sdkMetadata(filter) });
        expect(ids.sort()).toEqual(expected.map((s) => s.sandboxID).sort());
      }
    }
    const listed = await api.list('/v2/sandboxes', { metadata: sdkMetadata({ run, 'k&': 'v=1' }) });
    expect((listed.body as Detail[]).map((s) => s.metadata)).toEqual([
      { run, user: 'a b', 'k&': 'v=1' },
    ]);
  });

  it('filters by state; GET /sandboxes lists running ones only', async () => {
    const metadata = sdkMetadata({ run: 'states' });
    const running = (await api.sandbox({ metadata: { run: 'states' } })).sandboxID;
    const paused = (await api.sandbox({ metadata: { run: 'states' } })).sandboxID;
    expectNoContent(await api.post(`/sandboxes/${paused}/pause`));
    for (const [state, expected] of [
      [undefined, [running, paused]],
      ['running', [running]],
      ['paused', [paused]],
      ['running,paused', [running, paused]],
    ] as const) {
      const reply = await api.list('/v2/sandboxes', { metadata, state });
      expect(idsOf(reply).sort()).toEqual([...expected].sort());
      for (const item of reply.body as Detail[]) {
        expect(item.state).toBe(item.sandboxID === paused ? 'paused' : 'running');
      }
    }
    expect(await api.ids('/sandboxes', { metadata })).toEqual([running]);
    for (const state of ['dead', 'running,dead']) {
      const message = 'query.state has unknown state "dead"; use running, paused';
      expectError(await api.list('/v2/sandboxes', { state }), 400, message);
    }
  });
});

describe('snapshots and templates', () => {
  let source: string;
  beforeAll(async () => {
    source = (await api.sandbox()).sandboxID;
  });

  it.each<[string | undefined, RegExp, 'named' | 'unnamed']>([
    ['alpha', /^moat\/alpha:default$/, 'named'],
    ['beta:v2', /^moat\/beta:v2$/, 'named'],
    ['moat/gamma', /^moat\/gamma:default$/, 'named'],
    [undefined, /^[a-z0-9]{20}:default$/, 'unnamed'],
  ])('names a snapshot %s as %s', async (name, id, kind) => {
    const body = name === undefined ? undefined : { name };
    const reply = await api.post(`/sandboxes/${source}/snapshots`, body);
    expect(reply.status, reply.text).toBe(201);
    const { snapshotID } = reply.body as { snapshotID: string };
    expect(snapshotID).toMatch(id);
    expect(reply.body).toEqual({ snapshotID, names: kind === 'named' ? [snapshotID] : [] });
    expect((await api.detail(source)).state).toBe('running');
  });

  it.each<[unknown, string | RegExp]>([
    ['Bad Name', startsWith('invalid snapshot name "Bad Name"')],
    ['a:b:c', startsWith('invalid snapshot name "a:b:c"')],
    ['x:', startsWith('invalid snapshot name "x:"')],
    ['other/x', /names team namespace "other"/],
    [5, 'body.name must be string'],
    ['x'.repeat(201), 'body.name must NOT have more than 200 characters'],
  ])('refuses the snapshot name %j', async (name, message) => {
    expectError(await api.post(`/sandboxes/${source}/snapshots`, { name }), 400, message);
  });

  it('lists snapshots by sandbox and by name, newest first, in pages', async () => {
    const { sandboxID } = await api.sandbox();
    const made: string[] = [];
    for (let i = 0; i < 3; i++) {
      await nextMillisecond();
      made.push(await api.snapshot(sandboxID));
    }
    const newestFirst = [...made].reverse();
    const pages = await api.pages('/snapshots', { sandboxID, limit: 2 }, 'snapshotID');
    expect(pages.map((p) => p.length)).toEqual([2, 1]);
    expect(pages.flat()).toEqual(newestFirst);
    const all = await api.list('/snapshots', { sandboxID });
    expect(all.body).toEqual(newestFirst.map((snapshotID) => ({ snapshotID, names: [] })));
    const named = await api.snapshot(sandboxID, 'delta:v3');
    for (const name of ['delta', 'delta:v3', 'moat/delta:v3']) {
      expect(await api.ids('/snapshots', { name }, 'snapshotID')).toEqual([named]);
    }
    for (const params of [{ name: 'delta:v4' }, { sandboxID: UNKNOWN }]) {
      expect(await api.ids('/snapshots', params)).toEqual([]);
    }
  });

  it('creates from a snapshot ID, lists it as a template, and deletes it as the SDK does', async () => {
    const id = await api.snapshot(source, 'epsilon');
    expect(id).toBe('moat/epsilon:default');
    const users: string[] = [];
    for (const templateID of [id, 'epsilon', 'epsilon:default']) {
      const reply = await api.post('/v2/sandboxes', { templateID, timeout: 300, secure: false });
      expectCreated(reply, 201, { templateID: id, alias: 'epsilon' });
      users.push((reply.body as Created).sandboxID);
    }
    expect((await api.detail(users[0]!)).templateID).toBe(id);
    const byTemplate = await api.ids('/v2/sandboxes', { template: id });
    expect(byTemplate.sort()).toEqual([...users].sort());

    const templates = (await api.get('/templates')).body as Array<Record<string, unknown>>;
    const template = {
      tag: 'default',
      createdAt: expect.stringMatching(/Z$/),
      buildStatus: 'ready',
    };
    expect(templates[0]).toEqual({
      ...template,
      templateID: 'base',
      snapshotID: null,
      aliases: ['base'],
      names: ['base'],
      sourceSandboxID: null,
      public: true,
    });
    expect(templates.find((t) => t.snapshotID === id)).toEqual({
      ...template,
      templateID: 'moat/epsilon',
      snapshotID: id,
      aliases: ['epsilon'],
      names: [id],
      sourceSandboxID: source,
      public: false,
    });

    const path = `/templates/${encodeURIComponent(id)}`;
    expect(path).toBe('/templates/moat%2Fepsilon%3Adefault');
    expectError(await api.delete(path), 409, new RegExp(`used by sandboxes ${users.join(', ')}`));
    for (const user of users) expectNoContent(await api.delete(`/sandboxes/${user}`));
    expectNoContent(await api.delete(path));
    const gone = `template "${id}" doesn't exist or you don't have access to it`;
    expectError(await api.delete(path), 404, gone);
    expectError(await api.post('/v2/sandboxes', { templateID: id }), 404, gone);
    expect(((await api.get('/templates')).body as unknown[]).length).toBe(templates.length - 1);
    for (const builtIn of ['base', 'base%3Adefault']) {
      expectError(await api.delete(`/templates/${builtIn}`), 400);
    }
  });
});

describe('/openapi.json', () => {
  let doc: { openapi: string; paths: Record<string, Record<string, Operation>> };
  beforeAll(async () => {
    doc = (await api.get('/openapi.json', { key: null })).body as typeof doc;
  });
  const openApiPath = (url: string) => url.replace(/:(\w+)/g, '{$1}');
  const operation = (r: { method: string; url: string }) =>
    doc.paths[openApiPath(r.url)]?.[r.method.toLowerCase()];
  const bodySchema = (r: { method: string; url: string }) =>
    operation(r)?.requestBody?.content['application/json']?.schema;

  it('is OpenAPI 3.1 with every route, each needing the key', () => {
    expect(ROUTES.map(label).sort()).toEqual(PLATFORM_ROUTES.map(label).sort());
    expect(doc.openapi).toMatch(/^3\.1\.\d+$/);
    const documented = Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.keys(ops).map((method) => `${method.toUpperCase()} ${path}`),
    );
    const expected = [...PLATFORM_ROUTES, ...unsupportedRoutes(ROUTES)].map(
      (r) => `${r.method} ${openApiPath(r.url)}`,
    );
    expect(documented.sort()).toEqual(expected.sort());
    for (const route of PLATFORM_ROUTES) {
      expect(operation(route)?.security).toEqual([{ apiKey: [] }]);
    }
  });

  it('documents the body schemas that validate', () => {
    expect(bodySchema({ method: 'POST', url: '/v2/sandboxes' })).toMatchObject({
      type: 'object',
      additionalProperties: false,
      required: ['templateID'],
    });
    for (const route of ROUTES) expect(bodySchema(route), label(route)).toEqual(route.schema.body);
  });

  it.each(PLATFORM_ROUTES.filter((r) => r.body))(
    '$method $url refuses what its documented schema refuses',
    async (r) => {
      const schema = bodySchema(r)!;
      const send = (body: object) => api.call(r.method, at(r.url, UNKNOWN), { body });
      expect(schema.additionalProperties).toBe(false);
      expectError(await send({ ...r.body, zzz: 1 }), 400, 'body has unknown field "zzz"');
      for (const field of schema.required ?? []) {
        const without = Object.fromEntries(Object.entries(r.body!).filter(([k]) => k !== field));
        expectError(await send(without), 400, `body.${field} is required`);
      }
      // Just past each documented bound (only the integer fields have bounds).
      const outside = Object.entries(schema.properties).flatMap(([field, { minimum, maximum }]) => [
        ...(minimum === undefined ? [] : [[field, minimum - 1, `>= ${minimum}`] as const]),
        ...(maximum === undefined ? [] : [[field, maximum + 1, `<= ${maximum}`] as const]),
      ]);
      for (const [field, value, rule] of outside) {
        const message = `body.${field} must be ${rule}`;
        expectError(await send({ ...r.body, [field]: value }), 400, message);
      }
    },
  );
});

describe('/metrics', () => {
  it('serves Prometheus text with API latency and the sandboxes by state', async () => {
    await api.get('/v2/sandboxes');
    const running = ((await api.get('/sandboxes')).body as unknown[]).length;
    const paused = ((await api.get('/v2/sandboxes?state=paused')).body as unknown[]).length;
    const reply = await api.get('/metrics', { key: null });
    expect(reply.status).toBe(200);
    expect(reply.headers.get('content-type')).toMatch(/^text\/plain/);
    expect(reply.text).toMatch(/^# TYPE moat_api_request_duration_seconds histogram$/m);
    expect(reply.text).toMatch(
      /^moat_api_request_duration_seconds_count\{[^}]*route="\/v2\/sandboxes"[^}]*\} [1-9]/m,
    );
    expect(reply.text).toContain(`moat_sandboxes{state="running"} ${running}\n`);
    expect(reply.text).toContain(`moat_sandboxes{state="paused"} ${paused}\n`);
  });
});
