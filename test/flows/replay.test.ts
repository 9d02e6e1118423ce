/**
 * `moat check --replay`: recorded decisions decided again under a candidate policy. The pure
 * part is pinned with tables and properties; the command is run as a child against a flow log
 * a real Moat wrote and against its API.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { scratchMoatFlags } from '../../bench/lib/scratch.js';
import { type RunningMoat, startMoat } from '../../src/app/index.js';
import { type RecordedDecision, readRecord, replay } from '../../src/cli/replay.js';
import { loadConfig } from '../../src/config.js';
import {
  compileInternalDenyList,
  compilePolicy,
  decide,
  parseIP,
  parseNetworkConfig,
  type Policy,
} from '../../src/policy/index.js';
import { API_KEY } from '../support/api-client.js';
import { udpQuery } from '../support/dns-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { runMoat } from '../support/moat.js';
import { connectThrough, httpEchoOrigin, type Origin } from '../support/origins.js';
import { LOOPBACK_IS_OUTSIDE } from '../../bench/lib/loopback-outside.js';

/** Test addresses are special-use ones: nothing is internal here. */
const NO_INTERNAL = compileInternalDenyList([]);

const policy = (network: object): Policy => {
  const parsed = parseNetworkConfig(network);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.errors));
  return compilePolicy(parsed.value, NO_INTERNAL);
};

const record = (
  name: string | null,
  address: string | null,
  port: number | null,
  verdict: 'allow' | 'deny',
  list = verdict === 'allow' ? 'allowOut' : 'default',
  rule: string | null = null,
  sandboxID = 'isandbox1',
): RecordedDecision => ({
  sandboxID,
  destination: { name, address, port },
  verdict,
  list,
  rule,
  time: null,
});

