/**
 * The console at /ui/: its static files over HTTP (no key needed, strict headers, only the files
 * it names), and the page itself in a real browser, Debian's Chromium driven by playwright-core
 * against an in-process Moat: the key leaves the address bar (also one added to an open tab),
 * the sandboxes show with their policy and whether it is open or closed, a denial made after the
 * page loaded appears live, filters narrow the table, every flow kind fits its column, a hostile
 * destination name stays text, and no token from the API reaches the page. Skipped, with the
 * reason printed, where Chromium cannot be installed or started.
 */
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { type BrowserContext, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONSOLE_CSP, CONSOLE_FILES } from '../../src/api/console.js';
import { FLOW_KINDS, type FlowDecision } from '../../src/flows/index.js';
import { parseNetworkConfig } from '../../src/policy/index.js';
import { SANDBOXES } from '../../src/sandbox/records.js';
import { API_KEY, type ApiMoat, type Created, startApiMoat } from '../support/api-client.js';
import { udpQuery } from '../support/dns-client.js';
import { connectThrough } from '../support/origins.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const CHROMIUM = '/usr/bin/chromium';
const ARTIFACTS = path.join(ROOT, 'test-artifacts');
/** The README's picture is refreshed from this test only when asked (it is committed). */
const DOCS_SCREENSHOT = path.join(ROOT, 'docs', 'console.png');

// Names resolve to test-network addresses nothing dials: the flows here are DNS answers and
// refusals by name.
const ZONE = new Map([
  ['allowed.test', { A: ['198.18.0.10'] }],
  ['api.allowed.test', { A: ['198.18.0.11'] }],
  ['denied.test', { A: ['198.18.0.12'] }],
  ['live-denied.test', { A: ['198.18.0.13'] }],
]);
/**
 * A sandbox for each way a policy reads as a whole, and what the console must say of it. Open or
 * closed is the policy part's own answer (`denyAll`), so the console cannot drift from it.
 */
const STANCES = [
  {
    create: {},
    says: 'no rules: everything allowed but the host and the internal deny list',
  },
  {
    create: { network: { denyOut: ['93.184.215.0/24'] } },
    says: 'everything allowed but denyOut, the host and the internal deny list',
  },
  {
    create: { network: { denyOut: ['ALL_TRAFFIC'] } },
    says: 'everything denied (denyOut ALL_TRAFFIC)',
  },
  {
    create: { allow_internet_access: false },
    says: 'everything denied (allow_internet_access false)',
  },
  {
    create: { network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] } },
    says: 'everything denied but allowOut (denyOut 0.0.0.0/0)',
  },
  {
    create: { network: { allowOut: ['93.184.215.0/24'] } },
    says: 'nothing denied: everything allowed but the host and the internal deny list',
  },
] as const;

/** The network configuration a create body gives a sandbox, as the policy part reads it. */
function stanceOf(create: { network?: object; allow_internet_access?: boolean }) {
  const parsed = parseNetworkConfig({
    ...create.network,
    ...(create.allow_internet_access === undefined
      ? {}
      : { allow_internet_access: create.allow_internet_access }),
  });
  if (!parsed.ok) throw new Error(`policy fixture refused: ${parsed.errors[0]!.message}`);
  return parsed.value.denyAll ? 'closed' : 'open';
}

const HOSTILE = '<img src=x onerror="window.__pwned=1;alert(1)">';
const HOSTILE_RULE = '<script>window.__pwned=2</script>';

let env: ApiMoat;
let base: string;

beforeAll(async () => {
  env = await startApiMoat(ZONE);
  base = env.api.base;
});
afterAll(async () => env?.stop());

