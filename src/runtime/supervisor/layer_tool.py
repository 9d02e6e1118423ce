"""Moat's layer store tool, run as the host's root on folders Moat owns.

    layer_tool.py base   OUT STORE_FIRST SPEC.json   the generated base layer (see build_base)
    layer_tool.py flatten OUT STORE_FIRST FROM_FIRST COUNT BUDGET UPPER [LOWER]
                                                     a snapshot: UPPER (a sandbox's writable layer,
                                                     ids FROM_FIRST..) merged over LOWER (the layer
                                                     it was made from, store ids), in store ids;
                                                     at most BUDGET bytes of data from UPPER
    layer_tool.py adopt  OUT FIRST COUNT HOME_UID SOURCE
                                                     a folder of Moat before layers (one owner) as a
                                                     layer: everything owned by HOME_UID, /root by 0

A layer holds one folder per part of the sandbox's file system (root, etc, usr...), each an
overlayfs layer: whiteouts are 0/0 character devices, opaque folders carry
trusted.overlay.opaque=y. Stored layers are owned by the store ids (STORE_FIRST + the id inside
the sandbox), which no process ever runs as.

A sandbox's writable layer is written by the sandbox, which may be running: every step here
opens relative to a folder already open and never follows a symlink, so nothing the sandbox
places there can lead the copy outside it.
"""
import errno
import json
import os
import posixpath
import stat as st
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__))]
import sysapi  # noqa: E402

# A Moat killed mid-copy removes what this tool was writing when it starts again: the tool must
# not outlive it and write on into a folder being removed.
sysapi.prctl(sysapi.PR_SET_PDEATHSIG, 9)  # SIGKILL
if os.getppid() == 1:
    sys.exit('layer_tool: Moat ended before it started')

OPAQUE = 'trusted.overlay.opaque'
NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
COPY_CHUNK = 1 << 20


def fd_path(fd, name=None):
    return f'/proc/self/fd/{fd}' if name is None else f'/proc/self/fd/{fd}/{name}'


class Shift:
    """Owner ids of one source mapped into the destination's id range."""

    def __init__(self, source_first, target_first, count):
        self.source_first = source_first
        self.target_first = target_first
        self.count = count

    def __call__(self, value):
        inside = value - self.source_first
        if not 0 <= inside < self.count:
            inside = 65534 if self.count > 65534 else self.count - 1
        return self.target_first + inside


def is_whiteout(info):
    return st.S_ISCHR(info.st_mode) and info.st_rdev == 0


def is_opaque(dir_fd):
    try:
        return os.getxattr(fd_path(dir_fd), OPAQUE) == b'y'
    except OSError:
        return False


def copy_xattrs(source, target, keep_opaque):
    """User and security labels travel; overlay bookkeeping does not (but for opaque, when asked)."""
    try:
        names = os.listxattr(source, follow_symlinks=False)
    except OSError:
        return
    for name in names:
        if name.startswith('trusted.overlay.') and not (keep_opaque and name == OPAQUE):
            continue
        # Owner ids inside these are the source's (file capabilities do nothing under
        # no_new_privs; ACLs would name another sandbox's ids): they do not travel.
        if name == 'security.capability' or name.startswith('system.posix_acl_'):
            continue
        try:
            os.setxattr(target, name, os.getxattr(source, name, follow_symlinks=False), follow_symlinks=False)
        except OSError as error:
            if error.errno not in (errno.ENOTSUP, errno.EPERM):
                raise


def finish(target_dir, name, info, shift, is_link):
    os.chown(name, shift(info.st_uid), shift(info.st_gid), dir_fd=target_dir, follow_symlinks=False)
    if not is_link:
        os.chmod(name, st.S_IMODE(info.st_mode), dir_fd=target_dir)
    os.utime(name, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=target_dir, follow_symlinks=False)


class TooLarge(Exception):
    pass


