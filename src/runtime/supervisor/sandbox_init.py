"""The sandbox's init: process 1 of the sandbox's PID namespace.

It starts as host root (so that what it mounts is locked against the sandbox), builds the
sandbox's file system in a mount namespace of its own, pivots into it, then enters the
sandbox's user namespace and a fresh mount namespace owned by it: every mount made before is
now locked (cannot be unmounted or made writable from inside). It then keeps only the
capabilities a sandbox's root may have, sets no_new_privs, loads the seccomp filter, and from
then on forks the sandbox's roles (launchers and file agents) on the supervisor's request,
and reaps every orphan of the sandbox.
"""
import json
import os
import resource
import selectors
import signal
import socket
import uuid

import files
import launcher
import seccomp_policy
import sysapi

# What a sandbox's root may do, as in Docker's default set (CAP_* numbers): chown, dac_override,
# fowner, fsetid, kill, setgid, setuid, setpcap, net_bind_service, sys_chroot, mknod,
# audit_write, setfcap. Not: sys_admin (mount), sys_ptrace, net_admin, net_raw, sys_module...
ROOT_CAPABILITIES = frozenset([0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 27, 29, 31])
PROC_READ_ONLY = ['sys', 'sysrq-trigger', 'irq', 'bus', 'fs']
PROC_MASKED = ['kcore', 'keys', 'timer_list', 'sched_debug', 'latency_stats']
BOOT_ID = 'sys/kernel/random/boot_id'
DEVICES = ['null', 'zero', 'full', 'random', 'urandom', 'tty']
BASE_FLAGS = sysapi.MS_NOSUID | sysapi.MS_NODEV
# The Debian system bundle; /usr/lib/ssl/cert.pem and the variables Moat sets name it.
TRUST_BUNDLE = '/etc/ssl/certs/ca-certificates.crt'


def escape(path):
    """A path as one overlay mount option value."""
    return path.replace('\\', '\\\\').replace(':', '\\:').replace(',', '\\,')


def bind(source, target, flags):
    sysapi.mount(source, target, None, sysapi.MS_BIND)
    sysapi.mount(None, target, None, sysapi.MS_REMOUNT | sysapi.MS_BIND | flags)


def build_root(config, sandbox_ns, store_ns):
    """Mounts the sandbox's file system at config['root'] (in this mount namespace only)."""
    root = config['root']
    scratch = config['scratch']
    sysapi.mount('tmpfs', scratch, 'tmpfs', BASE_FLAGS | sysapi.MS_NOEXEC, 'mode=700,size=64k')
    layer = 0
    for overlay in config['overlays']:
        lowers = []
        for lower in overlay['lowers']:
            layer += 1
            point = os.path.join(scratch, str(layer))
            os.mkdir(point, 0o700)
            namespace = sandbox_ns if lower['ids'] == 'host' else store_ns
            fd = sysapi.idmapped_clone(lower['path'], namespace, read_only=True)
            try:
                sysapi.move_mount(fd, point)
            finally:
                os.close(fd)
            lowers.append(escape(point))
        options = ','.join(
            [
                f"lowerdir={':'.join(lowers)}",
                f"upperdir={escape(overlay['upper'])}",
                f"workdir={escape(overlay['work'])}",
                'redirect_dir=off',
                'index=off',
                'metacopy=off',
            ]
        )
        sysapi.mount('overlay', os.path.join(root, overlay['target'].lstrip('/')), 'overlay', BASE_FLAGS, options)
    build_dev(os.path.join(root, 'dev'), config)
    build_proc(os.path.join(root, 'proc'), scratch)


