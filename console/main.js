/**
 * The console page: asks for the API key, then shows the sandboxes (refreshed every few
 * seconds) and the flow table, which loads the newest matching records and then follows new
 * ones live. Changing a filter reloads both with the filter as `GET /flows` query parameters.
 */
import { Api, forgetKey, keepKey, KeyRefused, keyFromFragment, takeKey } from './api.js';
import { byId, el, fill } from './dom.js';
import { FlowTable, MAX_ROWS } from './flows.js';
import { loadSandboxes, renderSandboxDetail, renderSandboxList } from './sandboxes.js';

/** How often the sandbox list is read again: each sandbox costs one request, so many wait longer. */
const sandboxRefreshMs = (count) => (count > 50 ? 20000 : 5000);
const RETRY_MS = [1000, 2000, 5000, 10000, 30000];
const KINDS = ['dns', 'connect', 'http', 'transparent', 'direct', 'ingress'];

const page = {
  login: byId('login'),
  keyForm: byId('key-form'),
  keyInput: byId('key-input'),
  keyError: byId('key-error'),
  app: byId('app'),
  forget: byId('forget'),
  status: byId('status'),
  sandboxList: byId('sandbox-list'),
  sandboxCount: byId('sandbox-count'),
  allSandboxes: byId('all-sandboxes'),
  detail: byId('sandbox-detail'),
  filters: byId('filters'),
  sandboxFilter: byId('filter-sandbox'),
  verdictFilter: byId('filter-verdict'),
  kindFilter: byId('filter-kind'),
  destinationFilter: byId('filter-destination'),
  rowCount: byId('row-count'),
  flowBody: byId('flow-body'),
  empty: byId('flows-empty'),
};

let api;
let sandboxes = [];
/** Aborts the current flow load and follow (a filter change or a new key starts another). */
let flowRun;
let sandboxTimer;

const table = new FlowTable(page.flowBody, (id) => pick(id));

function setStatus(state, message) {
  page.status.className = `status ${state}`;
  page.status.textContent = message;
}

function showLogin(message) {
  stopAll();
  api = undefined;
  page.app.hidden = true;
  page.forget.hidden = true;
  page.login.hidden = false;
  page.keyError.textContent = message ?? '';
  setStatus('idle', '');
  page.keyInput.focus();
}

function stopAll() {
  flowRun?.abort();
  flowRun = undefined;
  clearTimeout(sandboxTimer);
}

/** Shows the console read with `key`, in place of whatever it showed. */
function start(key) {
  stopAll();
  api = new Api(key);
  page.login.hidden = true;
  page.app.hidden = false;
  page.forget.hidden = false;
  refreshSandboxes();
  reloadFlows();
}

// -- filters -------------------------------------------------------------------------------

function filterQuery() {
  const query = {};
  if (page.sandboxFilter.value) query.sandboxID = page.sandboxFilter.value;
  if (page.verdictFilter.value) query.verdict = page.verdictFilter.value;
  if (page.kindFilter.value) query.kind = page.kindFilter.value;
  const destination = page.destinationFilter.value.trim();
  if (destination) query.destination = destination;
  return query;
}

/** Shows one sandbox (its panel, and only its flows); undefined shows all. */
function pick(sandboxID) {
  ensureSandboxOption(sandboxID);
  page.sandboxFilter.value = sandboxID ?? '';
  showPicked();
  reloadFlows();
}

function showPicked() {
  const picked = page.sandboxFilter.value || undefined;
  renderSandboxList(page.sandboxList, sandboxes, picked, pick);
  renderSandboxDetail(
    page.detail,
    picked === undefined ? undefined : sandboxes.find((s) => s.sandboxID === picked),
  );
  page.allSandboxes.disabled = picked === undefined;
}

/** The sandbox filter offers every listed sandbox, and the picked one even once it is gone. */
function ensureSandboxOption(sandboxID) {
  const ids = new Set(sandboxes.map((s) => s.sandboxID));
  if (sandboxID) ids.add(sandboxID);
  const current = page.sandboxFilter.value;
  if (current) ids.add(current);
  const wanted = ['', ...[...ids].sort()];
  const have = [...page.sandboxFilter.options].map((o) => o.value);
  if (wanted.join('\n') === have.join('\n')) return;
  fill(
    page.sandboxFilter,
    wanted.map((id) => el('option', { value: id }, id === '' ? 'All sandboxes' : id)),
  );
  page.sandboxFilter.value = current;
}

