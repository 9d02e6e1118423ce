"""Linux system calls the standard library of Python 3.11 does not wrap, through ctypes.

Every call raises OSError with the errno and the call's name, so a failure says which step of
building a sandbox went wrong.
"""
import ctypes
import errno
import os
import platform
import struct

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# Numbers of the calls glibc 2.36 has no wrapper for. Calls added since Linux 5.0 have one number
# on every architecture; the older ones differ between x86_64 and the generic table (arm64).
_GENERIC = {'pivot_root': 41, 'capget': 90, 'capset': 91}
_X86_64 = {'pivot_root': 155, 'capget': 125, 'capset': 126}
_NR = dict(_X86_64 if platform.machine() == 'x86_64' else _GENERIC)
_NR.update({'open_tree': 428, 'move_mount': 429, 'mount_setattr': 442, 'openat2': 437})

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_SLAVE = 0x80000
MNT_DETACH = 0x2

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 0x1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
RENAME_NOREPLACE = 0x1

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECUREBITS = 28
SECBIT_NO_SETUID_FIXUP = 1 << 2
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_LAST = 40


def _check(result, what):
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f'{what}: {os.strerror(code)}')
    return result


def _path(value):
    return None if value is None else os.fsencode(value)


def unshare(flags):
    _check(_libc.unshare(ctypes.c_int(flags)), 'unshare')


def setns(fd, nstype):
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), 'setns')


def mount(source, target, fstype, flags, data=None):
    _check(
        _libc.mount(_path(source), _path(target), _path(fstype), ctypes.c_ulong(flags), _path(data)),
        f'mount {fstype or ""} on {target}',
    )


def umount(target, flags=0):
    _check(_libc.umount2(_path(target), ctypes.c_int(flags)), f'umount {target}')


def pivot_root(new_root, put_old):
    _check(_libc.syscall(_NR['pivot_root'], _path(new_root), _path(put_old)), 'pivot_root')


def sethostname(name):
    data = name.encode()
    _check(_libc.sethostname(data, ctypes.c_size_t(len(data))), 'sethostname')


def prctl(option, arg2=0, arg3=0, arg4=0, arg5=0):
    return _check(
        _libc.prctl(
            ctypes.c_int(option),
            ctypes.c_ulong(arg2),
            ctypes.c_ulong(arg3),
            ctypes.c_ulong(arg4),
            ctypes.c_ulong(arg5),
        ),
        f'prctl {option}',
    )


def idmapped_clone(source, userns_fd, read_only):
    """A detached copy of the mount at `source` whose file owners are shown through `userns_fd`."""
    fd = _check(
        _libc.syscall(_NR['open_tree'], AT_FDCWD, _path(source), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC),
        f'open_tree {source}',
    )
    try:
        attr = struct.pack(
            'QQQQ',
            MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if read_only else 0),
            0,
            0,
            userns_fd,
        )
        buffer = ctypes.create_string_buffer(attr, len(attr))
        _check(
            _libc.syscall(_NR['mount_setattr'], fd, b'', AT_EMPTY_PATH, buffer, ctypes.c_size_t(len(attr))),
            f'mount_setattr idmap {source}',
        )
    except BaseException:
        os.close(fd)
        raise
    return fd


def move_mount(fd, target):
    _check(
        _libc.syscall(_NR['move_mount'], fd, b'', AT_FDCWD, _path(target), MOVE_MOUNT_F_EMPTY_PATH),
        f'move_mount to {target}',
    )


def openat2(dir_fd, path, flags, mode=0, resolve=0):
    """openat2(2): the kernel resolves `path` under `dir_fd` as `resolve` says."""
    how = struct.pack('QQQ', flags | os.O_CLOEXEC, mode, resolve)
    buffer = ctypes.create_string_buffer(how, len(how))
    result = _libc.syscall(_NR['openat2'], dir_fd, _path(path), buffer, ctypes.c_size_t(len(how)))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return result


def rename_noreplace(dir_fd, old, new):
    """renameat2(2) of `old` to `new` in one opened folder, failing (EEXIST) where `new` exists."""
    _check(_libc.renameat2(dir_fd, _path(old), dir_fd, _path(new), RENAME_NOREPLACE), f'rename to {new}')


class _CapHeader(ctypes.Structure):
    _fields_ = [('version', ctypes.c_uint32), ('pid', ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [('effective', ctypes.c_uint32), ('permitted', ctypes.c_uint32), ('inheritable', ctypes.c_uint32)]


def limit_bounding_set(keep):
    """Drops every capability not in `keep` from the bounding set: no exec can gain it again.

    Needs CAP_SETPCAP; the effective set is left as it is (the caller may still need it).
    """
    for cap in range(CAP_LAST + 1):
        if cap not in keep:
            try:
                prctl(PR_CAPBSET_DROP, cap)
            except OSError as error:
                if error.errno != errno.EINVAL:  # a capability this kernel does not know
                    raise
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def set_capabilities(keep):
    """Makes the effective and permitted sets exactly `keep` and the inheritable set empty."""
    mask = 0
    for cap in keep:
        mask |= 1 << cap
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    for index in range(2):
        word = (mask >> (32 * index)) & 0xFFFFFFFF
        data[index].effective = word
        data[index].permitted = word
        data[index].inheritable = 0
    _check(_libc.syscall(_NR['capset'], ctypes.byref(header), data), 'capset')


def effective_capabilities():
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    _check(_libc.syscall(_NR['capget'], ctypes.byref(header), data), 'capget')
    return data[0].effective | (data[1].effective << 32)


IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_INOTIFY_EVENT = struct.Struct('iIII')


def inotify_init():
    return _check(_libc.inotify_init1(ctypes.c_int(IN_NONBLOCK | IN_CLOEXEC)), 'inotify_init1')


def inotify_add_watch(fd, path, mask):
    result = _libc.inotify_add_watch(ctypes.c_int(fd), _path(path), ctypes.c_uint32(mask))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return result


def inotify_rm_watch(fd, wd):
    _libc.inotify_rm_watch(ctypes.c_int(fd), ctypes.c_int(wd))


def inotify_events(data):
    """(wd, mask, cookie, name) of each event in one read of an inotify descriptor."""
    offset = 0
    while offset + _INOTIFY_EVENT.size <= len(data):
        wd, mask, cookie, length = _INOTIFY_EVENT.unpack_from(data, offset)
        start = offset + _INOTIFY_EVENT.size
        name = data[start : start + length].split(b'\0', 1)[0]
        offset = start + length
        yield wd, mask, cookie, os.fsdecode(name)
