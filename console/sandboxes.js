/**
 * The sandbox list (policy and flow totals of each) and the detail panel of the sandbox picked.
 * Only the fields shown are copied out of the API's answers: tokens such as envdAccessToken and
 * a rule's header values never reach the page.
 */
import { KeyRefused } from './api.js';
import { el, fill, formatBytes, formatCount, formatDateTime } from './dom.js';

/** At most this many sandboxes are shown (and asked about one by one). */
const MAX_SANDBOXES = 200;
/** Detail requests in flight at once. */
const PARALLEL = 6;

const strings = (list) => (Array.isArray(list) ? list.filter((x) => typeof x === 'string') : []);
const count = (n) => (typeof n === 'number' ? n : undefined);

/** What the console shows of a sandbox: its ID, state, policy and flow totals. */
export function sandboxSummary(listed, detail) {
  const network = detail?.network ?? {};
  const flows = detail?.flows ?? {};
  return {
    // The policy is read from the detail: a sandbox gone since it was listed has none to show.
    policyRead: detail !== undefined,
    sandboxID: String(listed.sandboxID),
    name: typeof listed.alias === 'string' ? listed.alias : String(listed.templateID ?? ''),
    state: String(detail?.state ?? listed.state ?? ''),
    startedAt: String(listed.startedAt ?? ''),
    endAt: String(listed.endAt ?? ''),
    allowOut: strings(network.allowOut),
    denyOut: strings(network.denyOut),
    // What each preset:NAME of allowOut stands for (Moat's network.presets).
    presets: (Array.isArray(network.presets) ? network.presets : [])
      .filter((p) => p && typeof p.name === 'string')
      .map((p) => `preset:${p.name} v${Number(p.version)}: ${strings(p.entries).join(', ')}`),
    allowInternetAccess: detail?.allowInternetAccess === false ? false : null,
    // The destinations that have header rules: names only, never the headers' values.
    ruleKeys: network.rules && typeof network.rules === 'object' ? Object.keys(network.rules) : [],
    enforcement: typeof detail?.egress?.enforcement === 'string' ? detail.egress.enforcement : '',
    flows: {
      allowed: count(flows.allowed),
      denied: count(flows.denied),
      bytesUp: count(flows.bytesUp),
      bytesDown: count(flows.bytesDown),
    },
  };
}

/** Every sandbox (up to MAX_SANDBOXES) with its detail, newest first as the API lists them. */
export async function loadSandboxes(api, signal) {
  const listed = await api.json('/sandboxes', signal);
  const shown = (Array.isArray(listed) ? listed : []).slice(0, MAX_SANDBOXES);
  const summaries = new Array(shown.length);
  let next = 0;
  const worker = async () => {
    while (next < shown.length) {
      const i = next++;
      const id = encodeURIComponent(String(shown[i].sandboxID));
      let detail;
      try {
        detail = await api.json(`/sandboxes/${id}`, signal);
      } catch (error) {
        if (error.name === 'AbortError' || error instanceof KeyRefused) throw error;
        // Gone since it was listed: shown without its detail.
      }
      summaries[i] = sandboxSummary(shown[i], detail);
    }
  };
  await Promise.all(Array.from({ length: PARALLEL }, worker));
  return summaries;
}

/** denyOut 0.0.0.0/0 and the SDK's name for it (the API shows entries as they were written). */
const ALL_TRAFFIC = ['0.0.0.0/0', 'ALL_TRAFFIC'];
const ALWAYS_DENIED = 'the host and the internal deny list';

/**
 * What a policy means as a whole, as src/policy decides (its `denyAll`): denyOut 0.0.0.0/0 or
 * allow_internet_access false denies everything allowOut does not allow ("closed"); otherwise
 * everything is allowed but denyOut ("open"). Either way the host itself and the internal deny
 * list are denied, and no sandbox rule opens them.
 */
function policyStance(sandbox) {
  if (!sandbox.policyRead) return { stance: 'unknown', meaning: 'policy not read' };
  const { allowOut, denyOut } = sandbox;
  const allTraffic = denyOut.find((entry) => ALL_TRAFFIC.includes(entry));
  const denyAll =
    allTraffic !== undefined
      ? `denyOut ${allTraffic}`
      : sandbox.allowInternetAccess === false
        ? 'allow_internet_access false'
        : undefined;
  if (denyAll !== undefined) {
    const but = allowOut.length === 0 ? '' : ' but allowOut';
    return { stance: 'closed', meaning: `everything denied${but} (${denyAll})` };
  }
  if (denyOut.length > 0)
    return { stance: 'open', meaning: `everything allowed but denyOut, ${ALWAYS_DENIED}` };
  const rules = allowOut.length === 0 ? 'no rules' : 'nothing denied';
  return { stance: 'open', meaning: `${rules}: everything allowed but ${ALWAYS_DENIED}` };
}

