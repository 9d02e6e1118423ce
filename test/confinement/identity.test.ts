/**
 * Attacker tests: who a sandbox's processes are on the host, and what its root can do. Each
 * test tries, from inside a sandbox, an escape that worked before confinement (issue: the
 * sandbox's user was host uid 0; its root could remount the host's folders read-write) and
 * shows it closed. Nothing here writes a value to any /proc/sys file: writes are only opened.
 */
import { existsSync, readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IDS_PER_SANDBOX, type RuntimeSandbox } from '../../src/runtime/index.js';
import { hostPathOf, runShell, shell } from '../support/sandbox-shell.js';
import { type Harness, skipReason, startHarness } from './runtime-harness.js';

const skip = skipReason('confinement/identity');
let harness: Harness;
let sandbox: RuntimeSandbox;
let other: RuntimeSandbox;

beforeAll(async () => {
  if (skip) return;
  harness = await startHarness();
  sandbox = await harness.sandbox();
  other = await harness.sandbox();
}, 60_000);

afterAll(async () => {
  await harness?.close();
});

/** Host uid, gid and PID namespace of a host pid. */
function hostIdentity(pid: number): { uid: number; gid: number; pidns: string } | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const uid = Number(/^Uid:\s+(\d+)/m.exec(status)![1]);
    const gid = Number(/^Gid:\s+(\d+)/m.exec(status)![1]);
    return { uid, gid, pidns: readlinkSync(`/proc/${pid}/ns/pid`) };
  } catch {
    return undefined; // ended meanwhile
  }
}

const asRoot = (script: string, target = sandbox) => shell(target, script, { user: 'root' });
const python = (code: string, user = 'user') =>
  runShell(sandbox, 'exec python3 -c "$1"', { user, args: [code] });

describe.skipIf(skip)('no sandbox process is the host root or owns anything outside', () => {
  it('every process in the sandbox runs as host ids of its own slot, never 0', async () => {
    // Keep a process of each user alive while the ids are read from the host.
    const sleepers = [shell(sandbox, 'sleep 2'), shell(sandbox, 'sleep 2', { user: 'root' })];
    await new Promise((resolve) => setTimeout(resolve, 300));
    const range = harness.runtime.sandboxHostIds!;
    const hostPidns = readlinkSync('/proc/self/ns/pid');
    const inside = (await sandbox.processIds())
      .map((pid) => ({ pid, id: hostIdentity(pid) }))
      .filter((p) => p.id !== undefined && p.id.pidns !== hostPidns);
    // The init, a launcher per user and the two sleeps at least.
    expect(inside.length).toBeGreaterThanOrEqual(4);
    const uids = new Set(inside.map((p) => p.id!.uid));
    for (const { id } of inside) {
      expect(id!.uid).toBeGreaterThanOrEqual(range.first + IDS_PER_SANDBOX);
      expect(id!.uid).toBeLessThanOrEqual(range.last);
      expect(id!.gid).not.toBe(0);
    }
    // Root inside and the user inside are two host ids of the same slot.
    const slotOf = (uid: number) => Math.floor((uid - range.first) / IDS_PER_SANDBOX);
    expect(new Set([...uids].map(slotOf)).size).toBe(1);
    expect(uids.size).toBe(2);
    // Another sandbox has another slot.
    const otherUids = (await other.processIds())
      .map(hostIdentity)
      .filter((id) => id !== undefined && id.pidns !== hostPidns)
      .map((id) => slotOf(id!.uid));
    expect(otherUids.length).toBeGreaterThan(0);
    expect(otherUids.every((slot) => slot !== slotOf([...uids][0]!))).toBe(true);
    await Promise.all(sleepers);
  });

  it('the user namespace maps the sandbox onto its slot (uid_map does not name 0)', async () => {
    const map = (await shell(sandbox, 'cat /proc/self/uid_map')).trim().split(/\s+/);
    expect(map[0]).toBe('0');
    expect(Number(map[1])).toBeGreaterThan(0);
    expect(map[2]).toBe(String(IDS_PER_SANDBOX));
    expect((await shell(sandbox, 'id -u; id -u root')).split('\n').slice(0, 2)).toEqual([
      '1000',
      '0',
    ]);
  });

  it('files the sandbox writes belong on the host to its own ids', async () => {
    await shell(sandbox, 'echo mine > /home/user/owned.txt');
    await asRoot('echo root > /root/owned.txt');
    const range = harness.runtime.sandboxHostIds!;
    const userFile = statSync(
      hostPathOf(harness.dataDir, sandbox.sandboxID, '/home/user/owned.txt'),
    );
    const rootFile = statSync(hostPathOf(harness.dataDir, sandbox.sandboxID, '/root/owned.txt'));
    expect(userFile.uid - rootFile.uid).toBe(1000);
    expect(rootFile.uid).toBeGreaterThanOrEqual(range.first + IDS_PER_SANDBOX);
    expect(rootFile.uid % IDS_PER_SANDBOX).toBe(range.first % IDS_PER_SANDBOX);
  });

  it('the host’s /etc/shadow is not there: the user cannot read the sandbox’s, root reads only locked entries', async () => {
    const denied = await runShell(sandbox, 'cat /etc/shadow');
    expect(denied.code).not.toBe(0);
    expect(denied.stderr).toMatch(/Permission denied/);
    const shadow = await asRoot('cat /etc/shadow');
    for (const line of shadow.trim().split('\n')) expect(line.split(':')[1]).toBe('*');
    if (existsSync('/etc/shadow')) {
      const hostRoot = readFileSync('/etc/shadow', 'utf8')
        .split('\n')
        .find((l) => l.startsWith('root:'));
      expect(shadow).not.toContain(hostRoot!);
    }
    // Nothing the host keeps out of other users' reach is in the sandbox's /etc.
    const hostSecrets = readdirSync('/etc').filter((name) => {
      const mode = statSync(`/etc/${name}`, { throwIfNoEntry: false })?.mode ?? 0o777;
      return (mode & 0o004) === 0 && !['shadow', 'gshadow'].includes(name);
    });
    for (const name of hostSecrets) {
      expect(await asRoot(`test -e /etc/${name} && echo present || echo absent`), name).toBe(
        'absent\n',
      );
    }
  });

  it('/proc/sys cannot be opened for writing, by the user or by root (nothing is written)', async () => {
    // boot_id is the sandbox's own (a file over the kernel's): read-only to its root too.
    const code =
      "import os\nfor p in ['/proc/sys/kernel/core_pattern', '/proc/sys/vm/drop_caches', '/proc/sysrq-trigger', '/proc/sys/kernel/random/boot_id']:\n" +
      '    try:\n        fd = os.open(p, os.O_WRONLY)\n    except OSError as e:\n        print(p, e.errno)\n' +
      '    else:\n        os.close(fd)\n        print(p, "OPENED")\n';
    for (const user of ['user', 'root']) {
      const result = await python(code, user);
      expect(result.stdout, user).not.toContain('OPENED');
      expect(result.stdout.trim().split('\n')).toHaveLength(4);
    }
  });
});

