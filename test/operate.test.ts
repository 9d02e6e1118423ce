/**
 * Operating Moat, with real `moat serve` children: --print-config (precedence of file < env <
 * flags, secrets masked), the separate --metrics-listen listener, the start-up facts in the log,
 * clean stops on SIGTERM and SIGINT, and a secrets scan of the whole output of a debug-level run
 * driven through a full scenario (generated key, secure sandbox, the egress credential, denied
 * and allowed egress, ingress with the traffic token, PUT network, pause, connect, kill).
 * Every socket is on loopback; the upstream resolver is a FakeDns.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SETTINGS } from '../src/config-settings.js';
import { SandboxClient, type StreamCall } from './support/connect-client.js';
import { udpQuery } from './support/dns-client.js';
import { FakeDns } from './support/fake-dns.js';
import { runMoat } from './support/moat.js';
import { httpEchoOrigin, type Origin } from './support/origins.js';
import { nativeTcpUnavailable } from '../src/proxy/native-tcp.js';
import { loopbackServeArgs, ServeChild, type Started } from './support/serve-child.js';

const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-operate-'));
let folders = 0;
const folder = () => path.join(scratch, `d${++folders}`);

/** allowed.moat.test reaches the echo origin; denied.moat.test is a documentation address. */
const zone = new FakeDns(
  new Map([
    ['allowed.moat.test', { A: ['127.0.0.1'] }],
    ['denied.moat.test', { A: ['192.0.2.10'] }],
  ]),
);
let origin: Origin;

beforeAll(async () => {
  await zone.start();
  origin = await httpEchoOrigin('127.0.0.1');
});

afterAll(async () => {
  await ServeChild.killAll();
  await origin?.close();
  await zone.stop();
  rmSync(scratch, { recursive: true, force: true });
});

// -- the serve child ---------------------------------------------------------------------------

async function startServe(extra: string[] = []): Promise<{ child: ServeChild; at: Started }> {
  const child = new ServeChild(loopbackServeArgs(folder(), zone.port, extra));
  return { child, at: await child.started() };
}

// -- HTTP helpers ------------------------------------------------------------------------------

interface Reply {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly text: string;
}

/** One request over node:http (any method, Host or proxy header; nothing added). */
function request(
  at: string,
  options: { method?: string; path?: string; headers?: Record<string, string>; body?: string },
): Promise<Reply> {
  const [host, port] = splitHostPort(at);
  return new Promise((resolve, reject) => {
    const outgoing = http.request(
      { host, port, method: options.method ?? 'GET', path: options.path ?? '/', timeout: 10_000 },
      (response) => {
        let text = '';
        response.setEncoding('utf8').on('data', (chunk: string) => (text += chunk));
        response.on('end', () =>
          resolve({ status: response.statusCode ?? 0, headers: response.headers, text }),
        );
        response.on('error', reject);
      },
    );
    for (const [name, value] of Object.entries(options.headers ?? {}))
      outgoing.setHeader(name, value);
    outgoing.on('timeout', () => outgoing.destroy(new Error(`${options.path} timed out`)));
    outgoing.on('error', reject);
    outgoing.end(options.body);
  });
}

/**
 * CONNECT through the egress proxy. Resolves with the status and, when `send` is given and the
 * tunnel opened, what came back for it before the origin closed; the tunnel is closed after.
 */
function connectThrough(
  proxy: string,
  target: string,
  authorization: string,
  send?: string,
): Promise<{ status: number; received: string }> {
  const [host, port] = splitHostPort(proxy);
  return new Promise((resolve, reject) => {
    const outgoing = http.request({
      host,
      port,
      method: 'CONNECT',
      path: target,
      headers: { 'Proxy-Authorization': authorization },
      timeout: 10_000,
    });
    outgoing.on('connect', (response, socket) => {
      const status = response.statusCode ?? 0;
      if (send === undefined || status !== 200) {
        socket.destroy();
        return resolve({ status, received: '' });
      }
      let received = '';
      socket.setEncoding('utf8').on('data', (chunk: string) => (received += chunk));
      socket.on('error', reject);
      socket.on('close', () => resolve({ status, received }));
      socket.setTimeout(10_000, () => socket.destroy());
      socket.write(send);
    });
    outgoing.on('timeout', () => outgoing.destroy(new Error(`CONNECT ${target} timed out`)));
    outgoing.on('error', reject);
    outgoing.end();
  });
}

