import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PassThrough } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../../src/cli/index.js';
import type { FlowRecord } from '../../src/flows/index.js';
import { API_KEY, type ApiMoat, startApiMoat } from '../support/api-client.js';

/** A data folder with no key file: no case reads the key of a Moat run in this checkout. */
const NO_DATA = path.join(os.tmpdir(), 'moat-observe-no-data-folder');

/** Runs `moat observe` in this process; resolves its exit code and output. */
async function observe(args: string[]) {
  let stdout = '';
  let stderr = '';
  const out = new PassThrough().on('data', (c: Buffer) => (stdout += c));
  const err = new PassThrough().on('data', (c: Buffer) => (stderr += c));
  const code = await runCli(['observe', ...args], {
    stdin: new PassThrough(),
    stdout: out,
    stderr: err,
    env: { MOAT_DATA_DIR: NO_DATA },
  });
  return { code, stdout, stderr };
}

const base = {
  node: 'n',
  reason: 'r',
  bytesUp: undefined,
  bytesDown: undefined,
  durationMs: undefined,
  end: undefined,
};

const RECORDS: FlowRecord[] = [
  {
    ...base,
    time: Date.parse('2026-01-02T03:04:05.000Z'),
    id: 1,
    event: 'decision',
    sandboxID: 'iobserve0000000000001',
    kind: 'dns',
    destination: { name: 'denied.test', address: null, port: null, protocol: 'udp' },
    verdict: 'deny',
    list: 'denyOut',
    rule: '0.0.0.0/0',
  },
  {
    ...base,
    time: Date.parse('2026-01-02T03:04:06.000Z'),
    id: 2,
    event: 'decision',
    sandboxID: 'iobserve0000000000001',
    kind: 'connect',
    destination: { name: 'ok.test', address: '198.18.0.5', port: 443, protocol: 'tcp' },
    verdict: 'allow',
    list: 'allowOut',
    rule: 'ok.test',
  },
  {
    ...base,
    time: Date.parse('2026-01-02T03:04:07.000Z'),
    id: 2,
    event: 'close',
    sandboxID: 'iobserve0000000000001',
    kind: 'connect',
    destination: { name: 'ok.test', address: '198.18.0.5', port: 443, protocol: 'tcp' },
    verdict: 'allow',
    list: 'allowOut',
    rule: 'ok.test',
    bytesUp: 517,
    bytesDown: 4096,
    durationMs: 1000,
    end: 'closed',
  },
];

/** A report-mode sandbox's flow its rules would have denied, let through. */
const REPORTED: FlowRecord = {
  ...base,
  time: Date.parse('2026-01-02T03:04:08.000Z'),
  id: 3,
  event: 'decision',
  sandboxID: 'ireport00000000000001',
  kind: 'connect',
  destination: { name: 'other.test', address: '198.18.0.6', port: 443, protocol: 'tcp' },
  verdict: 'allow',
  list: 'report',
  rule: '0.0.0.0/0',
  wouldDeny: { list: 'denyOut', rule: '0.0.0.0/0', reason: 'r' },
};

