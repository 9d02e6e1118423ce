/** Markdown tables and number formatting for benchmark reports. */
import { percentile } from './timing.js';

export type Align = 'left' | 'right';

/** Renders a Markdown table with padded columns, so it reads well both raw and rendered. */
export function markdownTable(
  headers: readonly string[],
  rows: ReadonlyArray<readonly string[]>,
  align: readonly Align[] = headers.map((_, i) => (i === 0 ? 'left' : 'right')),
): string {
  const widths = headers.map((header, i) =>
    Math.max(3, header.length, ...rows.map((row) => (row[i] ?? '').length)),
  );
  const pad = (text: string, i: number) =>
    align[i] === 'right' ? text.padStart(widths[i]!) : text.padEnd(widths[i]!);
  const line = (cells: readonly string[]) =>
    `| ${headers.map((_, i) => pad(cells[i] ?? '', i)).join(' | ')} |`;
  const rule = `| ${widths
    .map((width, i) => (align[i] === 'right' ? `${'-'.repeat(width - 1)}:` : '-'.repeat(width)))
    .join(' | ')} |`;
  return [line(headers), rule, ...rows.map(line)].join('\n');
}

/** 1234 -> "1,234". */
export const formatInt = (n: number): string =>
  Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : String(n);

/** Three significant digits with an SI suffix: 2.35M, 845k, 9.87k, 512. */
export function formatSi(n: number): string {
  if (!Number.isFinite(n)) return String(n);
  const abs = Math.abs(n);
  const [scale, suffix] =
    abs >= 1e9 ? [1e9, 'G'] : abs >= 1e6 ? [1e6, 'M'] : abs >= 1e3 ? [1e3, 'k'] : [1, ''];
  const value = n / scale;
  const digits = Math.abs(value) >= 100 ? 0 : Math.abs(value) >= 10 ? 1 : 2;
  return `${value.toFixed(scale === 1 && Number.isInteger(n) ? 0 : digits)}${suffix}`;
}

/** A ratio as "123x", "4.5x", "0.82x". */
export function formatRatio(ratio: number): string {
  if (!Number.isFinite(ratio)) return String(ratio);
  const digits = ratio >= 100 ? 0 : ratio >= 10 ? 1 : 2;
  return `${ratio.toFixed(digits)}x`;
}

/** Milliseconds with sensible precision. */
export function formatMs(ms: number): string {
  if (!Number.isFinite(ms)) return String(ms);
  return ms >= 100
    ? ms.toFixed(0)
    : ms >= 10
      ? ms.toFixed(1)
      : ms >= 1
        ? ms.toFixed(2)
        : ms.toFixed(3);
}

/** Bytes as MB (10^6) with sensible precision, or kB below 0.1 MB. */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes)) return String(bytes);
  if (Math.abs(bytes) < 1e5) return `${(bytes / 1e3).toFixed(1)} kB`;
  const mb = bytes / 1e6;
  return `${mb >= 100 ? mb.toFixed(0) : mb >= 10 ? mb.toFixed(1) : mb.toFixed(2)} MB`;
}

/**
 * One row of a Moat-vs-peer latency table: the `q` percentile of each and their ratio,
 * milliseconds in, milliseconds out.
 */
export function percentileRow(
  label: string,
  moat: readonly number[],
  peer: readonly number[],
  q: number,
): string[] {
  const [mine, theirs] = [percentile(moat, q), percentile(peer, q)];
  return [label, `${formatMs(mine)} ms`, `${formatMs(theirs)} ms`, formatRatio(mine / theirs)];
}
