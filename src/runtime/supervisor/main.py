"""The sandbox supervisor: Moat starts one per sandbox (`python3 -I -S -B main.py`).

It runs as the host's root in the host's mount namespace and never looks at the sandbox's
files itself. Moat starts it ahead of the sandbox that will use it, with what can be done early
as a first JSON line on its stdin (the cgroup folders, the sandbox's host ids), so that little
is left when a create asks. At once it

1. makes itself undumpable and dies with Moat (no process of the sandbox can take its file
   descriptors), joins the sandbox's cgroups and makes two user namespaces: the sandbox's own
   (its ids 0..count-1 are the host ids given to this sandbox) and one that shows Moat's stored
   layers (kept under the store ids) as the sandbox's ids.

Then Moat writes a second JSON line, the sandbox's configuration, and it

2. makes the sandbox's writable layer folders and, in namespace mode, joins its network
   namespace;
3. forks the sandbox's init (sandbox_init.py) into new PID, IPC, UTS and cgroup namespaces;
4. brokers roles: for each `{"op":"spawn","spawn","token","role","user"}` line from Moat it
   connects to Moat's agent socket, introduces itself with the spawn's number and token and
   hands the connection to the init, which forks the role (launcher or file agent) inside;
   `{"op":"kill","spawn"}` has the init kill that role (Moat gave up on it).

Events to Moat, one JSON line each: {"ev":"ready","pid":P}, {"ev":"failed","error"},
{"ev":"spawned","spawn"}, {"ev":"spawn-failed","spawn","error"}.
Closing its stdin ends the sandbox (the init and everything in its PID namespace).
"""
import array  # noqa: F401 - socket.recv_fds imports it on first use: load it from the host
import json
import os
import selectors
import signal
import socket
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]
import frames  # noqa: E402
import sandbox_init  # noqa: E402
import sysapi  # noqa: E402

# Nothing is imported once the sandbox's file system is in place.
sys.path.clear()

# Moat may start this process ahead of its sandbox, to have it ready: from the first moment it
# dies with Moat and keeps its descriptors to itself.
sysapi.prctl(sysapi.PR_SET_PDEATHSIG, signal.SIGKILL)
sysapi.prctl(sysapi.PR_SET_DUMPABLE, 0)


def emit(event):
    os.write(1, (json.dumps(event) + '\n').encode())