function splitHostPort(at: string): [string, number] {
  const colon = at.lastIndexOf(':');
  return [at.slice(0, colon), Number(at.slice(colon + 1))];
}

const basic = (user: string, password: string) =>
  `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;

/** The platform API with one key. */
const platform =
  (at: string, key: string) =>
  async (method: string, url: string, body?: object): Promise<Reply & { body: unknown }> => {
    const reply = await request(at, {
      method,
      path: url,
      headers: {
        'X-API-Key': key,
        ...(body ? { 'Content-Type': 'application/json' } : {}),
      },
      body: body ? JSON.stringify(body) : undefined,
    });
    return { ...reply, body: reply.text === '' ? undefined : (JSON.parse(reply.text) as unknown) };
  };

// -- --print-config ----------------------------------------------------------------------------

describe('moat serve --print-config', () => {
  const keys = {
    file: 'file-key-0123456789abcdef',
    env1: 'env-key-one-0123456789abcdef',
    env2: 'env-key-two-0123456789abcdef',
    flag: 'flag-key-0123456789abcdef',
  };

  /** A config file setting four keys; env overrides two of them, a flag one more. */
  function configFile(): string {
    const file = path.join(scratch, `config-${++folders}.json`);
    writeFileSync(
      file,
      JSON.stringify({
        dnsMinTtl: 11,
        dnsMaxTtl: 2222,
        dnsCacheSize: 333,
        teamNamespace: 'from-file',
        apiKeys: [keys.file],
        metricsListen: '127.0.0.1:9464',
      }),
    );
    return file;
  }

  const env = {
    MOAT_DNS_MAX_TTL: '4444',
    MOAT_DNS_CACHE_SIZE: '555',
    MOAT_API_KEYS: `${keys.env1},${keys.env2}`,
    MOAT_LOG_LEVEL: 'warn',
  };

  async function printConfig(args: string[], environment: Record<string, string> = {}) {
    const result = await runMoat(['serve', '--print-config', ...args], { env: environment });
    expect({ code: result.code, stderr: result.stderr }).toEqual({ code: 0, stderr: '' });
    return { shown: JSON.parse(result.stdout) as Record<string, unknown>, stdout: result.stdout };
  }

  it('merges defaults < file < env < flags and prints every setting, then exits', async () => {
    const dataDir = folder();
    const { shown } = await printConfig(
      ['--config', configFile(), '--dns-cache-size', '666', '--data-dir', dataDir],
      env,
    );
    expect(Object.keys(shown)).toEqual(SETTINGS.map((s) => s.key));
    expect(shown).toMatchObject({
      dnsMinTtl: 11, // file only
      dnsMaxTtl: 4444, // env over file
      dnsCacheSize: 666, // flag over env over file
      teamNamespace: 'from-file',
      logLevel: 'warn', // env over default
      metricsListen: '127.0.0.1:9464',
      dataDir,
      // Defaults, written as a config file would write them.
      dnsTimeoutMs: 2000,
      transparentListen: '127.0.0.1:3129',
      apiListen: '127.0.0.1:3000',
      sourcePool: '127.77.0.0/16',
      proxyCheckServerName: true,
    });
    // Nothing started: not even the data folder exists.
    expect(existsSync(dataDir)).toBe(false);
  });

  it.each([
    ['the file', [], {}, 1],
    ['the environment', [], { MOAT_API_KEYS: `${keys.env1},${keys.env2}` }, 2],
    ['a flag', ['--api-keys', keys.flag], { MOAT_API_KEYS: keys.env1 }, 1],
  ] as const)(
    'masks API keys from %s: one mask per key, no key text anywhere',
    async (_from, flags, environment, count) => {
      const { shown, stdout } = await printConfig(
        ['--config', configFile(), ...flags],
        environment,
      );
      expect(shown.apiKeys).toEqual(Array.from({ length: count }, () => '***'));
      for (const key of Object.values(keys)) expect(stdout).not.toContain(key);
    },
  );

  it.each([
    [['--unconfined-sandboxes'], true],
    [['--unconfined-sandboxes', '--metrics-per-sandbox'], true],
    [['--unconfined-sandboxes', 'true'], true],
    [['--unconfined-sandboxes', 'false'], false],
    [['--unconfined-sandboxes=false'], false],
    [[], false],
  ])('reads a switch given as %j', async (flags, value) => {
    const { shown } = await printConfig([...flags]);
    expect(shown.unconfinedSandboxes).toBe(value);
  });

  it('masks the password of a Redis store URL, and only the password', async () => {
    const { shown, stdout } = await printConfig([
      '--store',
      'redis://moat:redis-password-1234@127.0.0.1:6379/2',
    ]);
    expect(shown.store).toBe('redis://moat:***@127.0.0.1:6379/2');
    expect(stdout).not.toContain('redis-password-1234');
  });

  it('reads back as the same configuration when fed in as a --config file', async () => {
    const first = await printConfig(['--config', configFile()], env);
    const file = path.join(scratch, 'printed.json');
    // The masked keys cannot be read back; everything else must mean the same again.
    const { apiKeys: _masked, ...rest } = first.shown;
    writeFileSync(file, JSON.stringify(rest));
    const again = await printConfig(['--config', file]);
    expect({ ...again.shown, apiKeys: _masked }).toEqual(first.shown);
  });

  it('rejects an invalid value naming the key and its source, exit 2', async () => {
    const result = await runMoat(['serve', '--print-config'], {
      env: { MOAT_METRICS_LISTEN: 'everywhere' },
    });
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('MOAT_METRICS_LISTEN');
  });

  it('is documented in serve --help with --metrics-listen', async () => {
    const help = await runMoat(['serve', '--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/--print-config\n\s+print the effective configuration/);
    expect(help.stdout).toMatch(/--metrics-listen IP:PORT\|off\n[^-]*MOAT_METRICS_LISTEN/);
  });
});

// -- --metrics-listen --------------------------------------------------------------------------

describe('--metrics-listen', () => {
  it('serves Prometheus text from the same registry as the API listener, no key', async () => {
    const { child, at } = await startServe(['--metrics-listen', '127.0.0.1:0']);
    expect(at.metrics).toMatch(/^127\.0\.0\.1:\d+$/);
    expect(at.metrics).not.toBe(at.api);
    const key = at.generatedKey!;
    // A request on the API listener must show up on the separate listener: one registry.
    expect((await platform(at.api, key)('GET', '/sandboxes')).status).toBe(200);
    const separate = await request(at.metrics, { path: '/metrics' });
    expect(separate.status).toBe(200);
    expect(separate.headers['content-type']).toMatch(/^text\/plain; version=0\.0\.4/);
    expect(separate.text).toContain('# TYPE moat_dns_queries_total counter');
    expect(separate.text).toContain('# TYPE moat_process_cpu_seconds_total counter');
    expect(separate.text).toMatch(
      /^moat_api_request_duration_seconds_count\{method="GET",route="\/sandboxes",code="200"\} 1$/m,
    );
    // `_total` is for counters only (promtool refuses prom-client's `*_total` gauges).
    const misnamed = [...separate.text.matchAll(/^# TYPE (\S+_total) (\S+)$/gm)].filter(
      ([, , type]) => type !== 'counter',
    );
    expect(misnamed.map(([line]) => line)).toEqual([]);
    const onApi = await request(at.api, { path: '/metrics' });
    const families = (text: string) => text.match(/^# TYPE \S+/gm)?.sort();
    expect(families(onApi.text)).toEqual(families(separate.text));

    // Only GET /metrics.
    expect((await request(at.metrics, { path: '/sandboxes' })).status).toBe(404);
    const post = await request(at.metrics, { method: 'POST', path: '/metrics' });
    expect({ status: post.status, allow: post.headers.allow }).toEqual({
      status: 405,
      allow: 'GET, HEAD',
    });
    // The start-up log line names it too; stop closes it.
    expect(child.logLines().find((l) => l.msg === 'moat started')).toMatchObject({
      metrics: at.metrics,
    });
    expect(await child.stop('SIGTERM')).toEqual({ code: 0, signal: null });
    await expect(request(at.metrics, { path: '/metrics' })).rejects.toThrow(/ECONNREFUSED/);
  });

  it('is off by default', async () => {
    const { child, at } = await startServe();
    expect(at.metrics).toBe('off');
    expect(child.logLines().find((l) => l.msg === 'moat started')).toMatchObject({
      metrics: 'off',
    });
    expect(await child.stop('SIGTERM')).toEqual({ code: 0, signal: null });
  });
});

// -- sandboxes ---------------------------------------------------------------------------------

/** Runs `script` in the sandbox through process.Process/Start; returns its stdout. */
async function runInSandbox(sandbox: SandboxClient, script: string): Promise<string> {
  const call = startInSandbox(sandbox, script);
  await call.ready;
  expect(call.status).toBe(200);
  let stdout = '';
  for (const frame of await call.rest(10_000)) {
    const data = (frame.message as { event?: { data?: { stdout?: string } } }).event?.data;
    if (data?.stdout) stdout += Buffer.from(data.stdout, 'base64').toString();
  }
  return stdout;
}

const startInSandbox = (sandbox: SandboxClient, script: string): StreamCall =>
  sandbox.stream('process.Process/Start', { process: { cmd: '/bin/sh', args: ['-c', script] } });

interface CreatedSandbox {
  readonly sandboxID: string;
  readonly envdAccessToken: string | null;
  readonly trafficAccessToken: string | null;
}

/**
 * A sandbox created through the platform API (POST /v2/sandboxes: secure), its sandbox API
 * client, and its egress credential as every process of the sandbox sees it in $HTTPS_PROXY.
 */
async function sandboxWithEgress(at: Started, body: object = {}) {
  const api = platform(at.api, at.generatedKey!);
  const created = await api('POST', '/v2/sandboxes', { templateID: 'base', timeout: 120, ...body });
  expect(created.status, created.text).toBe(201);
  const record = created.body as CreatedSandbox;
  const client = new SandboxClient(
    `http://${at.sandbox}`,
    record.sandboxID,
    record.envdAccessToken,
  );
  const proxyUrl = new URL(await runInSandbox(client, 'printf %s "$HTTPS_PROXY"'));
  expect(proxyUrl.username).toBe(record.sandboxID);
  expect(`${proxyUrl.hostname}:${proxyUrl.port}`).toBe(at.proxy);
  const egressSecret = decodeURIComponent(proxyUrl.password);
  expect(egressSecret.length).toBeGreaterThanOrEqual(16);
  return {
    api,
    record,
    client,
    egressSecret,
    credential: basic(record.sandboxID, egressSecret),
  };
}