class Copier:
    """Copies into one output folder (`out_fd`), keeping hardlinks and holes, within a budget.

    Hardlinks are made again only between copies this copier made: each is found again by its
    path under the output folder (resolved with no symlink allowed) and checked to be the very
    inode made, so nothing a sandbox wrote can turn a link into one to another file.
    """

    def __init__(self, out_fd, budget=None):
        self.out_fd = out_fd
        self.budget = budget  # bytes of content still allowed from budgeted sources
        self.links = {}  # (dev, ino) of a source file -> (path under out, (dev, ino) of its copy)

    def link_again(self, key, target_dir, name):
        """Links `name` to the copy already made of the same source file; False when it cannot."""
        first_rel, first_copy = self.links[key]
        parent_rel, first_name = posixpath.split(first_rel)
        try:
            parent = sysapi.openat2(
                self.out_fd, parent_rel or '.', os.O_PATH | os.O_DIRECTORY, 0,
                sysapi.RESOLVE_BENEATH | sysapi.RESOLVE_NO_SYMLINKS,
            )
        except OSError:
            return False
        try:
            current = os.lstat(first_name, dir_fd=parent)
            if (current.st_dev, current.st_ino) != first_copy or not st.S_ISREG(current.st_mode):
                return False
            os.link(first_name, name, src_dir_fd=parent, dst_dir_fd=target_dir, follow_symlinks=False)
            return True
        finally:
            os.close(parent)

    def copy_file(self, source_dir, name, info, target_dir, rel, shift, budgeted):
        key = (info.st_dev, info.st_ino)
        path = posixpath.join(rel, name)
        if info.st_nlink > 1 and key in self.links and self.link_again(key, target_dir, name):
            return
        if st.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(name, dir_fd=source_dir), name, dir_fd=target_dir)
        elif is_whiteout(info):
            os.mknod(name, st.S_IFCHR | 0o000, 0, dir_fd=target_dir)
        elif st.S_ISFIFO(info.st_mode):
            os.mkfifo(name, 0o600, dir_fd=target_dir)
        elif st.S_ISREG(info.st_mode):
            source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=source_dir)
            try:
                target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=target_dir)
                try:
                    if st.S_ISREG(os.fstat(source).st_mode):
                        self.copy_content(source, target, budgeted)
                finally:
                    os.close(target)
            finally:
                os.close(source)
        else:
            return  # sockets and devices are not part of a layer
        copy_xattrs(fd_path(source_dir, name), fd_path(target_dir, name), False)
        finish(target_dir, name, info, shift, st.S_ISLNK(info.st_mode))
        if info.st_nlink > 1 and st.S_ISREG(info.st_mode):
            made = os.lstat(name, dir_fd=target_dir)
            self.links[key] = (path, (made.st_dev, made.st_ino))

    def copy_content(self, source, target, budgeted):
        """Copies the data of `source`, leaving its holes holes (a sparse file stays sparse)."""
        size = os.fstat(source).st_size
        position = 0
        while position < size:
            try:
                data = os.lseek(source, position, os.SEEK_DATA)
            except OSError as error:
                if error.errno == errno.ENXIO:
                    break  # only a hole is left
                raise
            hole = os.lseek(source, data, os.SEEK_HOLE)
            if budgeted and self.budget is not None:
                self.budget -= hole - data
                if self.budget < 0:
                    raise TooLarge('the snapshot holds more data than the sandbox\'s disk can')
            offset = data
            while offset < hole:
                copied = copy_range(source, target, offset, min(COPY_CHUNK, hole - offset))
                if copied == 0:
                    break
                offset += copied
            position = hole
        os.ftruncate(target, size)

    def merge(self, sources, target_dir, rel=''):
        """Merges folders (fd, shift, budgeted), top first, into the empty `target_dir`, as
        overlayfs shows them. Iterative: a tree of any depth neither recurses nor overflows."""
        frames = [Frame(sources, target_dir, rel, None, [])]
        try:
            while frames:
                frame = frames[-1]
                name = next(frame.names, None)
                if name is None:
                    frames.pop()
                    frame.close()
                    if frame.finish is not None:
                        finish(*frame.finish)
                    continue
                found = []
                for fd, shift, budgeted in frame.sources:
                    try:
                        found.append((fd, shift, budgeted, os.lstat(name, dir_fd=fd)))
                    except FileNotFoundError:
                        continue
                if not found:
                    continue
                top_fd, top_shift, top_budgeted, top = found[0]
                if not st.S_ISDIR(top.st_mode):
                    self.copy_file(top_fd, name, top, frame.target, frame.rel, top_shift, top_budgeted)
                    continue
                chain = []
                opaque = False
                child = Frame(chain, None, posixpath.join(frame.rel, name), (frame.target, name, top, top_shift, False), [])
                frames.append(child)
                for fd, shift, budgeted, info in found:
                    if not st.S_ISDIR(info.st_mode):
                        opaque = True
                        break
                    opened = os.open(name, NOFOLLOW_DIR, dir_fd=fd)
                    child.owned.append(opened)
                    chain.append((opened, shift, budgeted))
                    if is_opaque(opened):
                        opaque = True
                        break
                os.mkdir(name, 0o700, dir_fd=frame.target)
                made = os.open(name, NOFOLLOW_DIR, dir_fd=frame.target)
                child.owned.append(made)
                child.target = made
                copy_xattrs(fd_path(top_fd, name), fd_path(made), False)
                if opaque:
                    os.setxattr(made, OPAQUE, b'y')
                child.start()
        finally:
            for frame in frames:
                frame.close()