describe('replay', () => {
  const tight = policy({ allowOut: ['api.example.com'], denyOut: ['0.0.0.0/0'] });

  it.each([
    [
      'a name the candidate no longer allows',
      record('example.com', null, null, 'allow'),
      'newly-denied',
    ],
    [
      'a name it now allows',
      record('api.example.com', '203.0.113.5', 443, 'deny'),
      'newly-allowed',
    ],
    ['a name denied before and now', record('other.test', null, 443, 'deny'), undefined],
    [
      'an address denied by deny-all, still denied',
      record(null, '198.51.100.1', 22, 'deny'),
      undefined,
    ],
    [
      'an address that was allowed by default',
      record(null, '198.51.100.1', 22, 'allow'),
      'newly-denied',
    ],
  ])('%s', (_, recorded, change) => {
    const result = replay([recorded], tight);
    expect(result.changes.map((c) => c.change)).toEqual(change === undefined ? [] : [change]);
    expect(result.unchanged).toBe(change === undefined ? 1 : 0);
  });

  it('replays each record on its port under a policy with port-scoped rules', () => {
    const ported = policy({
      allowOut: ['api.example.com:443', '198.51.100.1:22'],
      denyOut: ['0.0.0.0/0'],
    });
    const result = replay(
      [
        record('api.example.com', '203.0.113.5', 443, 'allow'),
        record('api.example.com', '203.0.113.5', 80, 'allow'),
        record(null, '198.51.100.1', 22, 'deny'),
        record(null, '198.51.100.1', 5432, 'allow'),
      ],
      ported,
    );
    expect(
      result.changes.map((c) => [
        c.change,
        c.destination.name ?? c.destination.address,
        c.destination.port,
      ]),
    ).toEqual([
      ['newly-denied', 'api.example.com', 80],
      ['newly-denied', '198.51.100.1', 5432],
      ['newly-allowed', '198.51.100.1', 22],
    ]);
    expect(result.unchanged).toBe(1);
  });

  it('decides a refused request again by the rules of its destination', () => {
    const refused: RecordedDecision = {
      ...record('api.example.com', null, 443, 'deny', 'rules', 'api.example.com #2'),
      request: { method: 'POST', path: '/repos/acme/x' },
    };
    const rules = (methods: string[]) =>
      policy({
        allowOut: ['api.example.com'],
        denyOut: ['0.0.0.0/0'],
        rules: {
          'api.example.com': [{ match: { methods }, action: 'allow' }, { action: 'deny' }],
        },
      });
    expect(replay([refused], rules(['GET'])).unchanged).toBe(1);
    const looser = replay([refused], rules(['GET', 'POST']));
    expect(looser.changes).toMatchObject([
      {
        change: 'newly-allowed',
        request: { method: 'POST', path: '/repos/acme/x' },
        now: { list: 'rules', rule: 'api.example.com #1' },
      },
    ]);
    // Without rules the request rides on its connection, which allowOut allows.
    expect(replay([refused], tight).changes).toMatchObject([
      { change: 'newly-allowed', now: { list: 'allowOut' } },
    ]);
    expect(
      readRecord({ ...refused, event: 'decision', time: '2026-12-07T00:00:00Z' }),
    ).toMatchObject({
      request: { method: 'POST', path: '/repos/acme/x' },
    });
  });

  it('does not replay what no policy decides: host protection, invalid requests, nothing named', () => {
    const result = replay(
      [
        record(null, '127.0.0.1', 3000, 'deny', 'host'),
        record('x.test', null, 80, 'deny', 'invalid'),
        record(null, null, null, 'deny', 'invalid'),
        record('not a name!', null, 80, 'allow'),
      ],
      tight,
    );
    expect(result).toEqual({ changes: [], unchanged: 0, notReplayable: 4 });
  });

  it('decides a bare address by the names the records show it was given for (learned)', () => {
    const records = [
      record('api.example.com', '203.0.113.5', 443, 'allow', 'allowOut', 'api.example.com'),
      record(null, '203.0.113.5', 8443, 'allow', 'learned', 'api.example.com'),
      record(null, '203.0.113.6', 8443, 'allow', 'learned', 'gone.example.com'),
    ];
    const result = replay(records, tight);
    // The first two stay allowed (the name is still allowed); the third's name is not.
    expect(result.unchanged).toBe(2);
    expect(result.changes).toEqual([
      expect.objectContaining({
        change: 'newly-denied',
        destination: { name: null, address: '203.0.113.6', port: 8443 },
      }),
    ]);
  });

  it('groups a destination’s flows, counts its sandboxes, newly denied first', () => {
    const result = replay(
      [
        record('b.test', null, null, 'deny'),
        record('a.test', null, null, 'allow', 'default', null, 'isandbox1'),
        record('a.test', null, null, 'allow', 'default', null, 'isandbox2'),
        record('a.test', null, null, 'allow', 'default', null, 'isandbox2'),
      ],
      policy({ allowOut: ['b.test'], denyOut: ['0.0.0.0/0'] }),
    );
    expect(result.changes.map((c) => [c.change, c.destination.name, c.flows, c.sandboxes])).toEqual(
      [
        ['newly-denied', 'a.test', 3, ['isandbox1', 'isandbox2']],
        ['newly-allowed', 'b.test', 1, ['isandbox1']],
      ],
    );
  });

  const label = fc.stringMatching(/^[a-z][a-z0-9]{0,6}$/);
  const name = fc.tuple(label, fc.constantFrom('test', 'example.com')).map(([l, d]) => `${l}.${d}`);
  const address = fc
    .tuple(fc.constantFrom(198, 203), fc.nat(255), fc.nat(255))
    .map(([a, b, c]) => `${a}.18.${b}.${c}`);
  const network = fc.record({
    allowOut: fc.array(fc.oneof(name, address), { maxLength: 4 }),
    denyOut: fc.constantFrom([], ['0.0.0.0/0'], ['198.0.0.0/8']),
  });
  /** Decisions as Moat makes them (names by name, unnamed addresses by address). */
  const recordedUnder = (p: Policy, asked: Array<{ n?: string; a?: string; port: number }>) =>
    asked.map(({ n, a, port }) => {
      const ip = a === undefined ? undefined : parseIP(a);
      const d = decide(p, {
        host: n as never,
        ip: ip?.ok ? ip.value : undefined,
        port,
      });
      return record(
        n ?? null,
        n === undefined ? (a ?? null) : null,
        port,
        d.verdict,
        d.list,
        d.rule,
      );
    });
  const asked = fc.array(
    fc.oneof(
      fc.record({ n: name, port: fc.constantFrom(80, 443) }),
      fc.record({ a: address, port: fc.constantFrom(22, 443) }),
    ),
    { maxLength: 20 },
  );

  it('finds nothing to change under the policy that made the records (property)', () => {
    fc.assert(
      fc.property(network, asked, (net, flows) => {
        fc.pre(parseNetworkConfig(net).ok);
        const p = policy(net);
        expect(replay(recordedUnder(p, flows), p).changes).toEqual([]);
      }),
    );
  });

  it('never newly denies under a candidate that only allows more (property)', () => {
    fc.assert(
      fc.property(
        network,
        asked,
        fc.array(fc.oneof(name, address), { maxLength: 3 }),
        (net, flows, more) => {
          const looser = { ...net, allowOut: [...net.allowOut, ...more] };
          fc.pre(parseNetworkConfig(net).ok && parseNetworkConfig(looser).ok);
          const changes = replay(recordedUnder(policy(net), flows), policy(looser)).changes;
          expect(changes.filter((c) => c.change === 'newly-denied')).toEqual([]);
        },
      ),
    );
  });
});