def user_namespace(inside, outside, count, owner=0, limits=None):
    """A user namespace (kept alive by the returned descriptor) mapping inside..+count to outside.

    Its owner is host uid `owner`: the kernel charges what the namespace's users take of
    per-user limits (inotify instances and watches, message queues, pending signals...) to
    them and, one level up, to its owner, so a sandbox's namespace owned by its own host uid
    is charged to that uid, never to the host's root. `limits` are the namespace's own
    /proc/sys/user values (name: number), a bound on each of its users.
    """
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            if owner != 0:
                # Capabilities kept across the change of effective uid (some kernels want
                # CAP_SYS_ADMIN to make a user namespace); only this short-lived helper has it.
                sysapi.prctl(sysapi.PR_SET_SECUREBITS, sysapi.SECBIT_NO_SETUID_FIXUP)
                os.setresuid(-1, owner, -1)
            sysapi.unshare(sysapi.CLONE_NEWUSER)
            # Full capabilities in the new namespace: its own limits are ours to set. Which
            # namespace /proc/sys/user shows is the writer's, never the host's.
            for name, value in (limits or {}).items():
                with open(f'/proc/sys/user/{name}', 'w') as limit:
                    limit.write(str(int(value)))
            os.write(ready_w, b'x')
            os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        if os.read(ready_r, 1) != b'x':
            raise OSError('the user namespace helper failed')
        for name in ('uid_map', 'gid_map'):
            with open(f'/proc/{pid}/{name}', 'w') as table:
                table.write(f'{inside} {outside} {count}\n')
        return os.open(f'/proc/{pid}/ns/user', os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.write(go_w, b'x')
        os.waitpid(pid, 0)
        for fd in (ready_r, ready_w, go_r, go_w):
            os.close(fd)


def early(pre):
    """Step 1, before there is a sandbox: returns the two user namespace descriptors (or -1)."""
    if pre.get('ids') is None:
        return -1, -1
    # Spared by the sandbox's OOM killer where the host lets us (CAP_SYS_RESOURCE).
    try:
        with open('/proc/self/oom_score_adj', 'w') as adj:
            adj.write('-1000')
    except PermissionError:
        pass
    for folder in pre['cgroups']:
        with open(os.path.join(folder, 'cgroup.procs'), 'w') as procs:
            procs.write(str(os.getpid()))
    ids = pre['ids']
    sandbox_ns = user_namespace(0, ids['host'], ids['count'], owner=ids['host'], limits=pre.get('userLimits'))
    store_ns = user_namespace(ids['store'], ids['host'], ids['count'])
    return sandbox_ns, store_ns


def prepare(config):
    """Step 2, for this sandbox."""
    if config['mode'] != 'confined':
        return
    ids = config['ids']
    # The writable layer: an upper and a work folder per part, owned by the sandbox's root.
    for folder in [config['root'], config['scratch']]:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    for overlay in config['overlays']:
        for folder in (overlay['upper'], overlay['work']):
            if not os.path.isdir(folder):
                os.makedirs(os.path.dirname(folder), mode=0o700, exist_ok=True)
                os.mkdir(folder, 0o755)
                os.chown(folder, ids['host'], ids['host'])
    if config.get('netns'):
        fd = os.open(config['netns'], os.O_RDONLY | os.O_CLOEXEC)
        sysapi.setns(fd, sysapi.CLONE_NEWNET)
        os.close(fd)
    sysapi.unshare(sysapi.CLONE_NEWPID | sysapi.CLONE_NEWIPC | sysapi.CLONE_NEWUTS | sysapi.CLONE_NEWCGROUP)


def spawn(config, broker, request):
    """Connects a new role to Moat and passes the connection to the init."""
    spawn_id = request.get('spawn')
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(config['socket'])
        frames.send(connection.fileno(), {'spawn': spawn_id, 'token': request.get('token')})
        message = json.dumps({'role': request['role'], 'user': request['user'], 'spawn': spawn_id}).encode()
        socket.send_fds(broker, [message], [connection.fileno()])
        emit({'ev': 'spawned', 'spawn': spawn_id})
    except (OSError, KeyError, frames.ProtocolError) as error:
        emit({'ev': 'spawn-failed', 'spawn': spawn_id, 'error': str(error)})
    finally:
        connection.close()


def main():
    try:
        # On stdin, not in argv: the sandbox's process 1 is a fork of this one and would show
        # its argv (host paths, cgroups) in /proc/1/cmdline.
        first = sys.stdin.buffer.readline()
        if not first:
            return 0  # a spare Moat no longer needs
        sandbox_ns, store_ns = early(json.loads(first))
    except BaseException as error:  # noqa: BLE001 - every failure is reported to Moat
        emit({'ev': 'failed', 'error': f'{type(error).__name__}: {error}'})
        return 1
    line = sys.stdin.buffer.readline()
    if not line:
        return 0  # a spare Moat no longer needs
    config = json.loads(line)
    try:
        prepare(config)
        supervisor_end, init_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        init = os.fork()
    except BaseException as error:  # noqa: BLE001 - every failure is reported to Moat
        emit({'ev': 'failed', 'error': f'{type(error).__name__}: {error}'})
        return 1
    if init == 0:
        supervisor_end.close()
        os.dup2(os.open('/dev/null', os.O_RDWR), 0)
        os.dup2(0, 1)
        sandbox_init.run(config, init_end, sandbox_ns, store_ns)
        os._exit(1)
    init_end.close()
    for fd in (sandbox_ns, store_ns):
        if fd >= 0:
            os.close(fd)
    first = json.loads(supervisor_end.recv(4096) or b'{"ev":"failed","error":"the sandbox init ended"}')
    if first.get('ev') != 'ready':
        emit({'ev': 'failed', 'error': str(first.get('error'))[:4000]})
        return 1
    emit({'ev': 'ready', 'pid': init})
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, 'moat')
    selector.register(supervisor_end, selectors.EVENT_READ, 'init')
    pending = b''
    while True:
        for key, _ in selector.select():
            if key.data == 'init':
                # The init never writes after "ready": readable means it ended.
                if not supervisor_end.recv(4096):
                    return 0
                continue
            chunk = os.read(0, 1 << 16)
            if not chunk:
                os.kill(init, signal.SIGKILL)
                return 0
            pending += chunk
            while b'\n' in pending:
                line, pending = pending.split(b'\n', 1)
                request = json.loads(line)
                if request.get('op') == 'spawn':
                    spawn(config, supervisor_end, request)
                elif request.get('op') == 'kill':
                    supervisor_end.send(json.dumps({'kill': request.get('spawn')}).encode())


if __name__ == '__main__':
    sys.exit(main())