/** Command lines of every process on the host (sandbox processes are among them). */
const hostProcesses = () => execFileSync('ps', ['-eo', 'args']).toString().split('\n');

/** Only allowed.moat.test; everything else over IPv4 denied. */
const ALLOW_ONE = { allowOut: ['allowed.moat.test'], denyOut: ['0.0.0.0/0'] };

// -- start-up and stop -------------------------------------------------------------------------

describe('moat serve start-up and stop', () => {
  it.each(['SIGTERM', 'SIGINT'] as const)(
    '%s with a sandbox process running: exit 0, "moat stopped" logged, no warning, nothing left behind',
    async (signal) => {
      const { child, at } = await startServe();
      const started = child.logLines().find((l) => l.msg === 'moat started');
      // The log line carries what the human lines say, and never the key.
      expect(started).toMatchObject({
        api: at.api,
        sandbox: at.sandbox,
        dns: at.dns,
        proxy: at.proxy,
        transparent: 'off',
        metrics: 'off',
        dataDir: at.dataDir,
        store: path.join(at.dataDir, 'store'),
        node: null,
        enforcement: expect.any(String),
        enforcementReason: expect.any(String),
        confinement: expect.any(String),
        apiKeys: path.join(at.dataDir, 'api-key'),
        apiKeyGenerated: true,
      });
      expect(JSON.stringify(started)).not.toContain(at.generatedKey);

      const { client } = await sandboxWithEgress(at);
      const marker = `moatstop${signal}${process.pid}`;
      // A loop, so the shell (whose command line has the marker) stays.
      const sleeper = startInSandbox(client, `: ${marker}; while true; do sleep 1; done`);
      await sleeper.next(); // the start event
      const withMarker = () => hostProcesses().filter((line) => line.includes(marker));
      await expect.poll(() => withMarker().length, { timeout: 15_000 }).toBeGreaterThan(0);

      // SIGINT as Ctrl-C sends it: to the whole process group, Moat's children in it too.
      const logged = child.logLines().length;
      const stopped = signal === 'SIGINT' ? child.interrupt() : child.stop(signal);
      expect(await stopped).toEqual({ code: 0, signal: null });
      sleeper.close();
      const lines = child.logLines();
      expect(lines.find((l) => l.msg === 'moat stopping')).toMatchObject({ signal });
      // A clean stop: no helper of Moat's took the signal for itself and ended loudly.
      const warned = lines.slice(logged).filter((l) => (l.level as number) >= 40);
      expect(warned, child.output()).toEqual([]);
      expect(child.output()).not.toMatch(/Traceback|KeyboardInterrupt/);
      expect(
        lines.find((l) => l.msg === 'moat stopped'),
        child.output(),
      ).toMatchObject({
        signal,
        level: 30,
      });
      // Standard error has the human start-up lines and nothing else.
      expect(child.stderr.split('\n').filter((l) => l !== '' && !l.startsWith('moat: '))).toEqual(
        [],
      );
      await expect(request(at.api, { path: '/health' })).rejects.toThrow(/ECONNREFUSED/);
      expect(withMarker()).toEqual([]);
    },
  );

  it('says at start-up how the proxy carries connections: the native relay, or why not', async () => {
    const { child } = await startServe(['--proxy-io', 'node']);
    expect(child.stderr).toMatch(/^moat: egress proxy .*; Node sockets: configured\)$/m);
    expect(child.logLines().find((line) => line.msg === 'proxy listener')).toMatchObject({
      io: 'node',
      why: 'configured',
    });
    await child.stop('SIGTERM');
  });

  it('stops within 3 s, "moat stopped" last, with a CONNECT tunnel that never sent a byte', async () => {
    const { child, at } = await startServe([
      ...['--internal-deny', '10.0.0.0/8', '--allow-host-ports', String(origin.port)],
    ]);
    expect(child.stderr).toMatch(
      nativeTcpUnavailable() === undefined
        ? /^moat: egress proxy .*; native relay\)$/m
        : /^moat: egress proxy .*; Node sockets: /m,
    );
    const { credential } = await sandboxWithEgress(at, { network: ALLOW_ONE });
    // The tunnel opens (200) and the client leaves without sending its first bytes.
    const opened = await connectThrough(at.proxy, `allowed.moat.test:${origin.port}`, credential);
    expect(opened.status).toBe(200);
    const signalled = Date.now();
    expect(await child.stop('SIGTERM')).toEqual({ code: 0, signal: null });
    expect(Date.now() - signalled, child.output()).toBeLessThan(3000);
    expect(child.logLines().at(-1)?.msg, child.output()).toBe('moat stopped');
  });
});

