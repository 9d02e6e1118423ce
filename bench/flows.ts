/**
 * `npm run bench:flows`: what the flow store costs. Fills a store of the default size (100,000)
 * through the recorder, as the DNS interceptor and the proxy do (a fresh name string per record,
 * like a parsed query), and prints the memory retained per record and the records per second the
 * recorder takes once the ring is full (each one pushing the oldest out). Nothing here touches
 * the network.
 */
import { pino } from 'pino';
import { type FlowDecision, FlowRecorder, FlowStore } from '../src/flows/index.js';
import { MoatMetrics } from '../src/metrics/index.js';
import { fullGc, reexecWithExposedGc, retainedNow } from './lib/gc.js';

const SIZE = 100_000;
const DECISION: FlowDecision = {
  verdict: 'allow',
  list: 'allowOut',
  rule: '*.example.test',
  reason: 'allowed',
};

function record(recorder: FlowRecorder, i: number): void {
  const name = `host-${i % 5000}.api.example.test`;
  if (i % 2 === 0)
    return recorder.decided(
      {
        sandboxID: 'isandbox000000000001',
        kind: 'dns',
        destination: { name, address: null, port: null, protocol: 'udp' },
      },
      DECISION,
    );
  recorder
    .opened(
      {
        sandboxID: 'isandbox000000000001',
        kind: 'connect',
        destination: {
          name,
          address: `198.18.${(i >> 8) & 255}.${i & 255}`,
          port: 443,
          protocol: 'tcp',
        },
      },
      DECISION,
    )
    .closed(1234, 567_890);
}

async function main(): Promise<void> {
  const metrics = new MoatMetrics({ defaultMetrics: false });
  const recorder = new FlowRecorder({
    store: new FlowStore(SIZE),
    metrics,
    logger: pino({ level: 'info' }, pino.destination('/dev/null')),
    node: 'bench-node',
  });
  fullGc();
  const before = retainedNow();
  // Decisions, and connections that make a decision and a close record each.
  for (let i = 0; recorder.store.size < SIZE; i++) record(recorder, i);
  fullGc();
  const perRecord = (retainedNow() - before) / SIZE;
  console.log(`flow store: ${SIZE} records held, ${Math.round(perRecord)} bytes/record retained`);
  const count = 1_000_000;
  const started = performance.now();
  for (let i = 0; i < count; i++) record(recorder, i);
  const seconds = (performance.now() - started) / 1000;
  console.log(
    `recorder with a full ring: ${Math.round(count / seconds).toLocaleString('en')} calls/s (half DNS decisions, half connections with a close)`,
  );
}

if (!(await reexecWithExposedGc())) await main();
