/**
 * Ports of a rule: `:443`, `:8000-8100`. A rule without a port covers every port (E2B's
 * meaning); a rule with one covers only those. Per destination, the port-scoped rules of one
 * list are kept as a `PortTable`: sorted, disjoint ranges, each with the decision of a rule.
 */

/** An inclusive range of ports, 1-65535, `from <= to`. */
export interface PortRange {
  readonly from: number;
  readonly to: number;
}

export const formatPorts = (ports: PortRange): string =>
  ports.from === ports.to ? `${ports.from}` : `${ports.from}-${ports.to}`;

/** The union of some ranges as few disjoint ones, in port order. */
export function mergePorts(ranges: readonly PortRange[]): PortRange[] {
  const sorted = [...ranges].sort((a, b) => a.from - b.from);
  const merged: Array<{ from: number; to: number }> = [];
  for (const { from, to } of sorted) {
    const last = merged[merged.length - 1];
    if (last !== undefined && from <= last.to + 1) last.to = Math.max(last.to, to);
    else merged.push({ from, to });
  }
  return merged;
}

/**
 * Port ranges with a value each, for one destination of one list. Where ranges overlap, the one
 * given first keeps its ports. Looked up by binary search.
 */
export class PortTable<T> {
  // The first segment in fields of its own: most tables hold one (`:443`), and a lookup then
  // reads this object only.
  private readonly firstFrom: number;
  private readonly firstTo: number;
  private readonly firstValue: T | undefined;
  /** The value of the first range given, which keeps its ports (see `first`). */
  private readonly preferred: T | undefined;
  private readonly from: Uint16Array;
  private readonly to: Uint16Array;
  private readonly values: T[];

  /** `ranges` in order of preference: an earlier range keeps ports a later one repeats. */
  constructor(ranges: ReadonlyArray<{ readonly ports: PortRange; readonly value: T }>) {
    const segments = ownedSegments(ranges.map((range) => range.ports));
    this.from = Uint16Array.from(segments, (s) => s.from);
    this.to = Uint16Array.from(segments, (s) => s.to);
    this.values = segments.map((s) => ranges[s.owner]!.value);
    // An empty table: a range no port is in.
    this.firstFrom = segments[0]?.from ?? 1;
    this.firstTo = segments[0]?.to ?? 0;
    this.firstValue = this.values[0];
    this.preferred = ranges[0]?.value;
  }

  /** The value whose range holds `port`, if any. */
  lookup(port: number): T | undefined {
    if (port <= this.firstTo) return port >= this.firstFrom ? this.firstValue : undefined;
    let low = 1;
    let high = this.from.length - 1;
    while (low <= high) {
      const middle = (low + high) >>> 1;
      if (this.from[middle]! > port) high = middle - 1;
      else if (this.to[middle]! < port) low = middle + 1;
      else return this.values[middle];
    }
    return undefined;
  }

  /**
   * For a question without a port: the value of the first range given (the most specific rule,
   * for a network's table merged with those around it), which some port always keeps.
   */
  get first(): T | undefined {
    return this.preferred;
  }

  /** The table's ranges in port order, each with its value. */
  ranges(): Array<{ ports: PortRange; value: T }> {
    return this.values.map((value, i) => ({
      ports: { from: this.from[i]!, to: this.to[i]! },
      value,
    }));
  }
}

/**
 * Disjoint segments covering the union of `ranges`, each owned by the first range (lowest
 * index) holding it: a sweep over the ranges' ends with a heap of the open ranges by index, so
 * many ranges on one destination cost O(n log n), not O(n^2).
 */
function ownedSegments(
  ranges: readonly PortRange[],
): Array<{ from: number; to: number; owner: number }> {
  const byStart = ranges.map((_, i) => i).sort((a, b) => ranges[a]!.from - ranges[b]!.from);
  const points = [...new Set(ranges.flatMap((r) => [r.from, r.to + 1]))].sort((a, b) => a - b);
  const open: number[] = [];
  const segments: Array<{ from: number; to: number; owner: number }> = [];
  let next = 0;
  for (let j = 0; j + 1 < points.length; j++) {
    const from = points[j]!;
    while (next < byStart.length && ranges[byStart[next]!]!.from <= from)
      heapPush(open, byStart[next++]!);
    while (open.length > 0 && ranges[open[0]!]!.to < from) heapPop(open);
    if (open.length === 0) continue;
    const owner = open[0]!;
    const to = points[j + 1]! - 1;
    const last = segments[segments.length - 1];
    if (last !== undefined && last.owner === owner && last.to + 1 === from) last.to = to;
    else segments.push({ from, to, owner });
  }
  return segments;
}

/** A binary min-heap of range indexes. */
function heapPush(heap: number[], value: number): void {
  heap.push(value);
  let i = heap.length - 1;
  while (i > 0) {
    const parent = (i - 1) >>> 1;
    if (heap[parent]! <= value) break;
    heap[i] = heap[parent]!;
    i = parent;
  }
  heap[i] = value;
}

function heapPop(heap: number[]): void {
  const last = heap.pop()!;
  if (heap.length === 0) return;
  let i = 0;
  for (;;) {
    const left = 2 * i + 1;
    if (left >= heap.length) break;
    const child = left + 1 < heap.length && heap[left + 1]! < heap[left]! ? left + 1 : left;
    if (heap[child]! >= last) break;
    heap[i] = heap[child]!;
    i = child;
  }
  heap[i] = last;
}
