/**
 * The flow table: the newest MAX_ROWS records matching the filters, newest on top. A flow's
 * close record is folded into its decision's row (bytes, duration, how it ended) when that row
 * is still shown; otherwise it gets a row of its own.
 */
import { el, formatBytes, formatTime } from './dom.js';

/** Rows kept: the oldest go when more arrive. */
export const MAX_ROWS = 1000;

const text = (value) => (typeof value === 'string' ? value : value == null ? '' : String(value));

/**
 * `name:port` as asked, the dialled address after it when it differs, and the method and path
 * of a request a destination's rules decided.
 */
function destinationCell(destination, request) {
  const d = destination ?? {};
  const port = d.port == null ? '' : `:${d.port}`;
  const asked = d.name ?? d.address ?? '?';
  const cell = el('td', { class: 'destination', title: `${text(asked)}${port}` });
  cell.append(el('span', { class: 'dest-name' }, `${text(asked)}${port}`));
  if (d.name != null && d.address != null)
    cell.append(el('span', { class: 'dest-address' }, text(d.address)));
  if (request != null)
    cell.append(
      el('span', { class: 'dest-request' }, `${text(request.method)} ${text(request.path)}`),
    );
  cell.append(el('span', { class: 'dest-protocol' }, text(d.protocol)));
  return cell;
}

function bytesCell(record) {
  if (record.event !== 'close' && record.bytesUp === undefined)
    return el('td', { class: 'bytes muted', title: 'open, or nothing to count' }, '–');
  const how = [record.end, record.durationMs == null ? null : `${record.durationMs} ms`]
    .filter(Boolean)
    .join(', ');
  return el(
    'td',
    { class: 'bytes', title: how },
    el('span', {}, `↑ ${formatBytes(record.bytesUp ?? 0)}`),
    el('span', {}, `↓ ${formatBytes(record.bytesDown ?? 0)}`),
  );
}

/** One row's cells for a record (a decision with its close folded in, or a lone close). */
function cells(record, onSandbox) {
  const sandbox = el('button', { type: 'button', class: 'link', title: 'Show this sandbox' });
  sandbox.textContent = text(record.sandboxID);
  sandbox.addEventListener('click', () => onSandbox(text(record.sandboxID)));
  const deny = record.verdict === 'deny';
  // A report-mode sandbox's flow its rules would have denied: let through, and said so.
  const would = typeof record.wouldDeny === 'object' && record.wouldDeny !== null;
  return [
    el('td', { class: 'time', title: text(record.time) }, formatTime(record.time)),
    el('td', { class: 'sandbox-cell' }, sandbox),
    el(
      'td',
      { class: 'kind' },
      text(record.kind),
      record.event === 'close' && record.closeOnly
        ? el('span', { class: 'kind-close muted' }, ' close')
        : null,
    ),
    destinationCell(record.destination, record.request),
    el(
      'td',
      {},
      el('span', { class: `verdict ${deny ? 'deny' : 'allow'}` }, text(record.verdict)),
      would ? el('span', { class: 'verdict would-deny' }, 'would deny') : null,
    ),
    el(
      'td',
      { class: 'rule', title: text(record.reason) },
      would
        ? el(
            'span',
            { class: 'decided' },
            el('span', { class: 'list' }, `report: would deny by ${text(record.wouldDeny.list)}`),
            record.wouldDeny.rule == null ? null : el('code', {}, text(record.wouldDeny.rule)),
          )
        : el(
            'span',
            { class: 'decided' },
            el('span', { class: 'list' }, text(record.list)),
            record.rule == null ? null : el('code', {}, text(record.rule)),
          ),
      el('span', { class: 'reason' }, text(record.reason)),
    ),
    bytesCell(record),
  ];
}

export class FlowTable {
  /** `body` is the table's tbody; `onSandbox(id)` runs when a row's sandbox is clicked. */
  constructor(body, onSandbox) {
    this.body = body;
    this.onSandbox = onSandbox;
    /** `${node}/${id}` -> { tr, record }, oldest first (Map keeps insertion order). */
    this.rows = new Map();
  }

  clear() {
    this.rows.clear();
    this.body.replaceChildren();
  }

  get size() {
    return this.rows.size;
  }

  /** Adds a record on top (a close updates its decision's row where it is shown). */
  add(record) {
    if (record === null || typeof record !== 'object') return;
    const key = `${text(record.node)}/${text(record.id)}`;
    const shown = this.rows.get(key);
    if (record.event === 'close' && shown !== undefined) {
      // The decision row now tells the whole flow: the close's verdict (a policy change may
      // have ended it), bytes, duration and end.
      const merged = { ...shown.record, ...record, event: 'decision', closeOnly: false };
      merged.destination = record.destination ?? shown.record.destination;
      this.paint(shown.tr, merged);
      shown.record = merged;
      return;
    }
    if (shown !== undefined) return;
    const row = { ...record, closeOnly: record.event === 'close' };
    const tr = el('tr', {});
    this.paint(tr, row);
    this.body.prepend(tr);
    this.rows.set(key, { tr, record: row });
    while (this.rows.size > MAX_ROWS) {
      const [oldest, { tr: old }] = this.rows.entries().next().value;
      old.remove();
      this.rows.delete(oldest);
    }
  }

  paint(tr, record) {
    const would = typeof record.wouldDeny === 'object' && record.wouldDeny !== null;
    tr.className =
      record.verdict === 'deny' ? 'flow deny' : would ? 'flow allow would-deny' : 'flow allow';
    tr.dataset.kind = text(record.kind);
    tr.dataset.verdict = text(record.verdict);
    tr.replaceChildren(...cells(record, this.onSandbox));
  }
}