// -- secrets scan ------------------------------------------------------------------------------

describe('secrets never reach the log', () => {
  it('a debug-level run through a full scenario logs denies with their facts and no secret', async () => {
    // Loopback is not internal here and the echo origin's port of this host is opened, so the
    // allowed destination is reachable; 10.0.0.0/8 stays internal for the internal-list deny.
    const { child, at } = await startServe([
      ...['--log-level', 'debug', '--internal-deny', '10.0.0.0/8'],
      ...['--allow-host-ports', String(origin.port)],
    ]);
    const apiKey = at.generatedKey;
    expect(apiKey, child.output()).toMatch(/^moat_/);
    const { api, record, credential, egressSecret } = await sandboxWithEgress(at, {
      network: { allowPublicTraffic: false },
    });
    const { sandboxID, envdAccessToken, trafficAccessToken } = record;
    expect(envdAccessToken).toEqual(expect.any(String));
    expect(trafficAccessToken).toEqual(expect.any(String));

    // Ingress with the traffic token (and once without: 403).
    const ingress = (token: string | null) =>
      request(at.sandbox, {
        path: '/ingress-check',
        headers: {
          'E2b-Sandbox-Id': sandboxID,
          'E2b-Sandbox-Port': String(origin.port),
          ...(token ? { 'e2b-traffic-access-token': token } : {}),
        },
      });
    // The origin is the host's, not a process of the sandbox: with the token, ingress says so;
    // without it, it says nothing about the sandbox's ports.
    const admitted = await ingress(trafficAccessToken);
    expect(admitted.status).toBe(502);
    expect(admitted.text).toContain(`no process of sandbox ${sandboxID} listens on port`);
    expect((await ingress(null)).status).toBe(403);

    // Policy: only allowed.moat.test; then denied (name, internal address, forward), allowed.
    const put = await api('PUT', `/sandboxes/${sandboxID}/network`, ALLOW_ONE);
    expect(put.status, put.text).toBe(204);
    const connectStatus = async (target: string, authorization = credential) =>
      (await connectThrough(at.proxy, target, authorization)).status;
    expect(await connectStatus('denied.moat.test:443')).toBe(403);
    expect(await connectStatus('10.1.2.3:443')).toBe(403);
    const forward = await request(at.proxy, {
      path: 'http://denied.moat.test/',
      headers: { Host: 'denied.moat.test', 'Proxy-Authorization': credential },
    });
    expect(forward.status).toBe(403);
    const allowed = await connectThrough(
      at.proxy,
      `allowed.moat.test:${origin.port}`,
      credential,
      'GET /through-the-tunnel HTTP/1.1\r\nHost: allowed.moat.test\r\nConnection: close\r\n\r\n',
    );
    expect(allowed.status).toBe(200);
    expect(allowed.received).toMatch(/^HTTP\/1\.1 200 [^]*"path":"\/through-the-tunnel"/);
    // A DNS query from the sandbox's source address for a name its policy denies.
    const detail = await api('GET', `/sandboxes/${sandboxID}`);
    const source = (detail.body as { egress: { address: string } }).egress.address;
    const dnsPort = splitHostPort(at.dns)[1];
    expect((await udpQuery(dnsPort, source, 'denied.moat.test')).rcode).toBe('NXDOMAIN');
    // A wrong credential is refused (407); it must not be logged either.
    const wrongSecret = `${egressSecret.slice(0, -4)}zzzz`;
    expect(await connectStatus('denied.moat.test:443', basic(sandboxID, wrongSecret))).toBe(407);

    // Lifecycle.
    expect((await api('POST', `/sandboxes/${sandboxID}/pause`)).status).toBe(204);
    const connected = await api('POST', `/sandboxes/${sandboxID}/connect`, { timeout: 120 });
    expect(connected.status, connected.text).toBe(201);
    expect((await api('DELETE', `/sandboxes/${sandboxID}`)).status).toBe(204);
    expect(await child.stop('SIGTERM')).toEqual({ code: 0, signal: null });

    // The generated key is never printed: start-up names the file that holds it.
    expect(child.stderr).toContain(
      `moat: API key          generated into ${path.join(at.dataDir, 'api-key')} (`,
    );
    const everything = `${child.stdout}\n${child.stderr}`;
    const secrets: Record<string, string> = {
      'API key': apiKey!,
      envdAccessToken: envdAccessToken!,
      trafficAccessToken: trafficAccessToken!,
      'egress secret': egressSecret,
      'egress credential (Basic)': credential.slice('Basic '.length),
      'egress secret (base64)': Buffer.from(egressSecret).toString('base64'),
      'wrong egress secret': wrongSecret,
      'wrong egress credential (Basic)': basic(sandboxID, wrongSecret).slice('Basic '.length),
    };
    const leaked = Object.entries(secrets).filter(([, secret]) => everything.includes(secret));
    expect(leaked.map(([name]) => name)).toEqual([]);

    // Each decision is one structured flow line with the facts an operator needs.
    const lines = child.logLines();
    const fact = { rule: expect.any(String), list: expect.any(String), reason: expect.any(String) };
    const flow = (verdict: string, kind: string, destination: object, details: object = {}) =>
      expect.objectContaining({
        msg: 'flow',
        event: 'decision',
        sandboxID,
        verdict,
        kind,
        destination: expect.objectContaining(destination),
        ...(verdict === 'deny' ? fact : {}),
        ...details,
      });
    expect(lines).toEqual(
      expect.arrayContaining([
        flow('deny', 'connect', { name: 'denied.moat.test', port: 443 }),
        flow('deny', 'connect', { address: '10.1.2.3', port: 443 }, { list: 'internal' }),
        flow('deny', 'http', { name: 'denied.moat.test', port: 80 }),
        flow('deny', 'dns', { name: 'denied.moat.test' }),
        // At debug level, the allow too.
        flow('allow', 'connect', { name: 'allowed.moat.test', port: origin.port }),
      ]),
    );
  });
});
