/**
 * Crash durability of the platform API with a real `moat serve` child: a stream of creates and
 * network updates runs with requests in flight, the child is killed with SIGKILL at a seeded
 * random moment, and the restarted Moat must hold every acknowledged write (and, for requests
 * cut off by the kill, either outcome), and enforce exactly what it stored.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { Prng } from '../../bench/lib/prng.js';
import { udpQuery } from '../support/dns-client.js';
import { FakeDns } from '../support/fake-dns.js';
import { MOAT_BIN } from '../support/moat.js';
import { removeMoatFolder } from '../../bench/lib/scratch.js';

const API_KEY = 'durability-test-key-0123456789';
const ALL_TRAFFIC = '0.0.0.0/0';
const SEED = 0xd0ab1e;
const CYCLES = 3;
const IN_FLIGHT = 8;
/** Bounds the stream even if the kill never lands. */
const MAX_REQUESTS_PER_CYCLE = 3000;
const REQUEST_TIMEOUT_MS = 5000;
const DNS_SAMPLE = 30;
/** Names a sandbox was given that are checked as denied now (the most recent ones). */
const DENIED_CHECKS = 3;
/** A name no sandbox is ever given: every sandbox must get NXDOMAIN for it. */
const NEVER_ALLOWED = 'never.durable.test';

const hostDir = mkdtempSync(path.join(os.tmpdir(), 'moat-durability-'));
const zone = new FakeDns(new Map());
let moat: MoatChild | undefined;
let ports: { api: number; dns: number } = { api: 0, dns: 0 };

/** Puts a name in the fake upstream's zone, so it resolves if Moat forwards it. */
function resolvable(name: string): string {
  // Loopback answers: data only, nothing dials them (Moat strips them as internal anyway).
  zone.zone.set(name, { A: [`127.0.${zone.zone.size >> 8}.${zone.zone.size & 255}`] });
  return name;
}

const networkFor = (name: string) => ({ allowOut: [name], denyOut: [ALL_TRAFFIC] });

// -- the child process --

class MoatChild {
  private stdout = '';
  private stderr = '';
  readonly exited: Promise<void>;

  constructor(readonly child: ChildProcess) {
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => (this.stdout += chunk));
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (this.stderr += chunk));
    this.exited = new Promise((resolve) => child.once('exit', () => resolve()));
  }

  get running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  output(): string {
    return `stdout:\n${this.stdout}\nstderr:\n${this.stderr}`;
  }

  /** Waits for the start-up lines and returns the ports they name. */
  async listening(deadlineMs: number): Promise<{ api: number; dns: number }> {
    const deadline = Date.now() + deadlineMs;
    while (Date.now() < deadline && this.running) {
      const api = /platform API\s+http:\/\/127\.0\.0\.1:(\d+)/.exec(this.stderr)?.[1];
      const dns = /DNS interceptor\s+127\.0\.0\.1:(\d+)/.exec(this.stderr)?.[1];
      if (api && dns) return { api: Number(api), dns: Number(dns) };
      await sleep(20);
    }
    throw new Error(`moat serve did not start\n${this.output()}`);
  }

  /** SIGKILL; resolves once the process is reaped (a zombie would still hold the store lock). */
  async kill(): Promise<void> {
    if (this.running) this.child.kill('SIGKILL');
    await this.exited;
  }
}

