/**
 * The agent socket's folder (/run/moat for a Moat run as root) holds one socket per data folder
 * that ever ran. A Moat killed before it closed its socket leaves the file; the next Moat to
 * listen there removes such dead ones, and nothing a live Moat (or a starting one) holds.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { AgentSocket } from '../../src/runtime/agent-socket.js';

const name = (digit: string) => `agents-${digit.repeat(16)}.sock`;
const TWO_MINUTES_AGO = new Date(Date.now() - 120_000);

/** A socket file whose process was SIGKILLed while listening: nobody listens there now. */
async function deadSocket(file: string): Promise<void> {
  const child = spawn(process.execPath, [
    '-e',
    `require('node:net').createServer().listen(${JSON.stringify(file)}, () => console.log('up'))`,
  ]);
  await new Promise((resolve) => child.stdout.once('data', resolve));
  child.kill('SIGKILL');
  await new Promise((resolve) => child.once('close', resolve));
}

const connects = (file: string) =>
  new Promise<boolean>((resolve) => {
    const socket = net.connect(file, () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });

describe('AgentSocket.listen', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'moat-agents-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it("removes dead Moats' agent sockets beside its own, and nothing else", async () => {
    const deadOld = path.join(dir, name('a'));
    const deadYoung = path.join(dir, name('b'));
    const liveOld = path.join(dir, name('c'));
    const otherName = path.join(dir, 'other.sock');
    const plainFile = path.join(dir, name('d'));
    await deadSocket(deadOld);
    await deadSocket(deadYoung);
    await deadSocket(otherName);
    const live = net.createServer((socket) => socket.destroy());
    await new Promise<void>((resolve) => live.listen(liveOld, resolve));
    writeFileSync(plainFile, 'not a socket');
    for (const file of [deadOld, liveOld, otherName, plainFile]) {
      utimesSync(file, TWO_MINUTES_AGO, TWO_MINUTES_AGO);
    }
    try {
      const own = await AgentSocket.listen(path.join(dir, name('e')));
      expect(existsSync(deadOld), 'a dead socket of two minutes ago').toBe(false);
      // Just bound, perhaps not listening yet: a Moat that is starting.
      expect(existsSync(deadYoung), 'a dead socket made just now').toBe(true);
      expect(existsSync(liveOld), 'a socket a live Moat listens on').toBe(true);
      expect(await connects(liveOld)).toBe(true);
      expect(existsSync(otherName), 'a socket not named as an agent socket').toBe(true);
      expect(existsSync(plainFile), 'a file that is not a socket').toBe(true);
      expect(await connects(own.path)).toBe(true);
      await own.close();
      expect(existsSync(own.path)).toBe(false);
    } finally {
      await new Promise((resolve) => live.close(resolve));
    }
  });
});
