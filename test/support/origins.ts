/** Origin servers on loopback for proxy tests: HTTP echo, TLS echo, raw TCP echo. */
import { createHash } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { testCertificate } from '../../bench/lib/certificate.js';
import type { HostPort } from '../../src/net/index.js';

export { testCertificate };

export interface Origin {
  readonly host: string;
  readonly port: number;
  close(): Promise<void>;
}

const listen = (server: net.Server, host: string, port = 0): Promise<number> =>
  new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve((server.address() as net.AddressInfo).port));
  });

const closer = (server: net.Server) => () =>
  new Promise<void>((resolve) => {
    (server as http.Server).closeAllConnections?.();
    server.close(() => resolve());
  });

/**
 * Reads a request's whole body; resolves its length and SHA-256 (hex). A request the client
 * aborts never settles (there is nobody left to answer).
 */
export function bodyDigest(req: http.IncomingMessage): Promise<{ length: number; sha256: string }> {
  return new Promise((resolve) => {
    const hash = createHash('sha256');
    let length = 0;
    req.on('data', (chunk: Buffer) => {
      hash.update(chunk);
      length += chunk.length;
    });
    req.on('end', () => resolve({ length, sha256: hash.digest('hex') }));
  });
}

/** Answers every request with JSON naming the Host header, method, path and headers it saw. */
export async function httpEchoOrigin(
  host: string,
  port = 0,
): Promise<Origin & { readonly requests: http.IncomingHttpHeaders[] }> {
  const requests: http.IncomingHttpHeaders[] = [];
  const server = http.createServer((req, res) => {
    requests.push(req.headers);
    let body = '';
    req.on('data', (chunk) => {
      body += chunk;
    });
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          host: req.headers.host,
          method: req.method,
          path: req.url,
          headers: req.headers,
          body,
        }),
      );
    });
  });
  // A WebSocket upgrade is agreed to, and the connection then echoes what it is sent.
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    requests.push(req.headers);
    socket.on('error', () => socket.destroy());
    const accept = createHash('sha1')
      .update(`${req.headers['sec-websocket-key']}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`)
      .digest('base64');
    socket.write(
      'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
        `Sec-WebSocket-Accept: ${accept}\r\n\r\n`,
    );
    socket.write(head);
    socket.pipe(socket);
  });
  return { host, port: await listen(server, host, port), close: closer(server), requests };
}

/** TLS server that echoes what it receives, after writing the SNI it was given and a newline. */
export async function tlsEchoOrigin(
  host: string,
  port = 0,
  options: { helloRetry?: boolean } = {},
): Promise<Origin> {
  // Clients offer an X25519 key share first; a server that takes only P-384 asks again
  // (a TLS 1.3 HelloRetryRequest).
  const groups = options.helloRetry ? { ecdhCurve: 'P-384' } : {};
  const server = tls.createServer({ ...testCertificate(), ...groups }, (socket) => {
    socket.write(`sni=${(socket as tls.TLSSocket & { servername?: string }).servername ?? ''}\n`);
    socket.pipe(socket);
    socket.on('error', () => socket.destroy());
  });
  return { host, port: await listen(server, host, port), close: closer(server) };
}

/** Raw TCP echo. With `banner`, speaks first (like SSH). */
export async function tcpEchoOrigin(host: string, banner?: string): Promise<Origin> {
  const server = net.createServer((socket) => {
    socket.on('error', () => socket.destroy());
    if (banner) socket.write(banner);
    socket.pipe(socket);
  });
  return { host, port: await listen(server, host), close: closer(server) };
}

/** Opens a CONNECT tunnel; resolves with the socket and the status line and headers. */
export function connectThrough(
  proxy: HostPort,
  authority: string,
  options: { localAddress?: string; auth?: string; headers?: Record<string, string> } = {},
): Promise<{ socket: net.Socket; status: number; head: string; body: string }> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({
      host: proxy.host,
      port: proxy.port,
      localAddress: options.localAddress,
    });
    let received = Buffer.alloc(0);
    socket.once('error', reject);
    socket.on('connect', () => {
      const auth = options.auth
        ? `Proxy-Authorization: Basic ${Buffer.from(options.auth).toString('base64')}\r\n`
        : '';
      const extra = Object.entries(options.headers ?? {})
        .map(([k, v]) => `${k}: ${v}\r\n`)
        .join('');
      socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${auth}${extra}\r\n`);
    });
    const onData = (chunk: Buffer) => {
      received = Buffer.concat([received, chunk]);
      const end = received.indexOf('\r\n\r\n');
      if (end < 0) return;
      const head = received.subarray(0, end).toString('latin1');
      const status = Number(head.split(' ')[1]);
      const rest = received.subarray(end + 4);
      if (status === 200) {
        // Paused before handing over, so bytes that came with the 200 wait for the next reader.
        socket.pause();
        socket.off('data', onData);
        if (rest.length > 0) socket.unshift(rest);
        return resolve({ socket, status, head, body: '' });
      }
      const length = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
      if (rest.length < length) return;
      socket.off('data', onData);
      resolve({ socket, status, head, body: rest.subarray(0, length).toString('utf8') });
    };
    socket.on('data', onData);
    socket.on('close', () => resolve({ socket, status: 0, head: '', body: '' }));
  });
}

/** Reads from a socket until `predicate` holds on everything read, or the timeout. */
export function readUntil(
  socket: net.Socket,
  predicate: (text: string) => boolean,
  timeoutMs = 3000,
): Promise<string> {
  return new Promise((resolve) => {
    let text = '';
    const done = () => {
      clearTimeout(timer);
      socket.off('data', onData);
      resolve(text);
    };
    const timer = setTimeout(done, timeoutMs);
    const onData = (chunk: Buffer) => {
      text += chunk.toString('latin1');
      if (predicate(text)) done();
    };
    socket.on('data', onData);
    socket.once('close', done);
    socket.resume();
  });
}