def build_dev(dev, config):
    sysapi.mount('tmpfs', dev, 'tmpfs', sysapi.MS_NOSUID | sysapi.MS_NOEXEC, 'mode=755,size=64k')
    for name in DEVICES:
        target = os.path.join(dev, name)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        bind(f'/dev/{name}', target, sysapi.MS_NOSUID | sysapi.MS_NOEXEC)
    os.mkdir(os.path.join(dev, 'pts'), 0o755)
    tty_gid = config['ids']['host'] + 5
    # max=: the ptys of every sandbox's devpts come from one pool of the host's (kernel.pty.max
    # less kernel.pty.reserve); each sandbox takes at most its own share.
    ptys = config['limits']['ptys']
    sysapi.mount('devpts', os.path.join(dev, 'pts'), 'devpts', sysapi.MS_NOSUID | sysapi.MS_NOEXEC, f'newinstance,ptmxmode=0666,mode=620,gid={tty_gid},max={ptys}')
    os.symlink('pts/ptmx', os.path.join(dev, 'ptmx'))
    os.mkdir(os.path.join(dev, 'shm'), 0o1777)
    sysapi.mount('tmpfs', os.path.join(dev, 'shm'), 'tmpfs', BASE_FLAGS, f"mode=1777,size={config['shmBytes']},uid={config['ids']['host']},gid={config['ids']['host']}")
    for name, target in [('fd', '/proc/self/fd'), ('stdin', '/proc/self/fd/0'), ('stdout', '/proc/self/fd/1'), ('stderr', '/proc/self/fd/2')]:
        os.symlink(target, os.path.join(dev, name))
    os.chmod(dev, 0o755)


def build_proc(proc, scratch):
    sysapi.mount('proc', proc, 'proc', BASE_FLAGS | sysapi.MS_NOEXEC)
    for name in PROC_READ_ONLY:
        target = os.path.join(proc, name)
        if os.path.exists(target):
            sysapi.mount(target, target, None, sysapi.MS_BIND | sysapi.MS_REC)
            sysapi.mount(None, target, None, sysapi.MS_REMOUNT | sysapi.MS_BIND | sysapi.MS_RDONLY | BASE_FLAGS | sysapi.MS_NOEXEC)
    for name in PROC_MASKED:
        target = os.path.join(proc, name)
        if os.path.exists(target):
            sysapi.mount('/dev/null', target, None, sysapi.MS_BIND)
    mount_boot_id(proc, scratch)


def mount_boot_id(proc, scratch):
    """A boot id of this start of the sandbox over the kernel's, read-only and locked like every
    mount made here: the sandbox booted again whenever its init starts again (at create, and at
    a resume from files only), as E2B's cold boot shows. The host's own is never written."""
    source = os.path.join(scratch, 'boot_id')
    fd = os.open(source, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    with os.fdopen(fd, 'w') as boot_id:
        boot_id.write(f'{uuid.uuid4()}\n')
    bind(source, os.path.join(proc, BOOT_ID), BASE_FLAGS | sysapi.MS_NOEXEC | sysapi.MS_RDONLY)


def trust_bundle_mount(config, sandbox_ns):
    """A read-only copy of the mount of Moat's CA bundle file (host root shown as the sandbox's root)."""
    bundle = config.get('trustBundle')
    return None if bundle is None else sysapi.idmapped_clone(bundle, sandbox_ns, read_only=True)


def mount_trust_bundle(fd):
    """Puts the bundle over the system bundle; called in the sandbox's root, before confine()
    locks every mount: no process of the sandbox, root included, can change or unmount it."""
    target = TRUST_BUNDLE
    if not os.path.isfile(target):
        # Removed in its template: made again (owned by no user of the sandbox) to mount on.
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o644))
    try:
        sysapi.move_mount(fd, target)
    finally:
        os.close(fd)


def enter_root(root):
    os.chdir(root)
    sysapi.pivot_root('.', '.')
    sysapi.umount('.', sysapi.MNT_DETACH)
    os.chdir('/')


