import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  FlowFileSink,
  type FlowRecord,
  flowView,
  MAX_PENDING_BYTES,
} from '../../src/flows/index.js';

const record = (i: number, pad = 0): FlowRecord => ({
  time: 1_800_000_000_000 + i,
  id: i,
  event: 'decision',
  sandboxID: 'isinktest',
  node: 'n',
  kind: 'connect',
  destination: { name: `h${i}.${'x'.repeat(pad)}.test`, address: null, port: 443, protocol: 'tcp' },
  verdict: 'deny',
  list: 'denyOut',
  rule: '0.0.0.0/0',
  reason: 'r',
  bytesUp: undefined,
  bytesDown: undefined,
  durationMs: undefined,
  end: undefined,
});

const lines = (file: string) =>
  existsSync(file)
    ? readFileSync(file, 'utf8')
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as { id: number })
    : [];

describe('the flow log file', () => {
  let dir: string;
  let file: string;
  let dropped: number;
  let errors: Error[];
  const openSink = (maxBytes: number) =>
    FlowFileSink.open(
      file,
      maxBytes,
      () => dropped++,
      (error) => errors.push(error),
    );

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'moat-flow-log-'));
    file = path.join(dir, 'flows.jsonl');
    dropped = 0;
    errors = [];
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('names the file it cannot open', async () => {
    file = path.join(dir, 'no-such-folder', 'flows.jsonl');
    await expect(openSink(1000)).rejects.toThrow(`--flow-log ${file}`);
  });

  it('appends one JSON line per record, as the API shows it', async () => {
    const sink = await openSink(1 << 20);
    for (let i = 1; i <= 3; i++) sink.add(record(i));
    await sink.close();
    const written = readFileSync(file, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(written).toEqual([1, 2, 3].map((i) => flowView(record(i))));
    expect(statSync(file).mode & 0o777).toBe(0o600);
  });

  it('rotates at the size bound, keeping the newest lines in the file', async () => {
    const sink = await openSink(2000);
    // One at a time, each in the file before the next is added: every write sees the size
    // bound (a batch, which a busy host makes of several records, may pass it by its length).
    const written = (id: number) =>
      [file, `${file}.1`].some((f) => existsSync(f) && lines(f).some((l) => l.id === id));
    for (let i = 1; i <= 40; i++) {
      sink.add(record(i));
      for (let wait = 0; !written(i) && wait < 500; wait++)
        await new Promise((r) => setTimeout(r, 2));
    }
    await sink.close();
    const current = lines(file);
    const previous = lines(`${file}.1`);
    expect(previous.length).toBeGreaterThan(0);
    expect(statSync(file).size).toBeLessThan(2000 + 400);
    expect(statSync(`${file}.1`).size).toBeLessThan(2000 + 400);
    // The newest lines are in the file, each once, in order, after those of FILE.1.
    const ids = [...previous, ...current].map((l) => l.id);
    expect(ids).toEqual([...ids].sort((a, b) => a - b));
    expect(ids.at(-1)).toBe(40);
    expect(new Set(ids).size).toBe(ids.length);
    expect(dropped).toBe(0);
    expect(errors).toEqual([]);
  });

  it('never makes the caller wait: a burst beyond the queue is dropped and counted', async () => {
    const sink = await openSink(1 << 30);
    const count = 50_000;
    // About 1 KiB each: 50 MB asked for in one synchronous burst, far past the 4 MiB queue.
    const started = performance.now();
    for (let i = 0; i < count; i++) sink.add(record(i, 900));
    const burstMs = performance.now() - started;
    expect(dropped).toBeGreaterThan(count - (MAX_PENDING_BYTES / 900) * 1.1);
    await sink.close();
    const kept = lines(file);
    expect(kept.length + dropped).toBe(count);
    // What was kept is the start of the burst, in order.
    expect(kept.map((l) => l.id)).toEqual(kept.map((_, i) => i));
    console.log(`flow log burst: ${count} adds in ${burstMs.toFixed(0)} ms, ${dropped} dropped`);
  });
});
