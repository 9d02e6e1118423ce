/**
 * The README's "Five-minute walkthrough", run verbatim: its ```sh blocks are taken from README.md
 * and run by bash against a real `moat serve` child. The child replaces the walkthrough's
 * `npm start` (the same command and settings, but free ports, a scratch data folder and a
 * FakeDns upstream on loopback), and API/SANDBOX/KEY point at it. Nothing leaves the host:
 * the only name the fake zone answers with a public address (pypi.org) is never dialled, the
 * walkthrough's one proxied request is denied before any lookup, and the steps run only where
 * Moat puts sandboxes in their own network namespaces (elsewhere a sandbox's own lookups would
 * go to the host's resolver).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SETTINGS } from '../src/config-settings.js';
import { SANDBOX_ID } from '../src/sandbox/ids.js';
import { FakeDns } from './support/fake-dns.js';
import { MOAT_BIN } from './support/moat.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const README = readFileSync(path.join(ROOT, 'README.md'), 'utf8');
const PYPI_ADDRESS = '151.101.0.223';

// example.com gets a documentation address: if a bug ever dialled it, the internal list stops it.
const zone = new FakeDns(
  new Map([
    ['pypi.org', { A: [PYPI_ADDRESS] }],
    ['example.com', { A: ['192.0.2.1'] }],
  ]),
);
const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-walkthrough-'));
let moat: ChildProcess | undefined;
let moatOutput = '';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

// -- reading the walkthrough -------------------------------------------------------------------

function walkthroughSection(): string {
  const start = README.indexOf('\n## Five-minute walkthrough\n');
  if (start < 0) throw new Error('README.md has no "## Five-minute walkthrough" section');
  const end = README.indexOf('\n## ', start + 1);
  return README.slice(start, end < 0 ? undefined : end);
}

const shellBlocks = (section: string): string[] =>
  [...section.matchAll(/^```sh\n([\s\S]*?)^```$/gm)].map((m) => m[1]!);

/** A block's command lines, without blank lines and comments. */
const commands = (block: string): string[] =>
  block
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '' && !line.startsWith('#'));

interface Walkthrough {
  /** Terminal 2's set-up: variable name to the README's right-hand side. */
  readonly setup: Map<string, string>;
  /** Everything after the set-up, as one script. */
  readonly steps: string;
}

function parseWalkthrough(): Walkthrough {
  const [start, setup, ...steps] = shellBlocks(walkthroughSection());
  if (start === undefined || setup === undefined || steps.length === 0)
    throw new Error('the walkthrough needs a start block, a set-up block and steps');
  expect(commands(start), 'terminal 1 runs exactly `npm start`').toEqual(['npm start']);
  const assignments = commands(setup).map((line) => /^([A-Z]+)=(.+)$/.exec(line));
  expect(assignments.every(Boolean), 'the set-up block only assigns variables').toBe(true);
  return {
    setup: new Map(assignments.map((m) => [m![1]!, m![2]!])),
    steps: steps.join('\n'),
  };
}

// -- the moat serve child (what `npm start` runs) --------------------------------------------

interface Started {
  readonly api: string;
  readonly sandbox: string;
  readonly key: string;
  readonly enforcement: string;
}

/**
 * The README's namespace pool, or, where another Moat on its defaults holds it (one Moat a pool:
 * a lock in /run/moat), this one of the same shape: the walkthrough then runs there and its
 * addresses are read as this pool's.
 */
const SPARE_POOL = '10.214.0.0/16';
const README_POOL = SETTINGS.find((setting) => setting.key === 'namespacePool')!.default as string;
/** The pool this run's Moat got: the README's, unless another Moat holds it. */
let pool = '';
/** The egress line the README shows (namespace 10.213.x.y, proxy and DNS on .0.1), in `pool`. */
function poolLine(): RegExp {
  const net = pool.split('.').slice(0, 2).join('\\.');
  return new RegExp(
    `^namespace ${net}\\.\\d+\\.\\d+ http://${net}\\.0\\.1:3128 ${net}\\.0\\.1:53$`,
    'm',
  );
}