describe.skipIf(skip)('the sandbox’s root owns its sandbox, and nothing else', () => {
  it('cannot remount, mount, unmount or make namespaces', async () => {
    for (const command of [
      'mount -o remount,rw,bind /usr',
      'mount -o remount,rw /etc',
      'mount -t tmpfs none /mnt',
      'umount -l /proc/sys',
      'umount /proc/sys/kernel/random/boot_id',
      'unshare -U true',
      'unshare -m true',
      'unshare -n true',
    ]) {
      const result = await runShell(sandbox, command, { user: 'root' });
      expect(result.code, command).not.toBe(0);
    }
    // /proc/sys and the sandbox's own boot_id over the kernel's stay read-only under root.
    for (const point of ['/proc/sys', '/proc/sys/kernel/random/boot_id']) {
      expect(
        await asRoot(`grep " ${point} " /proc/self/mounts | cut -d" " -f4 | cut -d, -f1`),
      ).toBe('ro\n');
    }
  });

  it('has only a container root’s capabilities: no SYS_ADMIN, SYS_PTRACE, NET_ADMIN, NET_RAW, SYS_MODULE', async () => {
    const status = await asRoot('grep -E "^Cap(Eff|Bnd)" /proc/self/status');
    for (const line of status.trim().split('\n')) {
      const caps = BigInt(`0x${line.split(/\s+/)[1]}`);
      for (const cap of [21, 19, 12, 13, 16, 2, 17, 25, 22]) {
        expect((caps >> BigInt(cap)) & 1n, `${line} capability ${cap}`).toBe(0n);
      }
    }
    const user = await shell(sandbox, 'grep -E "^Cap(Eff|Bnd|Prm)" /proc/self/status');
    for (const line of user.trim().split('\n')) expect(line.split(/\s+/)[1]).toMatch(/^0+$/);
    expect(await shell(sandbox, 'grep NoNewPrivs /proc/self/status')).toMatch(/NoNewPrivs:\s+1/);
    expect(await shell(sandbox, 'grep "^Seccomp:" /proc/self/status')).toMatch(/Seccomp:\s+2/);
  });

  it('installs into its own /usr and /usr/local (apt-get and pip style); the host’s are unchanged', async () => {
    const marker = `moat-confinement-${process.pid}`;
    await asRoot(
      [
        `echo '#!/bin/sh' > /usr/bin/${marker} && echo 'echo installed' >> /usr/bin/${marker}`,
        `chmod 755 /usr/bin/${marker}`,
        `mkdir -p /usr/local/lib/python3/dist-packages/${marker.replaceAll('-', '_')}`,
        `echo 'VALUE = 42' > /usr/local/lib/python3/dist-packages/${marker.replaceAll('-', '_')}/__init__.py`,
        'echo "sandbox-local" >> /etc/hosts',
        'echo patched > /usr/share/moat-patched.txt',
      ].join(' && '),
    );
    expect(await shell(sandbox, marker)).toBe('installed\n');
    expect(
      await shell(
        sandbox,
        `PYTHONPATH=/usr/local/lib/python3/dist-packages python3 -c 'import ${marker.replaceAll('-', '_')} as m; print(m.VALUE)'`,
      ),
    ).toBe('42\n');
    expect(existsSync(`/usr/bin/${marker}`)).toBe(false);
    expect(existsSync(`/usr/local/lib/python3/dist-packages/${marker.replaceAll('-', '_')}`)).toBe(
      false,
    );
    expect(existsSync('/usr/share/moat-patched.txt')).toBe(false);
    expect(readFileSync('/etc/hosts', 'utf8')).not.toContain('sandbox-local');
    // Nor does another sandbox see it.
    expect((await runShell(other, `command -v ${marker}`)).code).not.toBe(0);
  });

  it('the seccomp filter refuses the kernel’s sharpest calls with EPERM', async () => {
    if (process.arch !== 'x64') return; // syscall numbers below are x86_64's
    const calls: Record<string, number> = {
      bpf: 321,
      keyctl: 250,
      add_key: 248,
      perf_event_open: 298,
      userfaultfd: 323,
      open_by_handle_at: 304,
      io_uring_setup: 425,
      init_module: 175,
      kexec_load: 246,
      setns: 308,
      mount: 165,
    };
    const code =
      'import ctypes, json, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nout = {}\n' +
      'for name, nr in json.loads(sys.argv[1]).items():\n' +
      '    r = libc.syscall(nr, 0, 0, 0, 0, 0)\n    out[name] = ctypes.get_errno() if r < 0 else "ok"\n' +
      'print(json.dumps(out))\n';
    for (const user of ['user', 'root']) {
      const result = await runShell(sandbox, 'exec python3 -c "$1" "$2"', {
        user,
        args: [code, JSON.stringify(calls)],
      });
      const errnos = JSON.parse(result.stdout) as Record<string, number | string>;
      for (const name of Object.keys(calls)) expect(errnos[name], `${user} ${name}`).toBe(1);
    }
  });

  it('refuses vsock sockets and personality flags that weaken a program, allows the plain ones', async () => {
    if (process.arch !== 'x64') return; // syscall numbers below are x86_64's
    const code = `
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(nr, *[ctypes.c_ulong(a) for a in args])
    return ctypes.get_errno() if r == -1 else 'ok'
out = {'vsock': call(41, 40, 1, 0), 'unix': call(41, 1, 1, 0)}
for value in (0, 0x8, 0x20000, 0x20008, 0xffffffff, 0x400000, 0x40000, 0x200000, 0x1, 0xfffffffe):
    out[hex(value)] = call(135, value)
    call(135, 0)
print(json.dumps(out))
`;
    const result = JSON.parse(
      await shell(sandbox, 'exec python3 -c "$1"', { user: 'root', args: [code] }),
    ) as Record<string, number | string>;
    expect(result).toEqual({
      vsock: 97, // EAFNOSUPPORT
      unix: 'ok',
      '0x0': 'ok',
      '0x8': 'ok',
      '0x20000': 'ok',
      '0x20008': 'ok',
      '0xffffffff': 'ok',
      '0x400000': 1, // READ_IMPLIES_EXEC
      '0x40000': 1, // ADDR_NO_RANDOMIZE
      '0x200000': 1, // ADDR_COMPAT_LAYOUT
      '0x1': 1,
      '0xfffffffe': 1,
    });
  });

  it('process 1 shows no host configuration in its command line', async () => {
    const cmdline = await shell(sandbox, 'tr "\\0" " " < /proc/1/cmdline');
    expect(cmdline).not.toMatch(/cgroup|"ids"/);
  });
});
