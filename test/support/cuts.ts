/**
 * Where a stream of `length` bytes is cut, from arbitrary numbers (a property test's input):
 * the distinct cut positions in order, and the [from, to) bounds of the pieces they make.
 */
export function cutStream(
  length: number,
  cuts: readonly number[],
): { positions: number[]; bounds: Array<[number, number]> } {
  const positions = [...new Set(cuts.map((c) => c % (length + 1)))].sort((a, b) => a - b);
  const bounds: Array<[number, number]> = [];
  let last = 0;
  for (const at of [...positions, length]) {
    bounds.push([last, at]);
    last = at;
  }
  return { positions, bounds };
}