async function startMoat(poolFlag: string[] = []): Promise<Started> {
  moatOutput = '';
  // Only PATH from the environment, so no MOAT_* of the host changes the settings.
  moat = spawn(
    process.execPath,
    [
      MOAT_BIN,
      'serve',
      '--data-dir',
      path.join(scratch, 'data'),
      '--dns-upstream',
      `127.0.0.1:${zone.port}`,
      ...['api', 'sandbox', 'dns', 'proxy', 'transparent'].flatMap((l) => [
        `--${l}-listen`,
        '127.0.0.1:0',
      ]),
      ...poolFlag,
    ],
    { env: { PATH: process.env.PATH ?? '' }, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  moat.stdout!.setEncoding('utf8').on('data', (chunk: string) => (moatOutput += chunk));
  moat.stderr!.setEncoding('utf8').on('data', (chunk: string) => (moatOutput += chunk));
  const deadline = Date.now() + 15_000;
  while (!/^moat: metrics /m.test(moatOutput)) {
    const heldElsewhere = new RegExp(
      `the namespace pool ${README_POOL.replace(/\./g, '\\.')} is in use by another Moat`,
    );
    // Its last words may arrive just after it exits.
    if (moat.exitCode !== null) await sleep(200);
    if (moat.exitCode !== null && poolFlag.length === 0 && heldElsewhere.test(moatOutput)) {
      console.warn(`walkthrough: another Moat holds the README's pool; running on ${SPARE_POOL}`);
      // Afresh, so that this start too generates the key the README's KEY line reads.
      rmSync(path.join(scratch, 'data'), { recursive: true, force: true });
      return startMoat(['--namespace-pool', SPARE_POOL]);
    }
    if (moat.exitCode !== null || Date.now() > deadline)
      throw new Error(`moat serve did not start:\n${moatOutput}`);
    await sleep(20);
  }
  pool = poolFlag[1] ?? README_POOL;
  const api = /^moat: platform API +(http:\/\/\S+) /m.exec(moatOutput)?.[1];
  const sandbox = /^moat: sandbox API +(http:\/\/\S+) /m.exec(moatOutput)?.[1];
  const keyFile = /^moat: API key +generated into (\S+) /m.exec(moatOutput)?.[1];
  const key = keyFile && readFileSync(keyFile, 'utf8').trim();
  const enforcement = /^moat: enforcement +(\S+)/m.exec(moatOutput)?.[1];
  if (!api || !sandbox || !key || !enforcement)
    throw new Error(`no API addresses, generated key or enforcement in:\n${moatOutput}`);
  return { api, sandbox, key, enforcement };
}

async function stopMoat(): Promise<void> {
  const child = moat;
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  await Promise.race([exited, sleep(10_000).then(() => child.kill('SIGKILL'))]);
}

// -- running shell ---------------------------------------------------------------------------

interface Shell {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `script` with bash (-euo pipefail) in `cwd`, killed after `timeoutMs`. */
function bash(script: string, cwd: string, timeoutMs = 40_000): Promise<Shell> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', ['-c', `set -euo pipefail\n${script}`], {
      cwd,
      // A clean environment: no proxy variables of the host; npx may only use what is installed
      // (offline), so `npx moat` can never turn into a registry request.
      env: {
        PATH: process.env.PATH ?? '',
        HOME: process.env.HOME ?? os.homedir(),
        npm_config_offline: 'true',
        npm_config_update_notifier: 'false',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

const quote = (value: string) => `'${value.replace(/'/g, `'\\''`)}'`;

/** Each pattern must match, each after the previous one's match. */
function expectInOrder(output: string, patterns: RegExp[]): void {
  let rest = output;
  for (const pattern of patterns) {
    const match = pattern.exec(rest);
    expect(match, `${pattern} (in order) in:\n${output}`).not.toBeNull();
    rest = rest.slice(match!.index + match![0].length);
  }
}

// -- the test ----------------------------------------------------------------------------------

let started: Started;

beforeAll(async () => {
  await zone.start();
  started = await startMoat();
});

afterAll(async () => {
  await stopMoat();
  await zone.stop();
  rmSync(scratch, { recursive: true, force: true });
});

describe('README five-minute walkthrough', () => {
  it('starts Moat the way npm start does', () => {
    const scripts = (
      JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as {
        scripts: Record<string, string>;
      }
    ).scripts;
    expect(scripts.start).toBe('node dist/src/cli/main.js serve');
  });

  it('sets API, SANDBOX and KEY to what a default Moat serves and generates', async () => {
    const { setup } = parseWalkthrough();
    expect([...setup.keys()].sort()).toEqual(['API', 'KEY', 'SANDBOX']);
    const defaultOf = (key: string) => SETTINGS.find((s) => s.key === key)!.default;
    expect(setup.get('API')).toBe(`http://${defaultOf('apiListen')}`);
    expect(setup.get('SANDBOX')).toBe(`http://${defaultOf('sandboxListen')}`);
    // The KEY line run where the default data folder (./data) is this Moat's data folder.
    const key = await bash(`KEY=${setup.get('KEY')}\nprintf %s "$KEY"`, scratch);
    expect(key.stderr).toBe('');
    expect(key.stdout).toBe(started.key);
  });

  it('runs every step verbatim, with the outputs the README shows', async (context) => {
    if (started.enforcement !== 'namespace') {
      console.warn(
        `walkthrough steps skipped: Moat enforces with ${started.enforcement} here, so a sandbox's own DNS lookups would use the host's resolver`,
      );
      context.skip();
    }
    const { steps } = parseWalkthrough();
    // Safety before running: every URL is Moat's own or the denied name.
    for (const url of steps.match(/https?:\/\/[^\s'";]+/g) ?? [])
      expect(url).toMatch(/^https?:\/\/example\.com\/$/);

    const script = [
      `API=${quote(started.api)}`,
      `SANDBOX=${quote(started.sandbox)}`,
      `KEY=${quote(started.key)}`,
      steps,
      // The test's own line: what the steps left in their variables.
      'echo "@@ $ID"',
    ].join('\n');
    const run = await bash(script, ROOT);
    const output = run.stdout;
    expect(run.code, `bash failed:\n${output}\n${run.stderr}\nmoat:\n${moatOutput}`).toBe(0);

    const [, id] = /^@@ (\S+)$/m.exec(output) ?? [];
    expect(id).toMatch(SANDBOX_ID);
    const e = (text: string) => text.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
    expectInOrder(output, [
      // 1. create
      new RegExp(`^${id}$`, 'm'),
      // 2. egress: its own namespace, Moat on the link's gateway
      poolLine(),
      // 3. PUT network
      /^204$/m,
      // 4. denied through the proxy, naming the rule
      /^HTTP\/1\.1 403 Forbidden\r?$/m,
      /^X-Moat-Decision: deny; list=denyOut; rule="0\.0\.0\.0\/0"\r?$/im,
      /^\{"code":403,"message":"egress to example\.com:80 denied by denyOut rule 0\.0\.0\.0\/0: [^"]+"\}$/m,
      // 5. DNS in the namespace: denied name NXDOMAIN, allowed name answered from upstream
      /^curl: \(6\) Could not resolve host: example\.com$/m,
      new RegExp(`^${e(PYPI_ADDRESS)}\\s+pypi\\.org$`, 'm'),
      // 6. moat check
      /^ALLOW pypi\.org +\[allowOut pypi\.org\]/m,
      /^ALLOW files\.pythonhosted\.org +\[allowOut files\.pythonhosted\.org\]/m,
      /^DENY +example\.com:443 +\[denyOut 0\.0\.0\.0\/0\]/m,
      /^exit status 1$/m,
      // 7. DELETE
      /^204$/m,
    ]);

    // Denied names were decided before any lookup or connection: the upstream never heard of
    // example.com, from the proxy or from DNS. The allowed name was forwarded to it.
    expect(zone.asked('example.com')).toEqual([]);
    expect(zone.asked('pypi.org').length).toBeGreaterThan(0);

    // The cleanup step really removed the sandbox.
    const gone = await fetch(`${started.api}/sandboxes/${id}`, {
      headers: { 'X-API-Key': started.key },
    });
    expect(gone.status).toBe(404);
  });

  it('in_sandbox says why when a command cannot start, instead of a TypeError', async () => {
    const helper = /^in_sandbox\(\) \{\n[\s\S]*?^\}$/m.exec(parseWalkthrough().steps)?.[0];
    expect(helper, 'the walkthrough defines in_sandbox').toBeDefined();
    const created = await fetch(`${started.api}/v2/sandboxes`, {
      method: 'POST',
      headers: { 'X-API-Key': started.key, 'Content-Type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', timeout: 120 }),
    });
    expect(created.status).toBe(201);
    const { sandboxID } = (await created.json()) as { sandboxID: string };
    // The sandbox API on a port nothing listens on: the command cannot start.
    const closed = net.createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as net.AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    const run = await bash(
      [
        `export E2B_API_URL=${quote(started.api)} E2B_SANDBOX_URL=http://127.0.0.1:${port}`,
        `export E2B_API_KEY=${quote(started.key)} ID=${quote(sandboxID)}`,
        helper!,
        "in_sandbox 'echo never'",
      ].join('\n'),
      ROOT,
    );
    await fetch(`${started.api}/sandboxes/${sandboxID}`, {
      method: 'DELETE',
      headers: { 'X-API-Key': started.key },
    });
    expect(run.code).not.toBe(0);
    expect(run.stdout).toBe('');
    expect(run.stderr).not.toContain('ERR_INVALID_ARG_TYPE');
    expect(run.stderr).toMatch(/ECONNREFUSED|fetch failed|connect/i);
  });
});
