/**
 * The upstream resolver of a Moat that runs in a host namespace (./host-moat.ts names
 * 127.0.0.1:5399 there): the test's own FakeDns, so the zone and the log of questions stay in
 * the test. A small relay inside the namespace takes each UDP question and asks it over DNS's
 * TCP framing through a Unix socket (which no network namespace holds), piped here to the
 * FakeDns's TCP port.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { FakeDns, type ZoneEntry } from './fake-dns.js';

/** Inside the namespace: UDP on 127.0.0.1:<port>, each question asked over the Unix socket. */
const RELAY = `
const dgram = require('node:dgram');
const net = require('node:net');
const [socket, port] = process.argv.slice(1);
const udp = dgram.createSocket('udp4');
udp.on('message', (question, from) => {
  const upstream = net.connect(socket);
  upstream.setTimeout(5000, () => upstream.destroy());
  upstream.on('error', () => upstream.destroy());
  const length = Buffer.from([question.length >> 8, question.length & 255]);
  upstream.write(Buffer.concat([length, question]));
  let got = Buffer.alloc(0);
  upstream.on('data', (chunk) => {
    got = Buffer.concat([got, chunk]);
    if (got.length < 2 || got.length < 2 + got.readUInt16BE(0)) return;
    udp.send(got.subarray(2, 2 + got.readUInt16BE(0)), from.port, from.address);
    upstream.destroy();
  });
});
udp.bind(Number(port), '127.0.0.1', () => console.log('ready'));`;

export interface HostDns {
  readonly upstream: FakeDns;
  close(): Promise<void>;
}

/** Serves `zone` on 127.0.0.1:`port` inside the network namespace `netns` (a name in /run/netns). */
export async function serveDnsIn(
  netns: string,
  zone: Map<string, ZoneEntry>,
  port = 5399,
): Promise<HostDns> {
  const upstream = await new FakeDns(zone).start();
  const folder = mkdtempSync(path.join(os.tmpdir(), 'moat-vmdns-'));
  const socket = path.join(folder, 'dns.sock');
  const bridge = net.createServer((client) => {
    const tcp = net.connect(upstream.port, '127.0.0.1');
    client.on('error', () => tcp.destroy());
    tcp.on('error', () => client.destroy());
    client.pipe(tcp).pipe(client);
  });
  await new Promise<void>((resolve) => bridge.listen(socket, resolve));
  let relay: ChildProcess | undefined;
  const close = async () => {
    relay?.kill('SIGKILL');
    await new Promise<void>((resolve) => bridge.close(() => resolve()));
    await upstream.stop();
    rmSync(folder, { recursive: true, force: true });
  };
  try {
    relay = spawn(
      '/usr/bin/nsenter',
      [`--net=/run/netns/${netns}`, '--', process.execPath, '-e', RELAY, socket, String(port)],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('DNS relay not ready within 10 s')), 10_000);
      relay!.stdout!.once('data', () => {
        clearTimeout(timer);
        resolve();
      });
      relay!.once('exit', (code) => reject(new Error(`DNS relay exited (${code})`)));
    });
  } catch (error) {
    await close();
    throw error;
  }
  return { upstream, close };
}