class Frame:
    """One folder being merged: its sources, its copy, and what finishes it once done."""

    def __init__(self, sources, target, rel, finish_args, owned):
        self.sources = sources
        self.target = target
        self.rel = rel
        self.finish = finish_args
        self.owned = owned
        self.names = iter(())
        if target is not None:
            self.start()

    def start(self):
        names = []
        seen = set()
        for fd, _, _ in self.sources:
            for name in sorted(os.listdir(fd_path(fd))):
                if name not in seen:
                    seen.add(name)
                    names.append(name)
        self.names = iter(names)

    def close(self):
        for fd in self.owned:
            os.close(fd)
        self.owned = []


def copy_range(source, target, offset, count):
    """Copies count bytes at offset (the kernel copies where it can)."""
    try:
        return os.copy_file_range(source, target, count, offset, offset)
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    data = os.pread(source, count, offset)
    view = memoryview(data)
    written = 0
    while written < len(data):
        written += os.pwrite(target, view[written:], offset + written)
    return len(data)


def open_dir(path):
    return os.open(path, NOFOLLOW_DIR)


def flatten(out, store_first, from_first, count, budget, upper, lower=None):
    """A snapshot layer: each part of UPPER merged over the same part of LOWER.

    Only UPPER's data counts against `budget`: LOWER is a stored layer already paid for.
    """
    os.mkdir(out, 0o700)
    out_fd = open_dir(out)
    upper_fd = open_dir(upper)
    lower_fd = open_dir(lower) if lower else None
    identity = Shift(store_first, store_first, count)
    copier = Copier(out_fd, budget)
    try:
        parts = set(os.listdir(fd_path(upper_fd)))
        if lower_fd is not None:
            parts |= set(os.listdir(fd_path(lower_fd)))
        for part in sorted(parts):
            sources = []
            for fd, shift, budgeted in (
                (upper_fd, Shift(from_first, store_first, count), True),
                (lower_fd, identity, False),
            ):
                if fd is None:
                    continue
                try:
                    sources.append((os.open(part, NOFOLLOW_DIR, dir_fd=fd), shift, budgeted))
                except FileNotFoundError:
                    pass
            os.mkdir(part, 0o755, dir_fd=out_fd)
            made = os.open(part, NOFOLLOW_DIR, dir_fd=out_fd)
            try:
                copier.merge(sources, made, part)
            finally:
                os.close(made)
                for fd, _, _ in sources:
                    os.close(fd)
            os.chown(part, store_first, store_first, dir_fd=out_fd)
    finally:
        for fd in (out_fd, upper_fd, lower_fd):
            if fd is not None:
                os.close(fd)


def adopt(out, first, count, home_uid, source):
    """A folder from before layers (every file Moat's) as the root part of a layer."""
    os.mkdir(out, 0o700)
    part = os.path.join(out, 'root')
    os.mkdir(part, 0o755)
    source_fd = open_dir(source)
    out_fd = open_dir(out)
    part_fd = open_dir(part)
    copier = Copier(out_fd)
    user = lambda _value: first + home_uid  # noqa: E731
    root = lambda _value: first  # noqa: E731
    try:
        for name in sorted(os.listdir(fd_path(source_fd))):
            if name == '.moat':
                continue  # the old identity files and metadata sidecars
            info = os.lstat(name, dir_fd=source_fd)
            shift = root if name == 'root' else user
            if st.S_ISDIR(info.st_mode):
                child = os.open(name, NOFOLLOW_DIR, dir_fd=source_fd)
                try:
                    os.mkdir(name, 0o700, dir_fd=part_fd)
                    made = os.open(name, NOFOLLOW_DIR, dir_fd=part_fd)
                    try:
                        copier.merge([(child, shift, False)], made, posixpath.join('root', name))
                    finally:
                        os.close(made)
                finally:
                    os.close(child)
                finish(part_fd, name, info, shift, False)
            else:
                copier.copy_file(source_fd, name, info, part_fd, 'root', shift, False)
        os.chown(part, first, first)
    finally:
        os.close(source_fd)
        os.close(out_fd)
        os.close(part_fd)