// -- sandboxes -----------------------------------------------------------------------------

async function refreshSandboxes() {
  clearTimeout(sandboxTimer);
  const using = api;
  try {
    const loaded = await loadSandboxes(using);
    if (api !== using) return;
    sandboxes = loaded;
    page.sandboxCount.textContent = String(sandboxes.length);
    ensureSandboxOption();
    showPicked();
  } catch (error) {
    if (api !== using) return;
    if (error instanceof KeyRefused) return refuseKey(error);
    setStatus('error', `sandboxes: ${error.message}`);
  }
  sandboxTimer = setTimeout(refreshSandboxes, sandboxRefreshMs(sandboxes.length));
}

function refuseKey(error) {
  forgetKey();
  showLogin(`The API refused this key: ${error.message}`);
}

// -- flows ---------------------------------------------------------------------------------

function updateCount() {
  page.rowCount.textContent =
    table.size >= MAX_ROWS ? `newest ${MAX_ROWS} flows` : `${table.size} flows`;
  page.empty.hidden = table.size > 0;
}

/**
 * Loads the newest matching records, then follows new ones until the filters change. The
 * follow opens first and holds what it gets until the load is in, so nothing recorded in
 * between is missed (the table drops what it already has).
 */
function reloadFlows() {
  flowRun?.abort();
  const run = new AbortController();
  flowRun = run;
  table.clear();
  updateCount();
  const query = filterQuery();
  let attempt = 0;

  const connect = async () => {
    if (run.signal.aborted) return;
    setStatus('connecting', 'connecting…');
    let held = [];
    let loaded = false;
    const onRecord = (record) => {
      if (!loaded) held.push(record);
      else {
        table.add(record);
        updateCount();
      }
    };
    const following = api.follow(
      query,
      run.signal,
      () => {
        attempt = 0;
      },
      onRecord,
    );
    following.catch(() => {});
    try {
      const list = await api.json(
        `/flows?${new URLSearchParams({ ...query, limit: String(MAX_ROWS) })}`,
        run.signal,
      );
      table.clear();
      for (const record of [...list].reverse()) table.add(record);
      for (const record of held) table.add(record);
      held = [];
      loaded = true;
      updateCount();
      setStatus('live', 'live');
      await following;
      if (!run.signal.aborted) throw new Error('the stream ended');
    } catch (error) {
      if (run.signal.aborted) return;
      if (error instanceof KeyRefused) return refuseKey(error);
      const wait = RETRY_MS[Math.min(attempt++, RETRY_MS.length - 1)];
      setStatus('error', `${error.message}; retrying in ${wait / 1000} s`);
      setTimeout(connect, wait);
    }
  };
  connect();
}

let destinationTimer;
page.filters.addEventListener('submit', (event) => event.preventDefault());
for (const select of [page.sandboxFilter, page.verdictFilter, page.kindFilter]) {
  select.addEventListener('change', () => {
    if (select === page.sandboxFilter) showPicked();
    reloadFlows();
  });
}
page.destinationFilter.addEventListener('input', () => {
  clearTimeout(destinationTimer);
  destinationTimer = setTimeout(reloadFlows, 300);
});
page.allSandboxes.addEventListener('click', () => pick(undefined));

fill(
  page.kindFilter,
  el('option', { value: '' }, 'All kinds'),
  KINDS.map((kind) => el('option', { value: kind }, kind)),
);

// -- the key -------------------------------------------------------------------------------

page.keyForm.addEventListener('submit', (event) => {
  event.preventDefault();
  const key = page.keyInput.value.trim();
  if (key === '') return;
  page.keyInput.value = '';
  keepKey(key);
  start(key);
});
page.forget.addEventListener('click', () => {
  forgetKey();
  showLogin();
});

// A key added to the address of an open tab replaces the one in use (a fragment change does
// not reload the page).
window.addEventListener('hashchange', () => {
  const given = keyFromFragment();
  if (given !== undefined) start(given);
});

const key = takeKey();
if (key === undefined) showLogin();
else start(key);