describe('the console files', () => {
  it('redirects /ui to /ui/ and serves the page there without an API key', async () => {
    const redirect = await fetch(`${base}/ui`, { redirect: 'manual' });
    expect(redirect.status).toBe(301);
    expect(redirect.headers.get('location')).toBe('/ui/');
    const page = await fetch(`${base}/ui/`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(await page.text()).toContain('<script type="module" src="main.js">');
  });

  it('serves every file it names with a strict policy, nosniff and revalidation', async () => {
    for (const [name, type] of Object.entries(CONSOLE_FILES)) {
      const reply = await fetch(`${base}/ui/${name}`);
      expect(reply.status, name).toBe(200);
      expect(reply.headers.get('content-type'), name).toBe(type);
      expect(reply.headers.get('content-security-policy'), name).toBe(CONSOLE_CSP);
      expect(reply.headers.get('x-content-type-options'), name).toBe('nosniff');
      expect(reply.headers.get('cache-control'), name).toBe('no-cache');
      const etag = reply.headers.get('etag');
      expect(etag, name).toMatch(/^"[\w-]+"$/);
      const again = await fetch(`${base}/ui/${name}`, { headers: { 'if-none-match': etag! } });
      expect(again.status, name).toBe(304);
    }
    expect(CONSOLE_CSP).toMatch(/^default-src 'self'/);
    expect(CONSOLE_CSP).not.toMatch(/unsafe/);
  });

  it('serves nothing but its own files, whatever the path says', async () => {
    for (const attempt of [
      '/ui/package.json',
      '/ui/..%2Fpackage.json',
      '/ui/%2e%2e%2fpackage.json',
      '/ui/..%2F..%2Fetc%2Fpasswd',
      '/ui/%2e%2e/src/api/console.ts',
      '/ui/main.js%00.html',
      '/ui/.%2Fmain.js',
    ]) {
      const reply = await fetch(`${base}${attempt}`);
      expect(reply.status, attempt).toBe(404);
      const body = await reply.text();
      expect(body, attempt).not.toContain('"name": "moat"');
      expect(body, attempt).not.toContain('root:');
    }
  });

  it('holds no data: the API behind it still wants the key', async () => {
    expect((await fetch(`${base}/flows`)).status).toBe(401);
    expect((await fetch(`${base}/sandboxes`)).status).toBe(401);
  });
});

// -- the page in Chromium --------------------------------------------------------------------

/** Chromium's flags: headless, and nothing that would reach beyond this machine's loopback. */
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-default-apps',
  '--disable-extensions',
  '--no-default-browser-check',
  // Every name but the loopback API's address fails to resolve: no lookup leaves the machine.
  '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1',
];

interface Browser {
  context: BrowserContext;
  profile: string;
}

/** Installs Chromium where allowed and starts it; the reason when it cannot. */
async function openBrowser(): Promise<Browser | string> {
  const install = spawnSync(
    process.execPath,
    [path.join(ROOT, 'scripts/system-packages.mjs'), '--browser'],
    { stdio: 'inherit', timeout: 600_000 },
  );
  if (!existsSync(CHROMIUM))
    return `${CHROMIUM} is missing and scripts/system-packages.mjs --browser could not install it (exit ${install.status ?? install.signal})`;
  const profile = mkdtempSync(path.join(os.tmpdir(), 'moat-console-chromium-'));
  try {
    const context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM,
      headless: true,
      args: CHROMIUM_ARGS,
      viewport: { width: 1280, height: 800 },
      timeout: 60_000,
    });
    return { context, profile };
  } catch (error) {
    rmSync(profile, { recursive: true, force: true });
    return `${CHROMIUM} did not start: ${(error as Error).message.split('\n')[0]}`;
  }
}

const browser = await openBrowser();
const unavailable = typeof browser === 'string' ? browser : undefined;
if (unavailable !== undefined) console.warn(`console browser test skipped: ${unavailable}`);

