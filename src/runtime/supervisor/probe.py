"""Whether this host can confine sandboxes as Moat does: prints {"ok": bool, "reason": "..."}.

    probe.py FOLDER    FOLDER: an empty folder on the file system that will hold sandbox layers

It tries, in a throwaway user and mount namespace, each kernel feature the supervisor needs:
a user namespace with a mapped id range, idmapped mounts of /usr and of FOLDER's file system,
an overlay over them, and the seccomp bindings.
"""
import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]
import seccomp_policy  # noqa: E402
import sysapi  # noqa: E402

FIRST = 2_000_000_000  # any ids: nothing is created with them


def userns():
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            sysapi.unshare(sysapi.CLONE_NEWUSER)
            os.write(ready_w, b'x')
            os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        if os.read(ready_r, 1) != b'x':
            raise OSError('cannot make a user namespace')
        for name in ('uid_map', 'gid_map'):
            with open(f'/proc/{pid}/{name}', 'w') as table:
                table.write(f'0 {FIRST} 65536\n')
        return os.open(f'/proc/{pid}/ns/user', os.O_RDONLY)
    finally:
        os.write(go_w, b'x')
        os.waitpid(pid, 0)


def check(folder):
    if os.getuid() != 0:
        return 'Moat is not running as root'
    if not seccomp_policy.available():
        return 'the seccomp bindings for Python are missing (Debian package python3-seccomp)'
    try:
        namespace = userns()
    except OSError as error:
        return f'user namespaces with a mapped id range do not work here ({error})'
    try:
        sysapi.unshare(sysapi.CLONE_NEWNS)
        sysapi.mount(None, '/', None, sysapi.MS_REC | sysapi.MS_PRIVATE)
        names = {}
        for name in ('usr', 'upper', 'work', 'merged', 'lower'):
            names[name] = os.path.join(folder, name)
            os.mkdir(names[name], 0o700)
        for source, target in (('/usr', names['usr']), (folder, names['lower'])):
            try:
                fd = sysapi.idmapped_clone(source, namespace, read_only=True)
                sysapi.move_mount(fd, target)
                os.close(fd)
            except OSError as error:
                return f'idmapped mounts of {source} are not supported here ({error}; Linux 5.19 or newer with ext4, xfs or btrfs is)'
        try:
            sysapi.mount(
                'overlay', names['merged'], 'overlay', 0,
                f"lowerdir={names['usr']},upperdir={names['upper']},workdir={names['work']}",
            )
        except OSError as error:
            return f'overlayfs over an idmapped mount does not work here ({error})'
        if os.stat(os.path.join(names['merged'], 'bin')).st_uid != FIRST:
            return 'idmapped mounts do not map owners here'
        return None
    finally:
        os.close(namespace)


def main():
    folder = sys.argv[1]
    pid = os.fork()
    if pid == 0:
        # The namespace changes stay in this child.
        reason = check(folder)
        print(json.dumps({'ok': reason is None, 'reason': reason or 'user namespaces, idmapped mounts, overlayfs, seccomp'}))
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)


if __name__ == '__main__':
    main()
