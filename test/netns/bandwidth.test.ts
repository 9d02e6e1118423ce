/**
 * `network.bandwidth` held in the kernel, end to end: a `moat serve` in namespace mode runs in a
 * namespace this test makes, which plays the host, with a sink and a source of bytes on a host
 * port the operator opened. A sandbox sending (or receiving) for 3 s is held to its rate within
 * 10%, measured where the bytes arrive; a second sandbox sending at the same time is not held;
 * a PUT changes the rate of the running sandbox.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import type { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type HostMoat, runIn, startHostMoat } from '../support/host-moat.js';
import { namespaceSkipReason } from '../support/netns.js';
import { python } from '../support/sandbox-watch.js';

const skip = namespaceSkipReason('test/netns/bandwidth');

const HOST = '198.18.23.1';
const POOL = '10.223.0.0/24';
const SINK_PORT = 8084;
const SOURCE_PORT = 8085;
const SECONDS = 3;
/**
 * The shaper counts what goes on the link: a full TCP segment carries 1,448 bytes of data in
 * 1,514 (Ethernet 14, IPv4 20, TCP with timestamps 32). Rates measured as data are scaled by
 * this to compare them with the rate set.
 */
const ON_THE_LINK = 1514 / 1448;

/**
 * Runs in the host's namespace: a sink that prints, per connection, who sent how many bytes over
 * how long (first byte to end), and a source that sends to each connection for SECONDS.
 */
const SERVICES = `
const net = require('node:net');
net.createServer((socket) => {
  let bytes = 0, first = 0;
  socket.on('data', (chunk) => { if (!first) first = performance.now(); bytes += chunk.length; });
  socket.on('end', () => {
    console.log(JSON.stringify({ from: socket.remoteAddress, bytes, seconds: (performance.now() - first) / 1000 }));
    socket.end();
  });
  socket.on('error', () => socket.destroy());
}).listen(${SINK_PORT}, '${HOST}', () => console.log('ready'));
net.createServer((socket) => {
  const chunk = Buffer.alloc(65536, 120);
  const until = performance.now() + ${SECONDS * 1000};
  const more = () => {
    while (performance.now() < until) if (!socket.write(chunk)) return;
    socket.end();
  };
  socket.on('drain', more);
  socket.on('error', () => socket.destroy());
  more();
}).listen(${SOURCE_PORT}, '${HOST}', () => console.log('ready'));`;

/**
 * Sends to the sink for SECONDS, then waits for the sink's end; its rate is read at the sink.
 * Should the end not come, it says how long it waited and how its socket stood (a run in CI
 * once waited past the command's time with nothing to show).
 */
const send = python(
  [
    'import socket, subprocess, sys, time',
    `s = socket.create_connection(("${HOST}", ${SINK_PORT}), timeout=10)`,
    'chunk = b"x" * 65536; start = time.time(); end = start + ' + SECONDS,
    'while time.time() < end: s.sendall(chunk)',
    // What the shaper still holds drains at the rate; a loaded host's sink takes its time too.
    's.settimeout(40); s.shutdown(socket.SHUT_WR); ended = time.time()',
    'try: s.recv(1)',
    'except socket.timeout:',
    '  ss = subprocess.run(["ss", "-tino"], capture_output=True, text=True).stdout',
    '  sys.exit("no end from the sink %.1f s after sending for %.1f s:\\n%s" % (time.time() - ended, ended - start, ss))',
  ].join('\n'),
);

/** Receives from the source; prints Mbit/s from its first byte to the end. */
const receive = python(
  [
    'import socket, time',
    `s = socket.create_connection(("${HOST}", ${SOURCE_PORT}), timeout=10)`,
    'got = 0; first = None',
    'while True:',
    '  b = s.recv(65536)',
    '  if not b: break',
    '  first = first or time.time(); got += len(b)',
    'print(got * 8 / (time.time() - first) / 1e6)',
  ].join('\n'),
);

