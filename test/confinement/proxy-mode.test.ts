/**
 * Attacker tests: sandboxes that share the host's network (proxy enforcement). Before, a
 * process of a non-secure sandbox reached its own sandbox API on loopback and started commands
 * as root there. Moat's listeners are now out of reach of every sandbox process (a host
 * nftables table refuses the sandboxes' host ids); the DNS interceptor and the egress proxy,
 * which sandboxes need, stay open to them.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ApiMoat, Created } from '../support/api-client.js';
import { startApiMoat } from '../support/api-client.js';
import { freePort } from '../support/local-host.js';
import { loopbackServeArgs, ServeChild } from '../support/serve-child.js';
import { runShell, shell } from '../support/sandbox-shell.js';
import { skipReason } from './runtime-harness.js';

const skip = skipReason('confinement/proxy-mode');
let moat: ApiMoat;
let created: Created;
let other: Created;

beforeAll(async () => {
  if (skip) return;
  moat = await startApiMoat(new Map(), {
    'sandbox-memory-mb': '300',
    'sandbox-cpus': '1',
    'sandbox-disk-mb': '200',
    'metrics-listen': '127.0.0.1:0',
  });
  created = await moat.api.sandbox({ secure: false });
  other = await moat.api.sandbox({ secure: false });
}, 60_000);

afterAll(async () => {
  await moat?.stop();
});

/** Connects from inside the sandbox to 127.0.0.1:port; what happened, in a word. */
const CONNECT = `
import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect(('127.0.0.1', int(sys.argv[1])))
    s.sendall(b'GET /health HTTP/1.0\\r\\n\\r\\n')
    print('answered' if s.recv(100) else 'closed')
except ConnectionRefusedError:
    print('refused')
except ConnectionResetError:
    print('reset')
except OSError as e:
    print('error', e.errno)
`;

describe.skipIf(skip)('proxy mode: no sandbox process reaches Moat’s own listeners', () => {
  it('the platform API, every sandbox API and the metrics listener refuse it; DNS and the proxy answer', async () => {
    const sandbox = moat.moat.runtime.sandbox(created.sandboxID)!;
    const { listening } = moat.moat;
    const reach = async (port: number, user = 'user') =>
      (
        await runShell(sandbox, 'exec python3 -c "$1" "$2"', {
          user,
          args: [CONNECT, String(port)],
        })
      ).stdout.trim();
    for (const user of ['user', 'root']) {
      expect(await reach(listening.api.port, user), `${user}: platform API`).toMatch(
        /^(reset|refused)$/,
      );
      expect(await reach(listening.sandbox.port, user), `${user}: sandbox API`).toMatch(
        /^(reset|refused)$/,
      );
      expect(await reach(listening.metrics!.port, user), `${user}: metrics`).toMatch(
        /^(reset|refused)$/,
      );
      expect(await reach(listening.proxy.port, user), `${user}: egress proxy`).toBe('answered');
    }
    // From the host, the same listeners answer.
    expect((await fetch(`http://127.0.0.1:${listening.sandbox.port}/health`)).status).toBeLessThan(
      500,
    );
    // The proxy answers for the policy (a name no rule allows, under an open policy, is dialled
    // and fails; either way it is Moat's proxy that answered).
    const viaProxy = await shell(
      sandbox,
      'curl -s -o /dev/null -w "%{http_code}" --max-time 5 http://never.test/ || true',
    );
    expect(viaProxy).toMatch(/^[45]\d\d$/);
  });

  it('the other sandbox’s API (and commands in it) stay out of reach', async () => {
    const sandbox = moat.moat.runtime.sandbox(created.sandboxID)!;
    const port = moat.moat.listening.sandbox.port;
    const request = [
      `POST /process.Process/Start HTTP/1.1`,
      `Host: 127.0.0.1:${port}`,
      `E2b-Sandbox-Id: ${other.sandboxID}`,
      'E2b-Sandbox-Port: 49983',
      'Connect-Protocol-Version: 1',
      'Content-Type: application/connect+json',
      'Content-Length: 0',
      '',
      '',
    ].join('\r\n');
    const result = await runShell(
      sandbox,
      'printf "$1" | timeout 5 python3 -c "import socket,sys; s=socket.create_connection((\'127.0.0.1\', int(sys.argv[1])), 3); s.sendall(sys.stdin.buffer.read()); print(s.recv(100))" "$2"',
      { args: [request.replaceAll('%', '%%'), String(port)] },
    );
    expect(result.stdout).not.toContain('HTTP/1.1 200');
    expect(result.code).not.toBe(0);
  });

  it('reports its own limits and that it is confined', async () => {
    const detail = (await moat.api.get(`/sandboxes/${created.sandboxID}`)).body as Record<
      string,
      unknown
    >;
    expect(detail).toMatchObject({
      cpuCount: 1,
      memoryMB: 300,
      diskSizeMB: 200,
      confinement: 'confined',
    });
  });
});

describe.skipIf(skip)('proxy mode: the guard a killed Moat left', () => {
  it('goes when the next Moat takes that id range: its egress proxy answers on a port the dead guard refused', async () => {
    // A range of its own, outside `auto` (2^30..2^31), so no other suite's Moat takes it.
    const first = 2 ** 31 + 2 ** 28;
    const range = { flag: `${first}+4`, rule: `skuid ${first}-${first + 4 * 65_536 - 1} ` };
    const guards = () => execFileSync('/usr/sbin/nft', ['list', 'ruleset'], { encoding: 'utf8' });
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'moat-killed-'));
    let next: ApiMoat | undefined;
    try {
      const killed = new ServeChild(
        loopbackServeArgs(dataDir, await freePort(), ['--sandbox-ids', range.flag]),
      );
      const apiPort = Number((await killed.started()).api.split(':').pop());
      await killed.kill();
      expect(guards()).toContain(range.rule);

      // The next Moat over the range puts its egress proxy where the dead one's API was.
      next = await startApiMoat(new Map(), {
        'sandbox-ids': range.flag,
        'proxy-listen': `127.0.0.1:${apiPort}`,
        'sandbox-memory-mb': '300',
        'sandbox-disk-mb': '200',
      });
      const { sandboxID } = await next.api.sandbox({ secure: false });
      const sandbox = next.moat.runtime.sandbox(sandboxID)!;
      const reached = await runShell(sandbox, 'exec python3 -c "$1" "$2"', {
        args: [CONNECT, String(apiPort)],
      });
      expect(reached.stdout.trim(), reached.stderr).toBe('answered');
      await next.stop();
      next = undefined;
      expect(guards()).not.toContain(range.rule);
    } finally {
      await next?.stop();
      // What the killed one left mounted, its data folder's next Moat takes down.
      const cleanup = new ServeChild(loopbackServeArgs(dataDir, await freePort()));
      await cleanup.started();
      await cleanup.stop('SIGTERM');
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});