def world_readable(info):
    if st.S_ISDIR(info.st_mode):
        return info.st_mode & 0o005 == 0o005
    if st.S_ISLNK(info.st_mode):
        return True
    return info.st_mode & 0o004 != 0


def copy_readable(copier, source_dir, target_dir, shift, replaced, prefix=''):
    """Copies what any host user may read (files, symlinks, folders), nothing else, into the
    `etc` part of the copier's output (`prefix`: the folder's path inside it, with a slash)."""
    for name in sorted(os.listdir(fd_path(source_dir))):
        rel = prefix + name
        if rel in replaced:
            continue
        try:
            info = os.lstat(name, dir_fd=source_dir)
        except FileNotFoundError:
            continue
        if not world_readable(info):
            continue
        if st.S_ISDIR(info.st_mode):
            child = os.open(name, NOFOLLOW_DIR, dir_fd=source_dir)
            try:
                os.mkdir(name, 0o700, dir_fd=target_dir)
                made = os.open(name, NOFOLLOW_DIR, dir_fd=target_dir)
                try:
                    copy_readable(copier, child, made, shift, replaced, rel + '/')
                finally:
                    os.close(made)
            finally:
                os.close(child)
            finish(target_dir, name, info, shift, False)
        elif st.S_ISREG(info.st_mode) or st.S_ISLNK(info.st_mode):
            copier.copy_file(source_dir, name, info, target_dir, posixpath.join('etc', prefix), shift, False)


def build_base(out, store_first, spec):
    """The base layer, made anew at each start of Moat (spec: see src/runtime/base-layer.ts).

    root: the skeleton (folders with owners and modes, symlinks, mount points);
    etc: the host's /etc as any host user may read it, with Moat's own files (passwd, group,
    hosts, resolv.conf, profile...) in place of the host's.
    """
    os.mkdir(out, 0o700)
    out_fd = open_dir(out)
    shift = Shift(0, store_first, spec['count'])
    try:
        for part in ('root', 'etc'):
            os.mkdir(part, 0o755, dir_fd=out_fd)
        root_fd = os.open('root', NOFOLLOW_DIR, dir_fd=out_fd)
        try:
            for entry in spec['skeleton']:
                path = entry['path']
                if 'link' in entry:
                    os.symlink(entry['link'], path, dir_fd=root_fd)
                    os.chown(path, store_first, store_first, dir_fd=root_fd, follow_symlinks=False)
                    continue
                os.mkdir(path, entry['mode'], dir_fd=root_fd)
                os.chmod(path, entry['mode'], dir_fd=root_fd)
                os.chown(path, shift(entry['uid']), shift(entry['uid']), dir_fd=root_fd)
        finally:
            os.close(root_fd)
        etc_fd = os.open('etc', NOFOLLOW_DIR, dir_fd=out_fd)
        host_etc = open_dir(spec['etc'])
        try:
            copy_readable(Copier(out_fd), host_etc, etc_fd, shift, set(spec['files']))
            for name, text in spec['files'].items():
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=etc_fd)
                try:
                    os.write(fd, text['content'].encode())
                    os.fchmod(fd, text['mode'])
                    os.fchown(fd, shift(0), shift(text.get('gid', 0)))
                finally:
                    os.close(fd)
            os.fchown(etc_fd, shift(0), shift(0))
            os.fchmod(etc_fd, 0o755)
        finally:
            os.close(host_etc)
            os.close(etc_fd)
        os.chown(out, store_first, store_first)
        os.chmod(out, 0o755)
    finally:
        os.close(out_fd)


def main(argv):
    # Dies with Moat: a half-made layer is staging that the next start removes.
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    command = argv[1]
    if command == 'base':
        with open(argv[4]) as spec:
            build_base(argv[2], int(argv[3]), json.load(spec))
    elif command == 'flatten':
        try:
            flatten(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), int(argv[6]), argv[7], argv[8] if len(argv) > 8 else None)
        except TooLarge as error:
            sys.stderr.write(f'{error}\n')
            raise SystemExit(1) from None
    elif command == 'adopt':
        adopt(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), argv[6])
    else:
        raise SystemExit(f'unknown command {command!r}')


if __name__ == '__main__':
    main(sys.argv)
