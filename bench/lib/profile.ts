/** Summary of a V8 CPU profile (`node --cpu-prof`), for the benchmarks' --profile option. */
import { readFileSync } from 'node:fs';
import { formatMs, markdownTable } from './table.js';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}

/** Self time by function and by script, and inclusive time of the hottest project functions. */
export function summariseProfile(path: string, topFunctions = 30): string {
  const profile = JSON.parse(readFileSync(path, 'utf8')) as {
    nodes: ProfileNode[];
    samples: number[];
    timeDeltas: number[];
  };
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const node of profile.nodes)
    for (const child of node.children ?? []) parent.set(child, node.id);
  const selfUs = new Map<number, number>();
  profile.samples.forEach((id, i) => {
    selfUs.set(id, (selfUs.get(id) ?? 0) + Math.max(0, profile.timeDeltas[i] ?? 0));
  });
  const where = (frame: ProfileNode['callFrame']) =>
    frame.url.replace(/^file:\/\/.*?\/(dist|node_modules)\//, '$1/').replace(/^node:/, 'node:') ||
    '(native)';
  const nameOf = (frame: ProfileNode['callFrame']) =>
    `${frame.functionName || '(anonymous)'} ${where(frame)}:${frame.lineNumber + 1}`;
  const byFunction = new Map<string, number>();
  const byFile = new Map<string, number>();
  /** Inclusive time of functions in Moat's own code (dist/src), each counted once per sample. */
  const inclusive = new Map<string, number>();
  let total = 0;
  let idle = 0;
  for (const [id, us] of selfUs) {
    const frame = byId.get(id)!.callFrame;
    if (frame.functionName === '(idle)') {
      idle += us;
      continue;
    }
    total += us;
    byFunction.set(nameOf(frame), (byFunction.get(nameOf(frame)) ?? 0) + us);
    const file = frame.url === '' ? frame.functionName : where(frame);
    byFile.set(file, (byFile.get(file) ?? 0) + us);
    const seen = new Set<string>();
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const f = byId.get(at)!.callFrame;
      if (!f.url.includes('/dist/src/')) continue;
      const name = nameOf(f);
      if (seen.has(name)) continue;
      seen.add(name);
      inclusive.set(name, (inclusive.get(name) ?? 0) + us);
    }
  }
  const top = (map: Map<string, number>, n: number) =>
    [...map]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(([name, us]) => [`${((100 * us) / total).toFixed(1)}%`, formatMs(us / 1000), name]);
  return [
    `Busy ${formatMs(total / 1000)} ms, idle ${formatMs(idle / 1000)} ms.`,
    '',
    'Self time by function (share of busy time):',
    '',
    markdownTable(['self', 'ms', 'function'], top(byFunction, topFunctions), [
      'right',
      'right',
      'left',
    ]),
    '',
    'Self time by script:',
    '',
    markdownTable(['self', 'ms', 'script'], top(byFile, 20), ['right', 'right', 'left']),
    '',
    "Inclusive time of Moat's own functions (dist/src; share of busy time):",
    '',
    markdownTable(['total', 'ms', 'function'], top(inclusive, 20), ['right', 'right', 'left']),
  ].join('\n');
}
