/**
 * Moat's own file descriptors: a real `moat serve` whose open-file limit is lowered (prlimit)
 * keeps a reserve no sandbox connection can take, so /health answers while connections flood
 * its proxy; and it says at start that the limit is too low.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  openFileLimit,
  openFileWarning,
  sandboxConnectionShare,
} from '../../src/app/open-files.js';
import { FakeDns } from '../support/fake-dns.js';
import { loopbackServeArgs, ServeChild } from '../support/serve-child.js';

const LIMIT = 600;
const RESERVE = 250;
const PER_SOURCE = 20;
const SOURCES = 40;

const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-open-files-'));
const zone = new FakeDns(new Map());

beforeAll(async () => {
  await zone.start();
});

afterAll(async () => {
  await ServeChild.killAll();
  await zone.stop();
  rmSync(scratch, { recursive: true, force: true });
});

describe('the open-file limit', () => {
  it('is read from /proc/self/limits (soft), unlimited or unreadable being no limit', async () => {
    const file = path.join(scratch, 'limits');
    writeFileSync(
      file,
      'Limit                     Soft Limit           Hard Limit           Units\n' +
        'Max open files            4096                 524288               files\n',
    );
    expect(await openFileLimit(file)).toBe(4096);
    writeFileSync(
      file,
      'Max open files            unlimited            unlimited            files\n',
    );
    expect(await openFileLimit(file)).toBeUndefined();
    expect(await openFileLimit(path.join(scratch, 'none'))).toBeUndefined();
    expect(typeof (await openFileLimit())).toBe('number');
  });

  it('leaves sandboxes half of what is beyond the reserve, and warns when that is few sandboxes', () => {
    expect(sandboxConnectionShare(10_000, 1000)).toBe(4500);
    expect(sandboxConnectionShare(500, 1000)).toBe(0);
    expect(sandboxConnectionShare(undefined, 1000)).toBe(Infinity);
    expect(openFileWarning(1_048_576, 1024, 256)).toBeUndefined();
    expect(openFileWarning(1024, 1024, 256)).toMatch(/open-file limit \(1024\).*0 sandboxes/);
  });
});

// Node's sockets (where, without the reserve, /health was dropped at EMFILE) and the native relay.
it.each(['node', 'auto'])(
  `keeps /health answering within 1 s while ${SOURCES * PER_SOURCE} connections flood a Moat limited to ${LIMIT} open files (proxy io %s)`,
  async (io) => {
    const child = new ServeChild(
      loopbackServeArgs(path.join(scratch, `data-${io}`), zone.port, [
        ...['--fd-reserve', String(RESERVE), '--proxy-max-tunnels', String(PER_SOURCE)],
        ...['--proxy-io', io],
      ]),
      {},
      undefined,
      ['prlimit', `--nofile=${LIMIT}:${LIMIT}`, '--'],
    );
    const at = await child.started();
    const warned = child.logLines().find((line) => /open-file limit/.test(line.msg ?? ''));
    expect(warned?.limit).toBe(LIMIT);
    const [host, port] = [at.proxy.replace(/:\d+$/, ''), Number(/:(\d+)$/.exec(at.proxy)![1])];
    const sockets: net.Socket[] = [];
    try {
      // Bounded: SOURCES x PER_SOURCE connections that never send a byte, each source within its
      // own budget, together well past what the limit holds.
      for (let source = 1; source <= SOURCES; source++)
        sockets.push(
          ...(await Promise.all(
            Array.from(
              { length: PER_SOURCE },
              () =>
                new Promise<net.Socket>((resolve) => {
                  const socket = net.connect({ host, port, localAddress: `127.0.6.${source}` });
                  socket.on('error', () => socket.destroy());
                  socket.once('connect', () => resolve(socket));
                  socket.once('close', () => resolve(socket));
                }),
            ),
          )),
        );
      const started = performance.now();
      const status = await new Promise<number>((resolve, reject) => {
        const request = http.get({
          host: '127.0.0.1',
          port: Number(at.api.split(':')[1]),
          path: '/health',
          agent: false,
          timeout: 1000,
        });
        request.on('response', (response) => {
          response.resume();
          resolve(response.statusCode ?? 0);
        });
        request.on('timeout', () => request.destroy(new Error('/health: no answer within 1 s')));
        request.on('error', reject);
      });
      expect(status).toBe(200);
      expect(performance.now() - started).toBeLessThan(1000);
      // Sandboxes' share: half of what the limit leaves beyond the reserve (once Moat has
      // taken, and refused, what still waited in its listener's backlog).
      await new Promise((resolve) => setTimeout(resolve, 500));
      const open = sockets.filter((s) => !s.destroyed).length;
      expect(open).toBeLessThanOrEqual(sandboxConnectionShare(LIMIT, RESERVE));
      const refused = child
        .logLines()
        .find(
          (line) =>
            line.msg === 'connection refused: over budget' && line.resource === 'file_descriptors',
        );
      expect(refused, child.output()).toBeDefined();
    } finally {
      for (const socket of sockets) socket.destroy();
      // A clean stop unmounts what it mounted in its data folder.
      await child.stop('SIGTERM');
    }
  },
  30_000,
);
