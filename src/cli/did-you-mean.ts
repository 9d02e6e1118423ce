/**
 * The one suggestion for a misspelt name, shared by unknown MOAT_* variables and unknown flags,
 * so both are told the same way what was probably meant.
 */

/** Edits (insert, delete, replace) between two short strings. */
function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++)
      next[j] = Math.min(
        row[j]! + 1,
        next[j - 1]! + 1,
        row[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    row = next;
  }
  return row[b.length]!;
}

/**
 * The known name closest to `given`, when it is a few edits away (at most 3, and at most a
 * third of `given`'s length, so a short name is not matched to an unrelated one).
 */
export function didYouMean(given: string, known: readonly string[]): string | undefined {
  const [closest] = known
    .map((name) => ({ name, distance: editDistance(given, name) }))
    .sort((a, b) => a.distance - b.distance);
  const allowed = Math.min(3, Math.floor(given.length / 3));
  return closest && closest.distance <= allowed ? closest.name : undefined;
}