describe('moat observe', () => {
  let env: ApiMoat;
  let api: string;
  let dir: string;

  beforeAll(async () => {
    env = await startApiMoat();
    api = `http://127.0.0.1:${env.moat.listening.api.port}`;
    for (const record of [...RECORDS, REPORTED]) env.moat.flows.store.add(record);
    dir = mkdtempSync(path.join(os.tmpdir(), 'moat-observe-'));
  });
  afterAll(async () => {
    await env.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it.each([
    [['--verdict', 'maybe', '--key', API_KEY], 'verdict must be allow or deny'],
    [['--kind', 'udp', '--key', API_KEY], 'kind must be one of'],
    [['--since', 'yesterday', '--key', API_KEY], 'since must be'],
    [['--sandbox', 'a b', '--key', API_KEY], '--sandbox'],
    [[], `no API key: ${path.join(NO_DATA, 'api-key')}`],
    [['--key', 'k', '--key-file', 'f'], 'not both'],
    [['--key-file', '/nonexistent/key'], '--key-file /nonexistent/key'],
    [['--colour', '--key', API_KEY], 'Unknown option'],
    [['--api', 'ftp://x', '--key', API_KEY], 'must be an http(s) URL'],
  ])('exits 2 on %j', async (args, message) => {
    const { code, stderr } = await observe(args);
    expect(code).toBe(2);
    expect(stderr).toContain(message);
    expect(stderr).not.toContain(API_KEY);
  });

  it('exits 1 when the API cannot be reached, or refuses the key', async () => {
    const unreachable = await observe(['--api', 'http://127.0.0.1:1', '--key', API_KEY]);
    expect(unreachable.code).toBe(1);
    expect(unreachable.stderr).toContain('cannot reach http://127.0.0.1:1');
    const refused = await observe(['--api', api, '--key', 'wrong-key-0123456789abcdef']);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain('answered 401');
  });

  it('prints one aligned line per record, oldest first (golden)', async () => {
    const keyFile = path.join(dir, 'key');
    writeFileSync(keyFile, `${API_KEY}\n`);
    const { code, stdout } = await observe([
      '--api',
      api,
      '--key-file',
      keyFile,
      '--sandbox',
      'iobserve0000000000001',
    ]);
    expect(code).toBe(0);
    expect(stdout).toBe(
      [
        '2026-01-02T03:04:05.000Z  iobserve0000000000001     dns          deny          denied.test                               denyOut 0.0.0.0/0',
        '2026-01-02T03:04:06.000Z  iobserve0000000000001     connect      allow         ok.test 198.18.0.5:443                    allowOut ok.test',
        '2026-01-02T03:04:07.000Z  iobserve0000000000001     connect      allow/close   ok.test 198.18.0.5:443                    allowOut ok.test  up 517 B, down 4096 B, 1000 ms, closed',
        '',
      ].join('\n'),
    );
  });

  it('prints only what report-mode sandboxes would have denied with --would-deny, saying so', async () => {
    const { code, stdout } = await observe(['--api', api, '--key', API_KEY, '--would-deny']);
    expect(code).toBe(0);
    expect(stdout).toBe(
      '2026-01-02T03:04:08.000Z  ireport00000000000001     connect      allow         other.test 198.18.0.6:443                 report: would deny by denyOut 0.0.0.0/0\n',
    );
    const refused = await observe(['--api', api, '--key', API_KEY, '--would-deny=yes']);
    expect(refused.code).toBe(2);
  });

  it('follows new records until the stream ends (exit 1: Moat went away)', async () => {
    const before = env.moat.flows.store.followerCount;
    let stdout = '';
    const out = new PassThrough().on('data', (c: Buffer) => (stdout += c));
    const running = runCli(
      [
        'observe',
        '--api',
        api,
        '--key',
        API_KEY,
        '--follow',
        '--json',
        '--sandbox',
        'ifollow00000000000001',
      ],
      { stdin: new PassThrough(), stdout: out, stderr: new PassThrough(), env: {} },
    );
    const until = async (condition: () => boolean) => {
      const deadline = Date.now() + 3000;
      while (!condition() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    };
    await until(() => env.moat.flows.store.followerCount > before);
    env.moat.flows.store.add({ ...RECORDS[0]!, id: 7, sandboxID: 'ifollow00000000000001' });
    await until(() => stdout.includes('\n'));
    env.moat.flows.store.cutFollowers();
    expect(await running).toBe(1);
    expect(JSON.parse(stdout)).toMatchObject({ id: 7, sandboxID: 'ifollow00000000000001' });
  });

  it('prints JSON lines with --json, filtered', async () => {
    const { code, stdout } = await observe([
      '--api',
      api,
      '--key',
      API_KEY,
      '--json',
      '--verdict',
      'deny',
      '--sandbox',
      'iobserve0000000000001',
    ]);
    expect(code).toBe(0);
    const lines = stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines).toEqual([expect.objectContaining({ id: 1, verdict: 'deny', kind: 'dns' })]);
  });
});