function startMoat(listen: { api: number; dns: number }): MoatChild {
  const args = [
    ...['serve', '--data-dir', hostDir, '--api-listen', `127.0.0.1:${listen.api}`],
    ...['--sandbox-listen', '127.0.0.1:0'],
    ...['--dns-listen', `127.0.0.1:${listen.dns}`, '--proxy-listen', '127.0.0.1:0'],
    ...['--transparent-listen', 'off', '--dns-upstream', `127.0.0.1:${zone.port}`],
    ...['--api-keys', API_KEY, '--log-level', 'warn'],
    // The test speaks as a sandbox from its loopback source address.
    ...['--enforcement', 'proxy'],
  ];
  // Only PATH from the environment: no MOAT_* setting of the host leaks in.
  const child = spawn(process.execPath, [MOAT_BIN, ...args], {
    env: { PATH: process.env.PATH ?? '' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return new MoatChild(child);
}

/** Starts Moat (on the ports of the first start) and waits until /health answers. */
async function startHealthy(): Promise<MoatChild> {
  const child = startMoat(ports);
  moat = child;
  // A start after SIGKILL recovers every stored sandbox: on a loaded host that takes seconds.
  const listening = await child.listening(30_000);
  if (ports.api === 0) ports = listening;
  expect(listening).toEqual(ports);
  const deadline = Date.now() + 15_000;
  for (;;) {
    const health = await api('GET', '/health').catch(() => undefined);
    if (health?.status === 200) return child;
    if (Date.now() > deadline) throw new Error(`/health never answered\n${child.output()}`);
    await sleep(50);
  }
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

async function api(
  method: string,
  url: string,
  body?: object,
): Promise<{ status: number; body: unknown }> {
  const response = await fetch(`http://127.0.0.1:${ports.api}${url}`, {
    method,
    headers: {
      'x-api-key': API_KEY,
      ...(body ? { 'content-type': 'application/json' } : {}),
    },
    body: body ? JSON.stringify(body) : undefined,
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  const text = await response.text();
  return { status: response.status, body: text === '' ? undefined : JSON.parse(text) };
}

// -- what the client knows --

interface Tracked {
  readonly id: string;
  /** The allowed name of the config last acknowledged (or seen stored after a restart). */
  acked: string;
  /** The allowed name of a PUT cut off by the kill: it may or may not have landed. */
  inFlight: string | undefined;
  /** Every name this sandbox was ever given, oldest first. */
  readonly names: string[];
}

interface Client {
  readonly sandboxes: Map<string, Tracked>;
  /** Sandboxes with no request in flight: PUTs to one sandbox never overlap, so order is known. */
  readonly idle: string[];
  /** Allowed names of creates cut off by the kill (their IDs are unknown). */
  inFlightCreates: string[];
  /** Requests that failed for a reason other than the kill. */
  readonly unexpected: string[];
  counter: number;
}

/** Issues creates and PUTs, IN_FLIGHT at a time, until the child is killed. */
async function runStream(client: Client, rng: Prng, killAfterMs: number): Promise<number> {
  let killed = false;
  let issued = 0;
  const killer = setTimeout(() => {
    killed = true;
    moat!.child.kill('SIGKILL');
  }, killAfterMs);
  const outcome = async <T>(request: Promise<T>): Promise<T | 'cut off'> => {
    try {
      return await request;
    } catch (error) {
      if (!killed) throw error;
      return 'cut off';
    }
  };
  const worker = async () => {
    while (!killed && issued < MAX_REQUESTS_PER_CYCLE) {
      issued++;
      const n = client.counter++;
      if (client.idle.length < IN_FLIGHT || rng.chance(0.4)) {
        const name = resolvable(`c${n}.durable.test`);
        const reply = await outcome(
          api('POST', '/sandboxes', {
            templateID: 'base',
            timeout: 3600,
            network: networkFor(name),
          }),
        );
        if (reply === 'cut off') client.inFlightCreates.push(name);
        else if (reply.status !== 201) client.unexpected.push(`create ${reply.status}`);
        else {
          const id = (reply.body as { sandboxID: string }).sandboxID;
          client.sandboxes.set(id, { id, acked: name, inFlight: undefined, names: [name] });
          client.idle.push(id);
        }
        continue;
      }
      const at = rng.int(client.idle.length);
      const id = client.idle[at]!;
      client.idle[at] = client.idle.at(-1)!;
      client.idle.pop();
      const sandbox = client.sandboxes.get(id)!;
      const name = resolvable(`p${n}.durable.test`);
      sandbox.names.push(name);
      const reply = await outcome(api('PUT', `/sandboxes/${id}/network`, networkFor(name)));
      if (reply === 'cut off') sandbox.inFlight = name;
      else if (reply.status !== 204) client.unexpected.push(`PUT ${reply.status}`);
      else {
        sandbox.acked = name;
        client.idle.push(id);
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  } finally {
    clearTimeout(killer);
    await moat!.kill();
  }
  return issued;
}

interface Detail {
  network: { allowOut: string[]; denyOut: string[] };
  egress: { address: string };
}

/** Every sandbox ID, through /v2/sandboxes pagination (bounded). */
async function listAll(): Promise<string[]> {
  const ids: string[] = [];
  let token: string | undefined;
  for (let page = 0; page < 1000; page++) {
    const query = token === undefined ? '' : `&nextToken=${encodeURIComponent(token)}`;
    const response = await fetch(`http://127.0.0.1:${ports.api}/v2/sandboxes?limit=100${query}`, {
      headers: { 'x-api-key': API_KEY },
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    expect(response.status).toBe(200);
    ids.push(...((await response.json()) as Array<{ sandboxID: string }>).map((s) => s.sandboxID));
    token = response.headers.get('x-next-token') ?? undefined;
    if (token === undefined) return ids;
  }
  throw new Error('pagination did not end');
}

/** GET detail for many sandboxes, a few at a time. */
async function details(ids: readonly string[]): Promise<Map<string, Detail>> {
  const found = new Map<string, Detail>();
  let next = 0;
  const worker = async () => {
    while (next < ids.length) {
      const id = ids[next++]!;
      const reply = await api('GET', `/sandboxes/${id}`);
      expect(reply.status, `GET /sandboxes/${id}`).toBe(200);
      found.set(id, reply.body as Detail);
    }
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  return found;
}

/** The one allowed name of a stored config, checked to have the shape the client sent. */
function storedName(detail: Detail): string {
  expect(detail.network.denyOut).toEqual([ALL_TRAFFIC]);
  expect(detail.network.allowOut).toHaveLength(1);
  return detail.network.allowOut[0]!;
}

/**
 * After a restart: every acknowledged write is there, cut-off ones are there or not, and
 * nothing else is. Adopts what is stored as the new acknowledged state, and returns the
 * sandboxes a cut-off request touched.
 */
async function checkStored(client: Client): Promise<Set<string>> {
  const listed = await listAll();
  expect(new Set(listed).size).toBe(listed.length);
  const known = [...client.sandboxes.keys()];
  const missing = known.filter((id) => !listed.includes(id));
  expect(missing, 'acknowledged creates missing after restart').toEqual([]);
  const stored = await details(listed);
  const undecided = new Set<string>();
  for (const sandbox of client.sandboxes.values()) {
    if (sandbox.inFlight) undecided.add(sandbox.id);
    const name = storedName(stored.get(sandbox.id)!);
    const acceptable = [sandbox.acked, ...(sandbox.inFlight ? [sandbox.inFlight] : [])];
    expect(acceptable, `config of ${sandbox.id}`).toContain(name);
    sandbox.acked = name;
    sandbox.inFlight = undefined;
  }
  // A sandbox the client never heard of can only be a create cut off by the kill, once each.
  const unclaimed = [...client.inFlightCreates];
  for (const id of listed.filter((id) => !client.sandboxes.has(id))) {
    const name = storedName(stored.get(id)!);
    expect(unclaimed, `unknown sandbox ${id} with ${name}`).toContain(name);
    unclaimed.splice(unclaimed.indexOf(name), 1);
    undecided.add(id);
    client.sandboxes.set(id, { id, acked: name, inFlight: undefined, names: [name] });
  }
  client.inFlightCreates = [];
  client.idle.splice(0, client.idle.length, ...client.sandboxes.keys());
  return undecided;
}

/** From its egress address, a sandbox resolves exactly its stored name among those it had. */
async function checkEnforced(sandbox: Tracked, address: string): Promise<void> {
  const before = zone.asked(sandbox.acked).length;
  const allowed = await udpQuery(ports.dns, address, sandbox.acked);
  expect(allowed.rcode, `${sandbox.id} resolving its allowed ${sandbox.acked}`).toBe('NOERROR');
  expect(zone.asked(sandbox.acked).length).toBeGreaterThan(before);
  const denied = [
    ...sandbox.names.filter((n) => n !== sandbox.acked).slice(-DENIED_CHECKS),
    NEVER_ALLOWED,
  ];
  for (const name of denied) {
    const reply = await udpQuery(ports.dns, address, name);
    expect(reply.rcode, `${sandbox.id} (allowed ${sandbox.acked}) resolving ${name}`).toBe(
      'NXDOMAIN',
    );
  }
}

beforeAll(async () => {
  await zone.start();
  resolvable(NEVER_ALLOWED);
});

afterAll(async () => {
  await moat?.kill();
  await zone.stop();
  removeMoatFolder(hostDir);
});

it('keeps every acknowledged create and network update across SIGKILL, and enforces what it stored', async () => {
  // Kill moments from their own generator: the stream's draws depend on timing.
  const kills = new Prng(SEED);
  const rng = new Prng(SEED + 1);
  const client: Client = {
    sandboxes: new Map(),
    idle: [],
    inFlightCreates: [],
    unexpected: [],
    counter: 0,
  };
  await startHealthy();
  let cutOff = 0;
  for (let cycle = 1; cycle <= CYCLES; cycle++) {
    const killAfterMs = kills.range(300, 1200);
    const issued = await runStream(client, rng, killAfterMs);
    const context = `cycle ${cycle} (seed ${SEED}, kill after ${killAfterMs} ms, ${issued} requests)`;
    expect(client.unexpected, context).toEqual([]);
    // The kill must land mid-stream for the test to mean anything, in some cycle at least: at
    // a given moment every request may just have been answered (a group commit answers many).
    cutOff +=
      client.inFlightCreates.length +
      [...client.sandboxes.values()].filter((s) => s.inFlight).length;
    await startHealthy();
    const undecided = await checkStored(client);
    // Those a cut-off request touched first: there the stored and the enforced could differ.
    const others = rng.shuffle([...client.sandboxes.keys()].filter((id) => !undecided.has(id)));
    const sample = [...undecided, ...others].slice(0, DNS_SAMPLE);
    const addresses = await details(sample);
    for (const id of sample) {
      await checkEnforced(client.sandboxes.get(id)!, addresses.get(id)!.egress.address);
    }
  }
  expect(
    cutOff,
    `requests cut off by the kills of ${CYCLES} cycles (seed ${SEED})`,
  ).toBeGreaterThan(0);
}, 60_000);
