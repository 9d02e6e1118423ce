/**
 * The CNI plugin's refusals, run as a runtime runs it (the installed executable, CNI_*
 * variables, the configuration on standard input) against a real Moat on loopback: every
 * failure is CNI error JSON on standard output with a non-zero exit and a message naming what
 * is wrong, the key is never printed, and a refused call changes nothing at Moat. DEL of a
 * container Moat does not hold succeeds, as CNI requires.
 */
import http from 'node:http';
import net from 'node:net';
import { chmodSync, writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { API_KEY, type ApiMoat, startApiMoat } from '../support/api-client.js';
import { type InstalledPlugin, installPlugin, type PluginRun } from './plugin-run.js';

let moat: ApiMoat;
let plugin: InstalledPlugin;
let apiUrl: string;

const ADD = {
  CNI_COMMAND: 'ADD',
  CNI_CONTAINERID: 'c0ffee01',
  CNI_NETNS: '/run/netns/nothing-here',
  CNI_IFNAME: 'eth0',
};
const DEL = { CNI_COMMAND: 'DEL', CNI_CONTAINERID: 'c0ffee01', CNI_IFNAME: 'eth0' };

beforeAll(async () => {
  moat = await startApiMoat();
  const { host, port } = moat.moat.listening.api;
  apiUrl = `http://${host}:${port}`;
  plugin = await installPlugin(apiUrl, API_KEY);
}, 60_000);

afterAll(async () => {
  plugin?.remove();
  await moat?.stop();
});

/** A CNI error: JSON on stdout, exit non-zero, the code, a message matching `msg`. */
function expectCniError(run: PluginRun, code: number, msg: RegExp): void {
  expect(run.code, run.stdout + run.stderr).not.toBe(0);
  expect(run.json).toMatchObject({
    cniVersion: expect.any(String),
    code,
    msg: expect.stringMatching(msg),
  });
  expect(Object.keys(run.json!).sort()).toEqual(
    expect.arrayContaining(['cniVersion', 'code', 'msg']),
  );
  for (const key of [API_KEY, 'wrong-key-0123456789abcdef'])
    expect(run.stdout + run.stderr).not.toContain(key);
}

/** Moat's sandboxes now: a refused call must leave them as they were. */
const sandboxes = async () => (await moat.api.get('/sandboxes')).body as unknown[];

/** A loopback port that refuses connections: bound by the kernel, then closed. */
async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

describe('CNI plugin against a real Moat', () => {
  it('answers VERSION with the versions it speaks, without configuration or Moat', async () => {
    const run = await plugin.run({ CNI_COMMAND: 'VERSION' }, { cniVersion: '0.4.0' });
    expect(run.code).toBe(0);
    expect(run.json).toEqual({
      cniVersion: '0.4.0',
      supportedVersions: ['0.3.0', '0.3.1', '0.4.0', '1.0.0'],
    });
  });

  it('refuses a configuration that is not JSON, or not its own, naming what is wrong', async () => {
    const before = await sandboxes();
    expectCniError(await plugin.run(ADD, '{"cniVersion": "1.0.0",'), 6, /not JSON/);
    expectCniError(await plugin.run(ADD, '[1, 2]'), 6, /not a JSON object/);
    expectCniError(await plugin.run(ADD, plugin.conf({ type: 'bridge' })), 7, /type is "bridge"/);
    expectCniError(
      await plugin.run(ADD, plugin.conf({ cniVersion: '9.9.9' })),
      1,
      /cniVersion 9\.9\.9/,
    );
    expectCniError(await plugin.run(ADD, plugin.conf({ api: 'ftp://x' })), 7, /api "ftp:\/\/x"/);
    expectCniError(
      await plugin.run(ADD, plugin.conf({ keyFile: 'api-key' })),
      7,
      /keyFile "api-key" is not an absolute path/,
    );
    expectCniError(
      await plugin.run(ADD, plugin.conf({ policy: ['pypi.org'] })),
      7,
      /policy must be an object/,
    );
    expectCniError(
      await plugin.run(ADD, plugin.conf({ guestLink: 'tap' })),
      7,
      /guestLink "tap" is not "routed" or "redirect"/,
    );
    expect(await sandboxes()).toEqual(before);
  });

  it('refuses a run without the CNI variables its command needs', async () => {
    expectCniError(
      await plugin.run({ CNI_COMMAND: 'ADD', CNI_IFNAME: 'eth0' }, plugin.conf()),
      4,
      /ADD needs CNI_CONTAINERID, CNI_NETNS/,
    );
    expectCniError(await plugin.run({ CNI_COMMAND: 'GC' }, plugin.conf()), 4, /CNI_COMMAND "GC"/);
  });

  it('refuses a wrong key as a bad key, naming the key file and never the key', async () => {
    const wrong = `${plugin.dir}/wrong-key`;
    writeFileSync(wrong, 'wrong-key-0123456789abcdef\n', { mode: 0o600 });
    const before = await sandboxes();
    const run = await plugin.run(ADD, plugin.conf({ keyFile: wrong }));
    expectCniError(
      run,
      101,
      new RegExp(`Moat at ${apiUrl} refused the API key in ${wrong} \\(401`),
    );
    expect(await sandboxes()).toEqual(before);
  });

  it('refuses a key file others may read, before calling Moat', async () => {
    const open = `${plugin.dir}/open-key`;
    writeFileSync(open, `${API_KEY}\n`);
    chmodSync(open, 0o644);
    expectCniError(
      await plugin.run(ADD, plugin.conf({ keyFile: open })),
      7,
      /mode 0644.*chmod 600/,
    );
    expectCniError(
      await plugin.run(ADD, plugin.conf({ keyFile: `${plugin.dir}/none` })),
      5,
      /cannot read keyFile .*ENOENT/,
    );
  });

  it('refuses a key file holding more than a key, without printing what it holds', async () => {
    const several = `${plugin.dir}/several-keys`;
    writeFileSync(several, `${API_KEY}\nsecond-line-${API_KEY}\n`, { mode: 0o600 });
    const before = await sandboxes();
    const run = await plugin.run(ADD, plugin.conf({ keyFile: several }));
    expectCniError(run, 7, /holds more than one key/);
    expect(run.stdout + run.stderr).not.toContain('second-line');
    expect(await sandboxes()).toEqual(before);
  });

  it('never follows a redirect: the key goes to the configured API only', async () => {
    let reached = '';
    const elsewhere = http.createServer((request, response) => {
      reached = String(request.headers['x-api-key'] ?? 'no key');
      response.end('{}');
    });
    await new Promise<void>((resolve) => elsewhere.listen(0, '127.0.0.1', resolve));
    const to = `http://127.0.0.1:${(elsewhere.address() as net.AddressInfo).port}`;
    const redirecting = http.createServer((request, response) => {
      response.writeHead(307, { location: `${to}${request.url}` }).end();
    });
    await new Promise<void>((resolve) => redirecting.listen(0, '127.0.0.1', resolve));
    const api = `http://127.0.0.1:${(redirecting.address() as net.AddressInfo).port}`;
    try {
      for (const env of [ADD, DEL]) {
        const run = await plugin.run(env, plugin.conf({ api }));
        expect(run.code, run.stdout).not.toBe(0);
      }
      expect(reached).toBe('');
    } finally {
      redirecting.close();
      elsewhere.close();
    }
  });

  it('refuses a previous result whose lists are not lists, before calling Moat', async () => {
    const before = await sandboxes();
    for (const field of ['interfaces', 'ips', 'routes']) {
      const run = await plugin.run(ADD, plugin.conf({ prevResult: { [field]: 5 } }));
      expectCniError(run, 7, new RegExp(`prevResult\\.${field} must be a list`));
    }
    expect(await sandboxes()).toEqual(before);
  });

  it('says Moat is unreachable (try again later) when nothing listens at its address', async () => {
    const port = await closedPort();
    for (const env of [ADD, DEL]) {
      const run = await plugin.run(env, plugin.conf({ api: `http://127.0.0.1:${port}` }));
      expectCniError(
        run,
        11,
        new RegExp(`cannot reach Moat at http://127\\.0\\.0\\.1:${port}: .*ECONNREFUSED`),
      );
    }
  });

  it("passes on Moat's own refusal of an attach, naming it", async () => {
    // This Moat enforces with its proxy only: it cannot adopt a namespace, and says why.
    const before = await sandboxes();
    const run = await plugin.run(ADD, plugin.conf());
    expectCniError(
      run,
      100,
      new RegExp(
        `Moat at ${apiUrl} refused POST /sandboxes \\(501: the template network-only needs namespace enforcement`,
      ),
    );
    expect(await sandboxes()).toEqual(before);
  });

  it('succeeds at DEL of a container Moat does not hold, twice, without CNI_NETNS', async () => {
    for (let i = 0; i < 2; i++) {
      const run = await plugin.run({ ...DEL, CNI_CONTAINERID: 'never-added' }, plugin.conf());
      expect({ code: run.code, stdout: run.stdout }).toEqual({ code: 0, stdout: '' });
    }
  });

  it('DEL removes the sandbox Moat holds for the container, and only that one', async () => {
    const mine = await moat.api.sandbox({ metadata: { cniContainerID: 'c0ffee02' } });
    const other = await moat.api.sandbox({ metadata: { cniContainerID: 'c0ffee03' } });
    const run = await plugin.run({ ...DEL, CNI_CONTAINERID: 'c0ffee02' }, plugin.conf());
    expect({ code: run.code, stdout: run.stdout }).toEqual({ code: 0, stdout: '' });
    expect((await moat.api.get(`/sandboxes/${mine.sandboxID}`)).status).toBe(404);
    expect((await moat.api.get(`/sandboxes/${other.sandboxID}`)).status).toBe(200);
    await moat.api.delete(`/sandboxes/${other.sandboxID}`);
  });

  it('CHECK of a container Moat does not hold is "container unknown"', async () => {
    const run = await plugin.run(
      { ...ADD, CNI_COMMAND: 'CHECK', CNI_CONTAINERID: 'never-added' },
      plugin.conf(),
    );
    expectCniError(run, 3, /Moat holds no sandbox for container never-added \(network moat\)/);
  });
});