describe('moat check --replay', () => {
  const SANDBOX = 'ireplaysandbox0000001';
  const SECRET = 'egress-secret-replay';
  const SOURCE = '127.78.0.3';
  /** Moat's and the replay's internal deny list: loopback origins are not internal here. */
  const INTERNAL = '10.0.0.0/8,169.254.0.0/16';
  const scratch = scratchMoatFlags();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'moat-replay-'));
  const flowLog = path.join(dir, 'flows.jsonl');
  const candidate = path.join(dir, 'tight.json');
  let upstream: FakeDns;
  let web: Origin;
  let moat: RunningMoat;

  beforeAll(async () => {
    web = await httpEchoOrigin('127.0.0.10');
    upstream = await new FakeDns(
      new Map([
        ['allowed.test', { A: ['127.0.0.10'] }],
        ['denied.test', { A: ['127.0.0.10'] }],
      ]),
    ).start();
    const config = loadConfig({
      flags: {
        ...scratch.flags,
        'api-keys': API_KEY,
        'dns-listen': '127.0.0.1:0',
        'dns-upstream': `127.0.0.1:${upstream.port}`,
        'proxy-listen': '127.0.0.1:0',
        'transparent-listen': 'off',
        'log-level': 'silent',
        'flow-log': flowLog,
        'internal-deny': INTERNAL,
      },
    });
    if (!config.ok) throw new Error(config.error);
    moat = await startMoat(config.value, pino({ level: 'silent' }), {
      defaultMetrics: false,
      hostAddresses: LOOPBACK_IS_OUTSIDE,
    });
    const parsed = parseNetworkConfig({ allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] });
    const source = parseIP(SOURCE);
    if (!parsed.ok || !source.ok) throw new Error('test policy');
    moat.table.register(
      SANDBOX,
      { sourceAddress: source.value, egressSecret: SECRET },
      compilePolicy(parsed.value, moat.internal),
    );
    // What the sandbox did: two lookups, a tunnel by name, one to the address DNS gave it.
    await udpQuery(moat.listening.dns.port, SOURCE, 'allowed.test');
    await udpQuery(moat.listening.dns.port, SOURCE, 'denied.test');
    for (const authority of [`allowed.test:${web.port}`, `127.0.0.10:${web.port}`]) {
      const { socket, status } = await connectThrough(moat.listening.proxy, authority, {
        auth: `${SANDBOX}:${SECRET}`,
      });
      expect(status).toBe(200);
      socket.destroy();
    }
    writeFileSync(
      candidate,
      JSON.stringify({ allowOut: ['api.allowed.test'], denyOut: ['0.0.0.0/0'] }),
    );
    // The file sink writes behind: wait (bounded) until the four decisions are in it.
    const deadline = Date.now() + 5000;
    const decisions = () =>
      readFileSync(flowLog, 'utf8')
        .split('\n')
        .filter((l) => l.includes('"event":"decision"'));
    while (decisions().length < 4 && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 20));
  });

  afterAll(async () => {
    await moat.stop();
    scratch.remove();
    rmSync(dir, { recursive: true, force: true });
    await Promise.all([web.close(), upstream.stop()]);
  });

  const ALL =
    'denyOut 0.0.0.0/0 (ALL_TRAFFIC) denies every IPv4 and IPv6 destination that no allowOut rule covers';
  const expected = () => [
    `NEWLY DENIED   127.0.0.10:${web.port}  (1 flow, 1 sandbox)  was [learned allowed.test]  now [denyOut 0.0.0.0/0]  ${ALL}`,
    `NEWLY DENIED   allowed.test  (1 flow, 1 sandbox)  was [allowOut allowed.test]  now [denyOut 0.0.0.0/0]  no allowOut name rule covers the name; 0.0.0.0/0 denies it`,
    `NEWLY DENIED   allowed.test 127.0.0.10:${web.port}  (1 flow, 1 sandbox)  was [allowOut allowed.test]  now [denyOut 0.0.0.0/0]  ${ALL}`,
  ];

  it('prints what the recorded traffic would newly meet, from the flow log file; exit 1', async () => {
    const result = await runMoat([
      'check',
      '--policy',
      candidate,
      '--internal-deny',
      INTERNAL,
      '--replay',
      flowLog,
    ]);
    expect(result.stdout.trim().split('\n').sort()).toEqual(expected().sort());
    expect(result.stderr).toBe(
      'replayed 4 recorded decisions: 3 newly denied, 0 newly allowed, 1 unchanged, 0 decided by host protection or invalid requests (not replayed)\n',
    );
    expect(result.code).toBe(1);
  });

  it('reads the same records from the API, one JSON object per change', async () => {
    const keyFile = path.join(dir, 'key');
    writeFileSync(keyFile, `${API_KEY}\n`);
    const api = `http://127.0.0.1:${moat.listening.api.port}`;
    const args = ['check', '--policy', candidate, '--internal-deny', INTERNAL];
    args.push('--replay-api', api, '--key-file', keyFile);
    const result = await runMoat([...args, '--sandbox', SANDBOX, '--json']);
    const changes = result.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(changes).toHaveLength(3);
    expect(changes.every((c) => c.change === 'newly-denied')).toBe(true);
    expect(result.code).toBe(1);
    // Another sandbox's records only: nothing.
    const none = await runMoat([...args, '--sandbox', 'inosuchsandbox0000000']);
    expect(none.stdout).toBe('');
    expect(none.code).toBe(0);
    const refused = await runMoat([...args.slice(0, -2), '--key', 'wrong-key-0123456789']);
    expect(refused.stderr).toMatch(/moat check: http:\/\/127\.0\.0\.1:\d+ answered 401/);
    expect(refused.code).toBe(1);
  });

  it("--replay-api decides under the node's internal deny list, read from the node", async () => {
    const keyFile = path.join(dir, 'key');
    writeFileSync(keyFile, `${API_KEY}\n`);
    const api = `http://127.0.0.1:${moat.listening.api.port}`;
    // No --internal-deny: Moat's default list would call the loopback origin "now internal".
    const result = await runMoat([
      ...['check', '--policy', candidate, '--replay-api', api, '--key-file', keyFile],
    ]);
    expect(result.stdout.trim().split('\n').sort()).toEqual(expected().sort());
    expect(result.stdout).not.toContain('[internal');
    expect(result.code).toBe(1);
    // --internal-deny given: a what-if of the list itself, which wins over the node's.
    const tighter = await runMoat([
      ...['check', '--policy', candidate, '--replay-api', api, '--key-file', keyFile],
      ...['--internal-deny', '127.0.0.0/8'],
    ]);
    expect(tighter.stdout).toContain('now [internal 127.0.0.0/8]');
  });

  it("says when a --replay FILE is decided under the default internal deny list, and how to give the node's", async () => {
    const result = await runMoat(['check', '--policy', candidate, '--replay', flowLog]);
    expect(result.stderr).toContain(
      "moat check: the internal deny list is Moat's default; if the node that wrote the records runs another, give it here (--internal-deny, as the node's --print-config shows it), or read the records with --replay-api URL, which reads the node's\n",
    );
    // The default list holds loopback, where the test's origin is: decided as internal now.
    expect(result.stdout).toContain('now [internal 127.0.0.0/8]');
    const given = await runMoat([
      ...['check', '--policy', candidate, '--replay', flowLog, '--internal-deny', INTERNAL],
    ]);
    expect(given.stderr).not.toContain('internal deny list');
  });

  it('moat suggest learns the policy the records need from the file, and --check proves it', async () => {
    const result = await runMoat([
      ...['suggest', '--from-flows', flowLog, '--internal-deny', INTERNAL, '--check'],
    ]);
    expect(result.code, result.stderr).toBe(0);
    // Both names asked for, the denied one too; the address dialled was given for a name.
    expect(result.stdout).toBe(
      [
        '{',
        '  "allowOut": [',
        `    "allowed.test:${web.port}", // 3 flows`,
        '    "denied.test" // 1 flow',
        '  ],',
        '  "denyOut": ["0.0.0.0/0"] // everything not seen',
        '}',
        '',
      ].join('\n'),
    );
    expect(result.stderr).toBe(
      `moat suggest: 2 entries from 4 flow records of sandbox ${SANDBOX}\nmoat suggest: --check: replayed 4 records: every one allowed\n`,
    );
    // moat check reads the commented file and replays the same records: nothing newly denied.
    const learned = path.join(dir, 'learned.json');
    writeFileSync(learned, result.stdout);
    const replayed = await runMoat([
      ...['check', '--policy', learned, '--internal-deny', INTERNAL, '--replay', flowLog],
    ]);
    expect(replayed.stderr).toMatch(/: 0 newly denied, 1 newly allowed, 3 unchanged/);
    expect(replayed.code).toBe(0);
  });

  it('moat suggest --json, from the API; refuses what it cannot learn from, naming why', async () => {
    const api = `http://127.0.0.1:${moat.listening.api.port}`;
    const base = ['suggest', '--api', api, '--key', API_KEY, '--internal-deny', INTERNAL];
    const json = await runMoat([...base, '--sandbox', SANDBOX, '--json', '--since', '1h']);
    expect(json.code, json.stderr).toBe(0);
    expect(JSON.parse(json.stdout)).toEqual({
      policy: { allowOut: [`allowed.test:${web.port}`, 'denied.test'], denyOut: ['0.0.0.0/0'] },
      entries: [
        { entry: `allowed.test:${web.port}`, flows: 3, covers: ['allowed.test'] },
        { entry: 'denied.test', flows: 1, covers: ['denied.test'] },
      ],
      notOpenable: 0,
    });
    const none = await runMoat([...base, '--sandbox', 'inosuchsandbox0000000']);
    expect(none.stderr).toContain('no flow records of sandbox inosuchsandbox0000000 to learn from');
    expect(none.code).toBe(2);
    const later = await runMoat([...base, '--since', new Date(Date.now() + 60_000).toISOString()]);
    expect(later.stderr).toMatch(/no flow records since \S+ to learn from/);
    const badSince = await runMoat([...base, '--since', 'yesterday']);
    expect(badSince.stderr).toContain(
      '--since yesterday: an ISO 8601 time or a duration like 30m, 24h, 7d',
    );
    expect(badSince.code).toBe(2);
    const both = await runMoat([...base, '--from-flows', flowLog]);
    expect(both.stderr).toContain('give --from-flows FILE or --api URL, not both');
  });

  it('allows what a looser candidate would newly allow; exit 0', async () => {
    const open = path.join(dir, 'open.json');
    writeFileSync(open, '{}');
    const result = await runMoat([
      'check',
      '--policy',
      open,
      '--internal-deny',
      INTERNAL,
      '--replay',
      flowLog,
    ]);
    expect(result.stdout).toBe(
      'NEWLY ALLOWED  denied.test  (1 flow, 1 sandbox)  was [denyOut 0.0.0.0/0]  now [default]  no rule matches; the default is allow (each resolved address is still checked against the internal deny list)\n',
    );
    expect(result.code).toBe(0);
  });

  it('skips lines that are not flow records, naming the first; refuses what it cannot read', async () => {
    const mixed = path.join(dir, 'mixed.jsonl');
    writeFileSync(mixed, `not json\n{"event":"decision"}\n${readFileSync(flowLog, 'utf8')}`);
    const result = await runMoat([
      'check',
      '--policy',
      candidate,
      '--internal-deny',
      INTERNAL,
      '--replay',
      mixed,
    ]);
    expect(result.stderr).toContain(
      `--replay ${mixed}: skipped 2 line(s); first: line 1: not JSON`,
    );
    expect(result.stdout.trim().split('\n')).toHaveLength(3);
    const missing = await runMoat(['check', '--policy', candidate, '--replay', `${dir}/none`]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain(`--replay ${dir}/none: ENOENT`);
    const both = await runMoat(['check', '--policy', candidate, '--replay', flowLog, 'x.test']);
    expect(both.code).toBe(2);
    expect(both.stderr).toContain('a replay takes no DEST arguments');
  });
});