/** The policy's stance as a badge, and what it means in words. */
const stanceParts = (sandbox) => {
  const { stance, meaning } = policyStance(sandbox);
  return [
    el('span', { class: `stance ${stance}` }, stance),
    el('span', { class: 'stance-meaning' }, meaning),
  ];
};

const chips = (list, kind) =>
  list.length === 0
    ? el('span', { class: 'muted' }, 'none')
    : list.map((entry) => el('span', { class: `chip ${kind}` }, entry));

/** The totals line: allowed, denied, bytes up and down. */
const totals = (flows) => [
  el('span', { class: 'count allow', title: 'flows allowed' }, `✓ ${formatCount(flows.allowed)}`),
  el('span', { class: 'count deny', title: 'flows denied' }, `✗ ${formatCount(flows.denied)}`),
  el(
    'span',
    { class: 'count bytes', title: 'bytes up / down' },
    `↑ ${formatBytes(flows.bytesUp ?? 0)} ↓ ${formatBytes(flows.bytesDown ?? 0)}`,
  ),
];

/** Fills the sandbox list; `onPick(id)` runs when one is clicked, `picked` is highlighted. */
export function renderSandboxList(list, sandboxes, picked, onPick) {
  if (sandboxes.length === 0) {
    fill(list, el('li', { class: 'empty' }, 'No sandboxes on this node.'));
    return;
  }
  fill(
    list,
    sandboxes.map((s) => {
      const button = el(
        'button',
        {
          type: 'button',
          class: s.sandboxID === picked ? 'sandbox picked' : 'sandbox',
          'data-sandbox': s.sandboxID,
          'aria-pressed': String(s.sandboxID === picked),
        },
        el(
          'span',
          { class: 'sandbox-head' },
          el('span', { class: 'sandbox-id' }, s.sandboxID),
          el('span', { class: `state ${s.state}` }, s.state),
        ),
        el(
          'span',
          { class: 'policy' },
          el('span', { class: 'policy-stance' }, stanceParts(s)),
          // An empty list is left out: "none" would read as locked down.
          s.allowOut.length === 0
            ? null
            : el(
                'span',
                { class: 'policy-line' },
                el('b', {}, 'allow '),
                chips(s.allowOut, 'allow'),
              ),
          s.denyOut.length === 0
            ? null
            : el('span', { class: 'policy-line' }, el('b', {}, 'deny '), chips(s.denyOut, 'deny')),
        ),
        el('span', { class: 'totals' }, totals(s.flows)),
      );
      button.addEventListener('click', () => onPick(s.sandboxID));
      return el('li', {}, button);
    }),
  );
}

/** The picked sandbox's panel: policy in full, totals, lifetime. */
export function renderSandboxDetail(panel, sandbox) {
  if (sandbox === undefined) {
    panel.hidden = true;
    fill(panel);
    return;
  }
  panel.hidden = false;
  fill(
    panel,
    el(
      'div',
      { class: 'detail-head' },
      el('h2', {}, sandbox.sandboxID),
      el('span', { class: `state ${sandbox.state}` }, sandbox.state),
      sandbox.name ? el('span', { class: 'muted' }, `template ${sandbox.name}`) : null,
      sandbox.enforcement
        ? el('span', { class: 'muted' }, `enforced by ${sandbox.enforcement}`)
        : null,
      el('span', { class: 'totals' }, totals(sandbox.flows)),
    ),
    el(
      'dl',
      { class: 'detail-policy' },
      el('dt', {}, 'policy'),
      el('dd', { class: 'policy-stance' }, stanceParts(sandbox)),
      el('dt', {}, 'allowOut'),
      el('dd', {}, chips(sandbox.allowOut, 'allow')),
      sandbox.presets.length > 0 ? el('dt', {}, 'presets') : null,
      sandbox.presets.length > 0 ? el('dd', {}, chips(sandbox.presets, 'allow')) : null,
      el('dt', {}, 'denyOut'),
      el('dd', {}, chips(sandbox.denyOut, 'deny')),
      sandbox.ruleKeys.length > 0 ? el('dt', {}, 'header rules') : null,
      sandbox.ruleKeys.length > 0 ? el('dd', {}, chips(sandbox.ruleKeys, 'rule')) : null,
      el('dt', {}, 'lifetime'),
      el(
        'dd',
        { class: 'muted' },
        `${formatDateTime(sandbox.startedAt)} → ${formatDateTime(sandbox.endAt)}`,
      ),
    ),
  );
}