def confine(config, sandbox_ns):
    """Becomes the sandbox's root: its user namespace, a locked mount namespace, bounded limits."""
    sysapi.setns(sandbox_ns, sysapi.CLONE_NEWUSER)
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    # Copied from a namespace owned by the host's root: every mount is locked from here on.
    sysapi.unshare(sysapi.CLONE_NEWNS)
    # Only ever lowered: raising a hard limit needs a capability no sandbox has.
    nofile = min(config['limits']['nofile'], resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sysapi.limit_bounding_set(ROOT_CAPABILITIES)
    sysapi.set_capabilities(ROOT_CAPABILITIES)


def start_role(config, message, sock, confined):
    """The forked role: takes the user's identity and serves Moat on `sock` until it closes."""
    user = config['users'][message['user']]
    uid, gid = user['uid'], user['gid']
    if confined:
        # The bounding set first (while CAP_SETPCAP is effective), then the identity: a change to
        # a uid other than 0 empties the effective and permitted sets.
        sysapi.limit_bounding_set(ROOT_CAPABILITIES if uid == 0 else frozenset())
        os.setgroups([gid])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        root = '/'
        home = user['home']
    else:
        root = config['root']
        home = user['home']
    try:
        os.chdir(os.path.join(root, home.lstrip('/')))
    except OSError:
        os.chdir(root)
    os.environ.clear()
    if message['role'] == 'proc':
        launcher.serve(sock)
    else:
        files.serve(sock, root, home, message['user'], not confined)


def serve_roles(config, broker, confined):
    """Forks a role for each socket the supervisor passes; reaps every child and orphan."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # Python's own SIGINT handler would let `kill -INT 1` from inside end the sandbox; with no
    # handler, the kernel drops what the namespace sends its process 1.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # Spawn number to the pid of the role it started, until that role is reaped: a pid here is
    # never one the kernel gave to another process since.
    roles = {}
    selector = selectors.DefaultSelector()
    selector.register(broker, selectors.EVENT_READ, 'broker')
    selector.register(wake_r, selectors.EVENT_READ, 'wake')
    while True:
        for key, _ in selector.select():
            if key.data == 'wake':
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                ended = reap()
                for spawn in [spawn for spawn, pid in roles.items() if pid in ended]:
                    del roles[spawn]
                continue
            try:
                data, fds, _, _ = socket.recv_fds(broker, 4096, 1)
            except InterruptedError:
                continue
            if not data:
                os._exit(0)
            message = json.loads(data)
            if 'kill' in message:
                # Moat gave up on this role (it missed a deadline): a stopped role ends too.
                pid = roles.pop(message['kill'], None)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                continue
            for fd in fds:
                pid = os.fork()
                if pid == 0:
                    try:
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        broker.close()
                        os.close(wake_r)
                        os.close(wake_w)
                        start_role(config, message, fd, confined)
                    finally:
                        os._exit(0)
                roles[message['spawn']] = pid
                os.close(fd)


def reap():
    """Waits for every ended child and orphan; returns their pids."""
    ended = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append(pid)


def run(config, broker, sandbox_ns, store_ns):
    """Process 1 of the sandbox (confined) or the role forker (unconfined); never returns."""
    confined = config['mode'] == 'confined'
    try:
        sysapi.prctl(sysapi.PR_SET_PDEATHSIG, signal.SIGKILL)
        if confined:
            sysapi.sethostname(config['hostname'])
            sysapi.unshare(sysapi.CLONE_NEWNS)
            sysapi.mount(None, '/', None, sysapi.MS_REC | sysapi.MS_PRIVATE)
            build_root(config, sandbox_ns, store_ns)
            # Cloned while the host's tree is visible; mounted once paths resolve in the sandbox's
            # own root, where no symbolic link of its files can point into the host's.
            bundle = trust_bundle_mount(config, sandbox_ns)
            enter_root(config['root'])
            if bundle is not None:
                mount_trust_bundle(bundle)
            confine(config, sandbox_ns)
            os.close(sandbox_ns)
            os.close(store_ns)
        sysapi.prctl(sysapi.PR_SET_NO_NEW_PRIVS, 1)
        if config['seccomp']:
            seccomp_policy.load()
    except BaseException as error:  # noqa: BLE001 - the supervisor reports every failure
        broker.sendall(json.dumps({'ev': 'failed', 'error': f'{type(error).__name__}: {error}'}).encode())
        os._exit(1)
    broker.sendall(json.dumps({'ev': 'ready'}).encode())
    serve_roles(config, broker, confined)
