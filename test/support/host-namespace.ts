/**
 * A network namespace a test makes to play "the host": Moat runs in it (ServeChild's `netns`),
 * its own services listen there, and an interface (host0) holds addresses the test adds and
 * removes (198.18.0.0/15, benchmarking space: nothing outside this machine is ever addressed,
 * and the machine's own namespace gets no interface). The test reaches listeners inside it on
 * loopback through forwarders over Unix sockets, which no network namespace holds.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const IP = '/usr/sbin/ip';
const NSENTER = '/usr/bin/nsenter';

/** Runs inside the namespace: one Unix socket per port, each relayed to 127.0.0.1:<port>. */
const RELAY = `
const net = require('node:net');
const [dir, ...ports] = process.argv.slice(1);
for (const port of ports) {
  net.createServer((client) => {
    const inside = net.connect(Number(port), '127.0.0.1');
    client.on('error', () => inside.destroy());
    inside.on('error', () => client.destroy());
    client.pipe(inside).pipe(client);
  }).listen(dir + '/' + port + '.sock', () => console.log(port));
}`;

/** Runs inside the namespace: listens on 0.0.0.0:<port> for each port, logs who came. */
const SERVICES = `
const http = require('node:http');
for (const port of process.argv.slice(1)) {
  http.createServer((request, response) => {
    console.log(JSON.stringify({ port: Number(port), host: request.headers.host }));
    response.end('host service ' + port + '\\n');
  }).listen(Number(port), '0.0.0.0', () => console.log(JSON.stringify({ listening: Number(port) })));
}`;

export class HostNamespace {
  /** Requests the host's services answered: their port and Host header. */
  readonly served: Array<{ port: number; host: string }> = [];
  private readonly children: ChildProcess[] = [];
  private readonly forwarders: net.Server[] = [];
  private readonly sockets: string;

  private constructor(readonly name: string) {
    this.sockets = mkdtempSync(path.join(os.tmpdir(), 'moat-hostns-'));
  }

  /** Makes the namespace with loopback up and an interface holding `address`. */
  static create(tag: string, address: string): HostNamespace {
    const host = new HostNamespace(`moat-hostns-${tag}`);
    try {
      execFileSync(IP, ['netns', 'delete', host.name], { stdio: 'ignore' });
    } catch {
      // Not left by an earlier run.
    }
    execFileSync(IP, ['netns', 'add', host.name]);
    try {
      host.ip('link', 'set', 'lo', 'up');
      // A veth pair with both ends inside: an ordinary interface (not every kernel has dummy).
      host.ip('link', 'add', 'host0', 'type', 'veth', 'peer', 'name', 'host1');
      host.ip('addr', 'add', `${address}/32`, 'dev', 'host0');
      for (const end of ['host0', 'host1']) host.ip('link', 'set', end, 'up');
    } catch (error) {
      host.close();
      throw error;
    }
    return host;
  }

  /** `ip` inside the namespace (`addr add 198.18.0.2/32 dev host0`...). */
  ip(...args: string[]): void {
    execFileSync(IP, ['-n', this.name, ...args]);
  }

  /** HTTP services of the host on `ports`, every address; resolves once they listen. */
  async serve(ports: readonly number[]): Promise<void> {
    const child = this.spawn(['-e', SERVICES, ...ports.map(String)]);
    let listening = 0;
    await this.lines(child, (line) => {
      const event = JSON.parse(line) as { listening?: number; port?: number; host?: string };
      if (event.listening !== undefined) listening++;
      else this.served.push({ port: event.port!, host: event.host ?? '' });
      return listening === ports.length;
    });
  }

  /** Loopback ports of this process that reach `ports` on the namespace's loopback. */
  async forward(ports: readonly number[]): Promise<number[]> {
    const child = this.spawn(['-e', RELAY, this.sockets, ...ports.map(String)]);
    let ready = 0;
    await this.lines(child, () => ++ready === ports.length);
    return Promise.all(
      ports.map(async (port) => {
        const server = net.createServer((client) => {
          const inside = net.connect(path.join(this.sockets, `${port}.sock`));
          client.on('error', () => inside.destroy());
          inside.on('error', () => client.destroy());
          client.pipe(inside).pipe(client);
        });
        this.forwarders.push(server);
        await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
        return (server.address() as net.AddressInfo).port;
      }),
    );
  }

  close(): void {
    for (const server of this.forwarders) server.close();
    for (const child of this.children) child.kill('SIGKILL');
    try {
      execFileSync(IP, ['netns', 'delete', this.name], { stdio: 'ignore' });
    } catch {
      // Already gone.
    }
    rmSync(this.sockets, { recursive: true, force: true });
  }

  private spawn(args: string[]): ChildProcess {
    const child = spawn(
      NSENTER,
      [`--net=/run/netns/${this.name}`, '--', process.execPath, ...args],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    this.children.push(child);
    return child;
  }

  /** Feeds every stdout line to `ready`; resolves when it first says so (within 10 s). */
  private lines(child: ChildProcess, ready: (line: string) => boolean): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('not ready within 10 s')), 10_000);
      let buffered = '';
      let done = false;
      child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
        buffered += chunk;
        for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
          const line = buffered.slice(0, nl);
          buffered = buffered.slice(nl + 1);
          // Every line is read, also after the one that said ready.
          if (ready(line) && !done) {
            done = true;
            clearTimeout(timer);
            resolve();
          }
        }
      });
      child.once('exit', (code) => {
        clearTimeout(timer);
        if (!done) reject(new Error(`exited (${code}) before it was ready`));
      });
    });
  }
}