describe.skipIf(unavailable !== undefined)('the console in Chromium', () => {
  const { context, profile } = browser as Browser;
  let page: Page;
  let guarded: Created;
  let open: Created;
  let guardedAddress: string;
  /** One sandbox per entry of STANCES, in its order. */
  let stances: Created[];
  const dialogs: string[] = [];
  const pageErrors: string[] = [];

  /** A DNS query from `sandbox`'s own source address, as its resolver sends it. */
  const ask = (address: string, name: string) =>
    udpQuery(env.moat.listening.dns.port, address, name);

  /** The rows' text, top to bottom. */
  const rows = () => page.locator('#flow-body tr').allTextContents();

  beforeAll(async () => {
    guarded = await env.api.sandbox({
      secure: true,
      network: { allowOut: ['allowed.test', '*.allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    open = await env.api.sandbox({ secure: true });
    stances = await Promise.all(STANCES.map(({ create }) => env.api.sandbox(create)));
    expect(guarded.envdAccessToken).toMatch(/^[A-Za-z0-9_-]{20,}$/);
    guardedAddress = (await env.api.detail(guarded.sandboxID)).egress.address;
    const openAddress = (await env.api.detail(open.sandboxID)).egress.address;

    // Flows from before the page opened: allowed and denied lookups, a refused CONNECT.
    expect((await ask(guardedAddress, 'allowed.test')).rcode).toBe('NOERROR');
    expect((await ask(guardedAddress, 'api.allowed.test')).rcode).toBe('NOERROR');
    expect((await ask(guardedAddress, 'denied.test')).rcode).toBe('NXDOMAIN');
    expect((await ask(openAddress, 'denied.test')).rcode).toBe('NOERROR');
    const record = (await env.moat.store.get(SANDBOXES, guarded.sandboxID)) as {
      egressSecret: string;
    };
    const refused = await connectThrough(env.moat.listening.proxy, 'denied.test:443', {
      auth: `${guarded.sandboxID}:${record.egressSecret}`,
    });
    refused.socket.destroy();
    expect(refused.status).toBe(403);
    // A destination named to attack the page, through the recorder every enforcement point
    // uses (the DNS interceptor and the proxy refuse such a name before deciding anything).
    env.moat.flows.decided(
      {
        sandboxID: open.sandboxID,
        kind: 'connect',
        destination: { name: HOSTILE, address: null, port: 443, protocol: 'tcp' },
      },
      { verdict: 'deny', list: 'denyOut', rule: HOSTILE_RULE, reason: `refused ${HOSTILE}` },
    );
    // A request a destination's rules refused: its path is the sandbox's to write.
    env.moat.flows.decided(
      {
        sandboxID: open.sandboxID,
        kind: 'http',
        destination: { name: 'rules.test', address: null, port: 443, protocol: 'tls' },
        request: { method: 'POST', path: `/repos/${HOSTILE}` },
      },
      { verdict: 'deny', list: 'rules', rule: 'rules.test #2', reason: 'denied by rule' },
    );

    page = await context.newPage();
    page.on('dialog', (dialog) => {
      dialogs.push(dialog.message());
      void dialog.dismiss();
    });
    page.on('pageerror', (error) => pageErrors.push(error.message));
  }, 120_000);

  afterAll(async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  });

  it('takes the key from the fragment, drops it from the address and lists the sandboxes', async () => {
    await page.goto(`${base}/ui#key=${API_KEY}`);
    await page.locator('#app').waitFor({ state: 'visible' });
    expect(page.url()).toBe(`${base}/ui/`);
    expect(await page.evaluate<number>('history.length')).toBeLessThanOrEqual(2);
    for (const id of [guarded.sandboxID, open.sandboxID])
      await page.locator(`.sandbox[data-sandbox="${id}"]`).waitFor();
    const card = page.locator(`.sandbox[data-sandbox="${guarded.sandboxID}"]`);
    await expect.poll(() => card.textContent()).toContain('*.allowed.test');
    expect(await card.textContent()).toContain('0.0.0.0/0');
    // Its totals: two lookups allowed; a lookup and a CONNECT denied.
    await expect.poll(() => card.locator('.count.deny').textContent()).toBe('✗ 2');
    expect(await card.locator('.count.allow').textContent()).toBe('✓ 2');
  });

  it('says what each policy means: open with no rules, closed under deny-all', async () => {
    for (const [i, { create, says }] of STANCES.entries()) {
      const id = stances[i]!.sandboxID;
      const stance = stanceOf(create);
      const card = page.locator(`.sandbox[data-sandbox="${id}"]`);
      await card.waitFor();
      expect(await card.locator('.stance').textContent(), says).toBe(stance);
      expect(await card.locator('.stance-meaning').textContent(), says).toBe(says);
      // An empty list is left out, not shown as "none", which reads as locked down.
      expect(await card.textContent(), says).not.toContain('none');

      await card.click();
      const detail = page.locator('#sandbox-detail');
      await expect.poll(() => detail.locator('h2').textContent()).toBe(id);
      expect(await detail.locator('.stance').textContent(), says).toBe(stance);
      expect(await detail.locator('.stance-meaning').textContent(), says).toBe(says);
    }
    await page.locator('#all-sandboxes').click();
    await expect.poll(() => page.locator('#filter-sandbox').inputValue()).toBe('');
  });

  it('shows a denial made after the page loaded, live, with the rule that decided', async () => {
    await page.locator('#status.live').waitFor();
    await expect
      .poll(rows)
      .toEqual(expect.arrayContaining([expect.stringContaining('denied.test')]));
    expect((await rows()).join('\n')).not.toContain('live-denied.test');

    expect((await ask(guardedAddress, 'live-denied.test')).rcode).toBe('NXDOMAIN');
    const [made] = (
      await env.api.get(`/flows?sandboxID=${guarded.sandboxID}&destination=live-denied&limit=5`)
    ).body as Array<{ list: string; rule: string; reason: string }>;
    expect(made).toBeDefined();

    const row = page.locator('#flow-body tr', { hasText: 'live-denied.test' });
    await row.waitFor({ timeout: 10_000 });
    // Newest on top, highlighted as a denial, with the deciding list, rule and reason.
    expect(await page.locator('#flow-body tr').first().textContent()).toContain('live-denied.test');
    expect(await row.getAttribute('class')).toBe('flow deny');
    const text = await row.textContent();
    for (const part of [guarded.sandboxID, 'dns', 'deny', made!.list, made!.rule, made!.reason])
      expect(text).toContain(part);
  });

  it('filters by sandbox, verdict, kind and destination, and opens one sandbox', async () => {
    await page.locator('#filter-sandbox').selectOption(open.sandboxID);
    await expect
      .poll(async () => (await rows()).every((r) => r.includes(open.sandboxID)))
      .toBe(true);
    // Its hostile-name record and its refused request (both made in beforeAll).
    await expect.poll(async () => (await rows()).length).toBe(3);
    expect(await page.locator('#sandbox-detail h2').textContent()).toBe(open.sandboxID);

    // Clicking a sandbox in the list shows it: its panel, its policy, only its flows.
    await page.locator(`.sandbox[data-sandbox="${guarded.sandboxID}"]`).click();
    await expect.poll(() => page.locator('#filter-sandbox').inputValue()).toBe(guarded.sandboxID);
    await expect
      .poll(() => page.locator('#sandbox-detail h2').textContent())
      .toBe(guarded.sandboxID);
    expect(await page.locator('#sandbox-detail').textContent()).toContain('*.allowed.test');
    await expect.poll(async () => (await rows()).length).toBe(5);
    expect((await rows()).every((r) => r.includes(guarded.sandboxID))).toBe(true);

    await page.locator('#filter-verdict').selectOption('deny');
    await expect.poll(async () => (await rows()).length).toBe(3);
    expect(await page.locator('#flow-body tr.flow.allow').count()).toBe(0);

    await page.locator('#filter-kind').selectOption('connect');
    await expect.poll(async () => (await rows()).length).toBe(1);
    await page.locator('#filter-kind').selectOption('');

    await page.locator('#filter-destination').fill('live-');
    await expect.poll(rows).toEqual([expect.stringContaining('live-denied.test')]);
    await page.locator('#filter-destination').fill('');
    await page.locator('#filter-verdict').selectOption('');
    await expect.poll(async () => (await rows()).length).toBe(5);
  });

  it('renders a hostile destination name as text: no element made, nothing run', async () => {
    await page.locator('#all-sandboxes').click();
    // Found by what it holds besides the name, so a name turned into markup fails the checks below.
    const row = page
      .locator('#flow-body tr', { hasText: open.sandboxID })
      .filter({ hasText: 'connect' });
    await row.waitFor({ timeout: 10_000 });
    expect(await row.locator('.dest-name').textContent()).toBe(`${HOSTILE}:443`);
    expect(await row.locator('.rule code').textContent()).toBe(HOSTILE_RULE);
    const request = page
      .locator('#flow-body tr', { hasText: open.sandboxID })
      .filter({ hasText: 'rules.test #2' });
    expect(await request.locator('.dest-request').textContent()).toBe(`POST /repos/${HOSTILE}`);
    expect(await page.locator('img, script:not([src])').count()).toBe(0);
    expect(await page.locator('[onerror]').count()).toBe(0);
    expect(await page.evaluate<string>('typeof window.__pwned')).toBe('undefined');
    expect(dialogs).toEqual([]);
  });

  it('fits every kind of flow Moat records in the kind column, a lone close too', async () => {
    const sandboxID = stances[1]!.sandboxID;
    const destination = { name: 'kinds.test', address: null, port: 443, protocol: 'tcp' } as const;
    const allow: FlowDecision = { verdict: 'allow', list: 'default', rule: null, reason: 'open' };
    const deny: FlowDecision = { verdict: 'deny', list: 'denyOut', rule: null, reason: 'denied' };
    for (const kind of FLOW_KINDS) {
      env.moat.flows.decided({ sandboxID, kind, destination }, deny);
      // Allowed, then ended by a policy change: its close is a denial, so the denials filter
      // shows it without its decision, as a row of its own ("<kind> close").
      const flow = env.moat.flows.opened({ sandboxID, kind, destination }, allow);
      flow.refused(deny);
      flow.closed(1, 2);
    }
    await page.locator(`.sandbox[data-sandbox="${sandboxID}"]`).click();
    await page.locator('#filter-verdict').selectOption('deny');
    await expect.poll(async () => (await rows()).length).toBe(2 * FLOW_KINDS.length);

    const kinds = () =>
      page.locator('#flow-body td.kind').evaluateAll((cells) =>
        cells.map((cell) => ({
          text: cell.textContent,
          fits: cell.scrollWidth <= cell.clientWidth,
        })),
      );
    // The table is redrawn as flows arrive: each read is of one whole drawing.
    await expect
      .poll(async () => (await kinds()).map(({ text }) => text).sort())
      .toEqual(FLOW_KINDS.flatMap((kind) => [kind, `${kind} close`]).sort());
    await expect
      .poll(async () => {
        const drawn = await kinds();
        return drawn.length === 2 * FLOW_KINDS.length
          ? drawn.filter(({ fits }) => !fits).map(({ text }) => text)
          : `${drawn.length} rows drawn`;
      })
      .toEqual([]);
    // The filter offers exactly the kinds Moat records.
    const offered = await page
      .locator('#filter-kind option')
      .evaluateAll((options) => options.map((option) => option.getAttribute('value')));
    expect(offered).toEqual(['', ...FLOW_KINDS]);

    await page.locator('#filter-verdict').selectOption('');
    await page.locator('#all-sandboxes').click();
  });

  it("marks a flow a report-mode sandbox's rules would have denied, naming that rule", async () => {
    const sandboxID = stances[2]!.sandboxID;
    env.moat.flows.decided(
      {
        sandboxID,
        kind: 'connect',
        destination: { name: 'reported.test', address: null, port: 443, protocol: 'tcp' },
      },
      {
        verdict: 'allow',
        list: 'report',
        rule: '0.0.0.0/0',
        reason: 'report mode lets it through: denied',
        wouldDeny: { list: 'denyOut', rule: '0.0.0.0/0', reason: 'denied' },
      },
    );
    await page.locator(`.sandbox[data-sandbox="${sandboxID}"]`).click();
    const row = page.locator('#flow-body tr', { hasText: 'reported.test' });
    await row.waitFor({ timeout: 10_000 });
    expect(await row.getAttribute('class')).toBe('flow allow would-deny');
    expect(await row.locator('.verdict.would-deny').textContent()).toBe('would deny');
    expect(await row.locator('.rule .list').textContent()).toBe('report: would deny by denyOut');
    expect(await row.locator('.rule code').textContent()).toBe('0.0.0.0/0');
    await page.locator('#all-sandboxes').click();
  });

  it('shows no token the API answered with, and no page error', async () => {
    const everything = [
      await page.content(),
      await page.evaluate<string>('document.body.innerText'),
      await page.evaluate<string>('document.title'),
    ].join('\n');
    for (const created of [guarded, open]) {
      expect(created.envdAccessToken).toBeTruthy();
      expect(everything).not.toContain(created.envdAccessToken);
    }
    expect(everything).not.toContain(API_KEY);
    expect(pageErrors).toEqual([]);
  });

  it('asks for the key in a new tab, and asks again when the API refuses it', async () => {
    const tab = await context.newPage();
    try {
      await tab.goto(`${base}/ui/`);
      await tab.locator('#login').waitFor({ state: 'visible' });
      expect(await tab.locator('#app').isHidden()).toBe(true);
      await tab.locator('#key-input').fill('not-the-key');
      await tab.locator('#key-form button[type=submit]').click();
      await expect.poll(() => tab.locator('#key-error').textContent()).toContain('refused');
      expect(await tab.locator('#login').isVisible()).toBe(true);
      await tab.locator('#key-input').fill(API_KEY);
      await tab.locator('#key-form button[type=submit]').click();
      await tab.locator(`.sandbox[data-sandbox="${guarded.sandboxID}"]`).waitFor();
      expect(await tab.evaluate<string>('document.body.innerText')).not.toContain(API_KEY);
    } finally {
      await tab.close();
    }
  });

  it('takes a key added to the address of an open tab, and drops it from there too', async () => {
    const tab = await context.newPage();
    const setHash = (hash: string) => tab.evaluate(`location.hash = ${JSON.stringify(hash)}`);
    try {
      await tab.goto(`${base}/ui/#key=${API_KEY}`);
      await tab.locator(`.sandbox[data-sandbox="${guarded.sandboxID}"]`).waitFor();
      const before = await tab.evaluate<number>('history.length');

      // A key given to the open console replaces the one it had.
      await setHash('key=not-the-key');
      await expect.poll(() => tab.locator('#key-error').textContent()).toContain('refused');
      expect(tab.url()).toBe(`${base}/ui/`);

      // And the login page takes one the same way; other fragment parameters stay.
      await setHash(`key=${API_KEY}&note=kept`);
      await tab.locator(`.sandbox[data-sandbox="${guarded.sandboxID}"]`).waitFor();
      expect(await tab.locator('#login').isHidden()).toBe(true);
      expect(tab.url()).toBe(`${base}/ui/#note=kept`);
      expect(await tab.evaluate<number>('history.length')).toBeLessThanOrEqual(before + 2);
      expect(await tab.evaluate<string>('document.body.innerText')).not.toContain(API_KEY);

      // A fragment without a key changes nothing.
      await setHash('elsewhere');
      await tab.locator('#status.live').waitFor();
      expect(await tab.locator('#app').isVisible()).toBe(true);
    } finally {
      await tab.close();
    }
  });

  it('keeps the key for the tab only, and looks right at 1280x800', async () => {
    // The picture shows the two sandboxes the docs describe, one open and one closed.
    for (const { sandboxID } of stances)
      expect((await env.api.delete(`/sandboxes/${sandboxID}`)).status).toBe(204);
    // A reload finds the key in this tab's session storage, not in the address.
    await page.reload();
    await page.locator('#status.live').waitFor();
    expect(page.url()).toBe(`${base}/ui/`);
    await page.locator(`.sandbox[data-sandbox="${guarded.sandboxID}"]`).click();
    await page.locator('#status.live').waitFor();
    await expect.poll(async () => (await rows()).length).toBe(5);
    // Nothing spills sideways at the size the console is made for.
    const width = await page.evaluate<number>('document.documentElement.scrollWidth');
    expect(width).toBeLessThanOrEqual(1280);
    mkdirSync(ARTIFACTS, { recursive: true });
    const shot = path.join(ARTIFACTS, 'console.png');
    await page.screenshot({ path: shot });
    expect(existsSync(shot)).toBe(true);
    console.log(`console screenshot: ${path.relative(ROOT, shot)}`);
    if (process.env.MOAT_UPDATE_SCREENSHOTS === '1') copyFileSync(shot, DOCS_SCREENSHOT);
  });
});