describe.skipIf(skip !== undefined)('bandwidth limits in the kernel (namespace mode)', () => {
  let harness: HostMoat;
  let services: ChildProcess;
  const received: Array<{ from: string; bytes: number; seconds: number }> = [];
  let limited: Sandbox;
  let neighbour: Sandbox;
  const network = { allowOut: ['198.18.0.0/15'], denyOut: ['0.0.0.0/0'] };
  const addressOf = async (sandbox: Sandbox) =>
    (
      (await harness.api.call('GET', `/sandboxes/${sandbox.sandboxId}`)).body as {
        egress: { address: string };
      }
    ).egress.address;

  /** Sends from each sandbox at once; the Mbit/s on the link the sink measured for each. */
  async function sendFrom(...sandboxes: Sandbox[]): Promise<number[]> {
    const addresses = await Promise.all(sandboxes.map(addressOf));
    received.length = 0;
    const sent = await Promise.all(sandboxes.map((sandbox) => runIn(sandbox, send, 55_000)));
    for (const ran of sent) expect(ran.code, ran.err).toBe(0);
    return addresses.map((address) => {
      const at = received.find((r) => r.from.endsWith(address));
      expect(at, `the sink heard nothing from ${address}`).toBeDefined();
      return ((at!.bytes * 8) / at!.seconds / 1e6) * ON_THE_LINK;
    });
  }

  beforeAll(async () => {
    harness = await startHostMoat('bandwidth', HOST, POOL, [
      '--allow-host-ports',
      `${SINK_PORT},${SOURCE_PORT}`,
    ]);
    services = spawn(
      '/usr/bin/nsenter',
      [`--net=/run/netns/${harness.host.name}`, '--', process.execPath, '-e', SERVICES],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    await new Promise<void>((resolve) => {
      let ready = 0;
      services.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
        for (const line of chunk.split('\n').filter((l) => l !== '')) {
          if (line === 'ready') {
            if (++ready === 2) resolve();
          } else received.push(JSON.parse(line) as (typeof received)[number]);
        }
      });
    });
    [limited, neighbour] = await Promise.all([
      harness.sandbox({ ...network, bandwidth: { egressMbps: 8, ingressMbps: 12 } }),
      harness.sandbox(network),
    ]);
  }, 60_000);

  afterAll(async () => {
    services?.kill('SIGKILL');
    await harness?.stop();
  });

  it("leaves TCP windows to the sandbox's peers (a fast transfer's FIN is not dropped as INVALID)", async () => {
    // A setting of the sandbox's own namespace: read from inside it.
    const inside = await runIn(
      neighbour,
      'cat /proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal',
    );
    expect(inside.out.trim(), inside.err).toBe('1');
  });

  it('holds a sandbox to its egress rate within 10%, and not a neighbour sending at the same time', async () => {
    const [mbps, neighbours] = await sendFrom(limited, neighbour);
    expect(mbps).toBeGreaterThan(8 * 0.9);
    expect(mbps).toBeLessThan(8 * 1.1);
    expect(neighbours).toBeGreaterThan(80);
  }, 70_000);

  it('holds a sandbox to its ingress rate within 10%', async () => {
    const ran = await runIn(limited, receive);
    const mbps = Number(ran.out.trim()) * ON_THE_LINK;
    expect(mbps, ran.err).toBeGreaterThan(12 * 0.9);
    expect(mbps).toBeLessThan(12 * 1.1);
    const free = Number((await runIn(neighbour, receive)).out.trim());
    expect(free).toBeGreaterThan(120);
  }, 30_000);

  it('changes the rate of the running sandbox on PUT network, and lifts it with 0', async () => {
    const put = await harness.api.call('PUT', `/sandboxes/${limited.sandboxId}/network`, {
      body: { ...network, bandwidth: { egressMbps: 16 } },
    });
    expect(put.status, put.text).toBe(204);
    const [mbps] = await sendFrom(limited);
    expect(mbps).toBeGreaterThan(16 * 0.9);
    expect(mbps).toBeLessThan(16 * 1.1);
    const lifted = await harness.api.call('PUT', `/sandboxes/${limited.sandboxId}/network`, {
      body: { ...network, bandwidth: { egressMbps: 0, ingressMbps: 0 } },
    });
    expect(lifted.status, lifted.text).toBe(204);
    const [free] = await sendFrom(limited);
    expect(free).toBeGreaterThan(80);
  }, 130_000);
});
