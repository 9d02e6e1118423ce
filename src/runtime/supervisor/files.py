"""The file role: the sandbox API's file operations, carried out inside the sandbox as its user.

The agent runs with the identity of one sandbox user in the sandbox's own mount namespace, so
the kernel resolves every path in the sandbox's view with that user's permissions: no path a
sandbox controls is ever resolved on the host. Paths are opened with openat2(RESOLVE_IN_ROOT)
under the agent's root (the sandbox's `/`, or the sandbox folder when Moat runs unconfined),
and every change is made relative to an opened folder.

Where a user's own agent may not create what a write asks for (a folder only root may write,
such as `/` for `/0/file`), Moat asks the root agent to create it for that user (`for`: the
user's uid and gid; the path then absolute, since this agent's home is root's), as E2B's envd,
which writes as root, does: see new_target.

Requests carry a request number `rid`; each gets one reply {"rid", ...} or {"rid", "error":
{"code", "message"}} where code is an errno name (ENOENT...) or one of `invalid`, `exists`,
`exhausted`. Streams (read, write, list, watch) are described at their methods. An operation
that takes long (compose, remove of a big tree) sends {"rid", "working": true} at most every
WORKING_EVERY seconds meanwhile: Moat's deadline is on progress, and this is progress.
"""
import errno
import os
import posixpath
import secrets
import selectors
import stat as st
import time

import frames
import sysapi
import watch

MAX_PATH = 4096
MAX_LIST_ENTRIES = 100_000
LIST_BATCH = 1000
READ_CHUNK = 256 << 10
READ_WINDOW = 2 << 20
COPY_CHUNK = 1 << 20
WORKING_EVERY = 1.0
METADATA_PREFIX = 'user.e2b.'
TEMPORARY_PREFIX = '.moat-'
OPEN_PATH = os.O_PATH | os.O_CLOEXEC
# Where the sandbox's root creates nothing for another user (see FileAgent.new_target).
SYSTEM_FOLDERS = ('/bin', '/boot', '/etc', '/lib', '/lib32', '/lib64', '/libx32', '/opt', '/root',
                  '/sbin', '/usr', '/var/lib')
RESOLVE = sysapi.RESOLVE_IN_ROOT | sysapi.RESOLVE_NO_MAGICLINKS


class Failure(Exception):
    def __init__(self, code, message='', path=None):
        super().__init__(message)
        self.code = code
        self.message = message
        # The path at fault, when it is not the one the request named first.
        self.path = path


def errno_name(error):
    return errno.errorcode.get(error.errno, 'EIO')


def fd_path(fd, name=None):
    """A path that reaches `name` in the opened folder `fd` (or `fd` itself), never re-resolving."""
    return f'/proc/self/fd/{fd}' if name is None else f'/proc/self/fd/{fd}/{name}'


def rfc3339(ns):
    seconds, fraction = divmod(ns, 1_000_000_000)
    base = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))
    if fraction == 0:
        return base + 'Z'
    digits = f'{fraction:09d}'
    while digits.endswith('000'):
        digits = digits[:-3]
    return f'{base}.{digits}Z'


def permissions(mode):
    """Go's os.FileMode.String(), which envd reports: type letters, then rwxrwxrwx."""
    kind = ''
    if st.S_ISDIR(mode):
        kind += 'd'
    if st.S_ISLNK(mode):
        kind += 'L'
    if st.S_ISBLK(mode) or st.S_ISCHR(mode):
        kind += 'D'
    if st.S_ISFIFO(mode):
        kind += 'p'
    if st.S_ISSOCK(mode):
        kind += 'S'
    if mode & st.S_ISUID:
        kind += 'u'
    if mode & st.S_ISGID:
        kind += 'g'
    if st.S_ISCHR(mode):
        kind += 'c'
    if mode & st.S_ISVTX:
        kind += 't'
    rwx = ''.join(c if mode & (0o400 >> i) else '-' for i, c in enumerate('rwxrwxrwx'))
    return (kind or '-') + rwx


def file_type(mode):
    if st.S_ISREG(mode):
        return 'FILE_TYPE_FILE'
    if st.S_ISDIR(mode):
        return 'FILE_TYPE_DIRECTORY'
    if st.S_ISLNK(mode):
        return 'FILE_TYPE_SYMLINK'
    return None


class Names:
    """User and group names from the sandbox's own /etc/passwd and /etc/group, re-read on change."""

    def __init__(self, root_fd, own_uid, own_name):
        self.root_fd = root_fd
        self.tables = {}
        # Unconfined, files belong to Moat's own uid: report the user who looks.
        self.own = (own_uid, own_name)

    def table(self, name):
        try:
            # Non-blocking, and only a regular file is read: the sandbox may make it a FIFO.
            fd = sysapi.openat2(self.root_fd, f'/etc/{name}', os.O_RDONLY | os.O_NONBLOCK, 0, RESOLVE)
        except OSError:
            return {}
        try:
            info = os.fstat(fd)
            if not st.S_ISREG(info.st_mode):
                return {}
            cached = self.tables.get(name)
            if cached and cached[0] == (info.st_ino, info.st_mtime_ns, info.st_size):
                return cached[1]
            text = os.read(fd, 1 << 20).decode(errors='replace')
        finally:
            os.close(fd)
        names = {}
        for line in text.splitlines():
            fields = line.split(':')
            if len(fields) >= 3 and fields[2].isdigit():
                names.setdefault(int(fields[2]), fields[0])
        self.tables[name] = ((info.st_ino, info.st_mtime_ns, info.st_size), names)
        return names

    def user(self, uid):
        if uid == self.own[0]:
            return self.own[1]
        return self.table('passwd').get(uid, str(uid))

    def group(self, gid):
        if gid == self.own[0]:
            return self.own[1]
        return self.table('group').get(gid, str(gid))


class Agent:
    def __init__(self, sock, root, home, user_name, unconfined):
        self.sock = sock
        self.root_path = os.path.realpath(root)
        self.root_fd = os.open(self.root_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.home = home
        self.unconfined = unconfined
        self.names = Names(self.root_fd, os.getuid() if unconfined else -1, user_name)
        self.reads = {}
        self.staged = {}
        self.selector = selectors.DefaultSelector()
        self.watches = watch.Watches(self, self.selector)
        self.said_working = 0.0
        os.umask(0o022)

    def working(self, message):
        """Tells Moat the request `message` is still being carried out (not too often)."""
        now = time.monotonic()
        if now - self.said_working >= WORKING_EVERY:
            self.said_working = now
            frames.send(self.sock, {'rid': message.get('rid'), 'working': True})

    # --- Paths ------------------------------------------------------------------------------

    def absolute(self, given):
        if not isinstance(given, str) or given == '':
            raise Failure('invalid', 'path is required')
        if '\0' in given:
            raise Failure('invalid', f'path {given!r} contains a NUL byte')
        if len(given) > MAX_PATH:
            raise Failure('invalid', f'path is over {MAX_PATH} characters')
        return given if given.startswith('/') else posixpath.join(self.home, given)

    def view_of(self, fd):
        """The path of an opened file as the sandbox names it."""
        real = os.readlink(fd_path(fd))
        if self.unconfined:
            real = '/' + real[len(self.root_path) :].lstrip('/') if real.startswith(self.root_path) else real
        return real

    def open(self, path, flags=OPEN_PATH, mode=0):
        return sysapi.openat2(self.root_fd, path, flags | os.O_CLOEXEC, mode, RESOLVE)

    def locate(self, given, follow):
        """(folder fd, name, view) of `given`; with follow, name is None and fd is the entry."""
        path = self.absolute(given)
        parts = [p for p in path.split('/') if p]
        if follow or not parts or parts[-1] in ('.', '..'):
            fd = self.open(path)
            return fd, None, self.view_of(fd)
        parent = self.open('/' + '/'.join(parts[:-1]), OPEN_PATH | os.O_DIRECTORY)
        folder = self.view_of(parent)
        return parent, parts[-1], posixpath.join(folder, parts[-1])

    def lstat(self, fd, name):
        # With no name, fd is the entry itself (opened O_PATH, the final symlink followed).
        return os.fstat(fd) if name is None else os.lstat(name, dir_fd=fd)

    def metadata(self, fd, name):
        target = fd_path(fd, name)
        try:
            keys = [k for k in os.listxattr(target, follow_symlinks=False) if k.startswith(METADATA_PREFIX)]
            return {
                k[len(METADATA_PREFIX) :]: os.getxattr(target, k, follow_symlinks=False).decode(errors='replace')
                for k in keys
            }
        except OSError:
            return {}

    def entry(self, fd, name, view, info=None):
        info = info or self.lstat(fd, name)
        mode = info.st_mode
        result = {
            'name': posixpath.basename(view) or '/',
            'path': view,
            'permissions': permissions(mode),
            'owner': self.names.user(info.st_uid),
            'group': self.names.group(info.st_gid),
            'modifiedTime': rfc3339(info.st_mtime_ns),
        }
        kind = file_type(mode)
        if kind:
            result['type'] = kind
        if info.st_size:
            result['size'] = str(info.st_size)
        if mode & 0o777:
            result['mode'] = mode & 0o777
        if st.S_ISLNK(mode):
            target = os.readlink(name, dir_fd=fd)
            result['symlinkTarget'] = (
                posixpath.normpath(target)
                if target.startswith('/')
                else posixpath.normpath(posixpath.join(posixpath.dirname(view), target))
            )
        if st.S_ISREG(mode):
            values = self.metadata(fd, name)
            if values:
                result['metadata'] = values
        return result

    def make_folders(self, path):
        """mkdir -p inside the root; returns the folder's fd (every part resolved in the root)."""
        parts = [p for p in path.split('/') if p]
        fd = self.open('/', OPEN_PATH | os.O_DIRECTORY)
        for index, part in enumerate(parts):
            prefix = '/' + '/'.join(parts[: index + 1])
            try:
                following = self.open(prefix, OPEN_PATH | os.O_DIRECTORY)
            except FileNotFoundError:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                following = self.open(prefix, OPEN_PATH | os.O_DIRECTORY)
            os.close(fd)
            fd = following
        return fd

    # --- Unary operations -------------------------------------------------------------------

    def op_stat(self, message):
        fd, name, view = self.locate(message.get('path'), bool(message.get('follow')))
        try:
            return {'entry': self.entry(fd, name, view)}
        finally:
            os.close(fd)

    def op_mkdir(self, message):
        path = self.absolute(message.get('path'))
        try:
            fd = self.open(path)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            try:
                if st.S_ISDIR(os.fstat(fd).st_mode):
                    raise Failure('exists', f"directory '{self.view_of(fd)}' already exists")
                raise Failure('invalid', f"path '{self.view_of(fd)}' already exists and is not a directory")
            finally:
                os.close(fd)
        fd = self.make_folders(path)
        try:
            return {'entry': self.entry(fd, None, self.view_of(fd))}
        finally:
            os.close(fd)

    def op_move(self, message):
        source, source_name, source_view = self.locate(message.get('source'), False)
        try:
            if source_name is None:
                raise Failure('invalid', "cannot move the sandbox's root folder")
            self.lstat(source, source_name)
            destination_path = self.absolute(message.get('destination'))
            parts = [p for p in destination_path.split('/') if p]
            if not parts or parts[-1] in ('.', '..'):
                raise Failure('invalid', "cannot replace the sandbox's root folder")
            target = self.make_folders('/'.join(parts[:-1]))
            try:
                os.rename(source_name, parts[-1], src_dir_fd=source, dst_dir_fd=target)
                view = posixpath.join(self.view_of(target), parts[-1])
                return {'entry': self.entry(target, parts[-1], view)}
            finally:
                os.close(target)
        finally:
            os.close(source)

    def op_remove(self, message):
        fd, name, view = self.locate(message.get('path'), False)
        try:
            if name is None:
                raise Failure('invalid', "cannot remove the sandbox's root folder")
            try:
                info = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                return {}
            if st.S_ISDIR(info.st_mode):
                remove_tree(fd, name, lambda: self.working(message))
            else:
                os.unlink(name, dir_fd=fd)
            return {}
        finally:
            os.close(fd)

    def op_list(self, message):
        """Entries below a folder to `depth` levels, depth-first in name order, sent in batches."""
        depth = max(1, int(message.get('depth') or 1))
        fd = self.open(self.absolute(message.get('path')), OPEN_PATH)
        try:
            if not st.S_ISDIR(os.fstat(fd).st_mode):
                raise Failure('ENOTDIR', 'not a directory')
            batch = []
            count = 0
            rid = message['rid']

            def walk(folder_fd, view, levels):
                nonlocal batch, count
                try:
                    names = sorted(os.listdir(fd_path(folder_fd)))
                except FileNotFoundError:
                    return
                for name in names:
                    try:
                        info = os.lstat(name, dir_fd=folder_fd)
                    except FileNotFoundError:
                        continue
                    count += 1
                    if count > MAX_LIST_ENTRIES:
                        raise Failure('exhausted', f'more than {MAX_LIST_ENTRIES} entries; list with a smaller depth')
                    child_view = posixpath.join(view, name)
                    batch.append(self.entry(folder_fd, name, child_view, info))
                    if len(batch) >= LIST_BATCH:
                        frames.send(self.sock, {'rid': rid, 'entries': batch, 'more': True})
                        batch = []
                    if st.S_ISDIR(info.st_mode) and levels > 1:
                        try:
                            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
                        except OSError:
                            continue
                        try:
                            walk(child, child_view, levels - 1)
                        finally:
                            os.close(child)

            walk(fd, self.view_of(fd), depth)
            return {'entries': batch}
        finally:
            os.close(fd)

    # --- Reading a whole file ---------------------------------------------------------------

    def op_read(self, message):
        """{"size", "path"}, then frames {"rid"} + bytes as credit allows, then {"rid","end":n}."""
        fd = self.open(self.absolute(message.get('path')), os.O_RDONLY | os.O_NONBLOCK)
        info = os.fstat(fd)
        if st.S_ISDIR(info.st_mode):
            os.close(fd)
            raise Failure('EISDIR', 'it is a directory')
        if not st.S_ISREG(info.st_mode):
            os.close(fd)
            raise Failure('invalid', 'it is not a regular file')
        self.reads[message['rid']] = {'fd': fd, 'left': info.st_size, 'sent': 0, 'credit': READ_WINDOW}
        return {'size': info.st_size, 'path': self.view_of(fd)}

    def op_credit(self, message):
        read = self.reads.get(message.get('rid'))
        if read is not None:
            read['credit'] += int(message.get('bytes', 0))

    def op_cancel(self, message):
        read = self.reads.pop(message.get('rid'), None)
        if read is not None:
            os.close(read['fd'])

    def pump_reads(self):
        """Sends one chunk of each read that has credit; True while any could send more."""
        busy = False
        for rid in list(self.reads):
            read = self.reads[rid]
            if read['credit'] <= 0:
                continue
            want = min(READ_CHUNK, read['credit'], read['left'])
            data = os.read(read['fd'], want) if want > 0 else b''
            if data:
                read['left'] -= len(data)
                read['sent'] += len(data)
                read['credit'] -= len(data)
                frames.send(self.sock, {'rid': rid}, data)
            if not data or read['left'] <= 0:
                del self.reads[rid]
                os.close(read['fd'])
                frames.send(self.sock, {'rid': rid, 'end': read['sent']})
            elif read['credit'] > 0:
                busy = True
        return busy

    # --- Writing whole files ----------------------------------------------------------------

    def write_target(self, given):
        """(folder fd, name, view, mode) where a whole-file write of `given` lands.

        An existing file (through a final symlink inside the root) keeps its place and mode;
        folders and special files are refused; missing parent folders are made.
        """
        path = self.absolute(given)
        try:
            fd = self.open(path)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            try:
                info = os.fstat(fd)
                view = self.view_of(fd)
            finally:
                os.close(fd)
            if st.S_ISDIR(info.st_mode):
                raise Failure('EISDIR', 'it is a directory')
            if not st.S_ISREG(info.st_mode):
                raise Failure('invalid', 'it is not a regular file')
            folder = self.open(posixpath.dirname(view), OPEN_PATH | os.O_DIRECTORY)
            return folder, posixpath.basename(view), view, st.S_IMODE(info.st_mode)
        parts = [p for p in path.split('/') if p]
        if not parts or parts[-1] in ('.', '..'):
            raise Failure('EISDIR', 'it is a directory')
        folder = self.make_folders('/'.join(parts[:-1]))
        return folder, parts[-1], posixpath.join(self.view_of(folder), parts[-1]), None

    def created_for(self, message):
        """The (uid, gid) this agent creates for (`for`), or None when it acts as itself."""
        owner = message.get('for')
        if owner is None:
            return None
        if self.unconfined or os.geteuid() != 0:
            raise Failure('EACCES', 'only the root of a confined sandbox creates for another user')
        ids = (owner.get('uid'), owner.get('gid'))
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 < i < 1 << 32 for i in ids):
            raise Failure('invalid', f'for needs a uid and a gid other than root: {owner!r}')
        return ids

    def new_target(self, given, owner):
        """(folder fd, name, view) where root creates a new file of `given` for `owner`.

        Root's power makes only what is missing, and nothing a sandbox process could redirect:
        no symbolic link is followed anywhere in the path (one is refused, EACCES, as the user
        was), each folder is opened as a real folder, the missing ones are made (0755, inside
        folders only root may change: see real_folder) and handed to `owner`, and the file must
        not exist yet (an existing one stays refused: it is not the user's to replace). The
        commit will not replace a file that appears meanwhile either.
        """
        parts = [p for p in posixpath.normpath(self.absolute(given)).split('/') if p]
        if not parts:
            raise Failure('EISDIR', 'it is a directory')
        # A file there that its user may rewrite would run as root later (/etc/ld.so.preload,
        # /etc/profile.d, /root/.bashrc): there, writing as the user means the user's rights.
        within = '/' + '/'.join(parts)
        if any(within == folder or within.startswith(folder + '/') for folder in SYSTEM_FOLDERS):
            raise Failure(
                'EACCES',
                f"root creates for the user only outside the system folders ({', '.join(SYSTEM_FOLDERS)}); write there as root",
            )
        chain = [self.open('/', OPEN_PATH | os.O_DIRECTORY)]
        made = []
        try:
            try:
                for part in parts[:-1]:
                    folder, new = self.real_folder(chain[-1], part)
                    chain.append(folder)
                    if new:
                        made.append(folder)
                try:
                    os.lstat(parts[-1], dir_fd=chain[-1])
                except FileNotFoundError:
                    pass
                else:
                    raise Failure('EACCES', "it exists and is not the user's to replace")
            finally:
                # Handed over once the walk is over, through the descriptors: while they were
                # root's, no process of the sandbox could swap one of them for a folder of its
                # choosing. What was made is the user's also when the write is then refused.
                for folder in made:
                    os.chown(fd_path(folder), *owner)
            view = posixpath.join(self.view_of(chain[-1]), parts[-1])
            return chain.pop(), parts[-1], view
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise Failure('EACCES', 'a symbolic link is on the way') from None
            raise
        finally:
            for folder in chain:
                os.close(folder)

    def real_folder(self, parent, name):
        """(fd, made) of the folder `name` in `parent`, never through a symbolic link; made
        (root's, 0755) when it is missing, but only in a parent where no one but root may rename
        it: between the mkdir and the open, anyone else could rename a folder of their choosing
        over the new one, which would then be handed over as made."""

        def opened():
            how = sysapi.RESOLVE_NO_SYMLINKS | sysapi.RESOLVE_BENEATH
            return sysapi.openat2(parent, name, OPEN_PATH | os.O_DIRECTORY, 0, how)

        try:
            return opened(), False
        except FileNotFoundError:
            pass
        info = os.fstat(parent)
        # Root's, and writable by no one else, or sticky: the kernel lets no one else move root's
        # entries out of a sticky folder.
        if info.st_uid != 0 or (info.st_mode & 0o022 and not info.st_mode & st.S_ISVTX):
            raise Failure('EACCES', f"root makes no folder in '{self.view_of(parent)}', which others than root may change")
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            return opened(), False  # made meanwhile by another: it stays whose it is
        return opened(), True

    def temporary(self, folder, kind, mode, owner=None):
        name = f'{TEMPORARY_PREFIX}{kind}-{secrets.token_hex(8)}'
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder)
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, *owner)
        except BaseException:
            os.close(fd)
            os.unlink(name, dir_fd=folder)
            raise
        return name, fd

    def op_stage(self, message):
        """Opens a temporary file beside the target; frames {"op":"data","sid"} + bytes follow."""
        owner = self.created_for(message)
        if owner is None:
            folder, name, view, mode = self.write_target(message.get('path'))
        else:
            folder, name, view = self.new_target(message.get('path'), owner)
            mode = None
        try:
            temporary, fd = self.temporary(folder, 'upload', mode, owner)
        except BaseException:
            os.close(folder)
            raise
        self.staged[message['sid']] = {
            'folder': folder,
            'name': name,
            'view': view,
            'temporary': temporary,
            'fd': fd,
            'metadata': message.get('metadata') or {},
            'upload': message.get('upload'),
            # A file created for another user never replaces one.
            'replace': owner is None,
        }
        return {'path': view}

    def op_data(self, message, payload):
        staged = self.staged.get(message.get('sid'))
        if staged is None or staged['fd'] is None:
            return
        view = memoryview(payload)
        try:
            while view:
                view = view[os.write(staged['fd'], view) :]
        except OSError as error:
            staged['failure'] = error

    def op_staged(self, message):
        """The part is complete: its bytes are written, its metadata set (still under its temporary name)."""
        staged = self.staged.get(message.get('sid'))
        if staged is None:
            raise Failure('invalid', 'no such staged file')
        fd, staged['fd'] = staged['fd'], None
        try:
            if 'failure' in staged:
                raise staged['failure']
            for key, value in staged['metadata'].items():
                os.setxattr(fd, METADATA_PREFIX + key, value.encode())
        finally:
            os.close(fd)
        return {'path': staged['view']}

    def op_commit(self, message):
        """Renames every staged part of one upload into place, in order."""
        done = []
        for sid in list(self.staged):
            staged = self.staged[sid]
            if staged['upload'] != message.get('upload'):
                continue
            if staged['replace']:
                os.rename(staged['temporary'], staged['name'], src_dir_fd=staged['folder'], dst_dir_fd=staged['folder'])
            else:
                sysapi.rename_noreplace(staged['folder'], staged['temporary'], staged['name'])
            done.append(staged['view'])
            self.drop_staged(sid, remove=False)
        return {'paths': done}

    def op_abort(self, message):
        for sid in list(self.staged):
            if self.staged[sid]['upload'] == message.get('upload'):
                self.drop_staged(sid, remove=True)
        return {}

    def drop_staged(self, sid, remove):
        staged = self.staged.pop(sid)
        if staged['fd'] is not None:
            os.close(staged['fd'])
        if remove:
            try:
                os.unlink(staged['temporary'], dir_fd=staged['folder'])
            except OSError:
                pass
        os.close(staged['folder'])

    # --- Compose ----------------------------------------------------------------------------

    def op_compose(self, message):
        """Concatenates the sources into the destination, then removes the sources."""
        sources = []
        try:
            for given in message.get('sources') or []:
                try:
                    fd = self.open(self.absolute(given), os.O_RDONLY | os.O_NONBLOCK)
                except OSError as error:
                    raise Failure(errno_name(error), error.strerror or '', given) from None
                sources.append(fd)
                if not st.S_ISREG(os.fstat(fd).st_mode):
                    raise Failure('invalid', f"cannot compose from '{self.view_of(fd)}': not a regular file")
            if not sources:
                raise Failure('invalid', 'source_paths must not be empty')
            folder, name, view, mode = self.write_target(message.get('destination'))
            try:
                temporary, out = self.temporary(folder, 'compose', mode)
                try:
                    for fd in sources:
                        copy_all(fd, out, lambda: self.working(message))
                    os.close(out)
                    out = None
                    os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
                except BaseException:
                    if out is not None:
                        os.close(out)
                    try:
                        os.unlink(temporary, dir_fd=folder)
                    except OSError:
                        pass
                    raise
                result = os.lstat(name, dir_fd=folder)
                for fd in sources:
                    source = os.fstat(fd)
                    # A source that is the destination is now the result: keep it.
                    if (source.st_dev, source.st_ino) == (result.st_dev, result.st_ino) or source.st_nlink == 0:
                        continue
                    self.remove_opened(fd, source)
            finally:
                os.close(folder)
            return {'path': view, 'name': posixpath.basename(view), 'type': 'file'}
        finally:
            for fd in sources:
                os.close(fd)

    def remove_opened(self, fd, info):
        """Unlinks the name an opened source has, if it still names that file."""
        view = self.view_of(fd)
        try:
            folder = self.open(posixpath.dirname(view), OPEN_PATH | os.O_DIRECTORY)
        except OSError:
            return
        try:
            name = posixpath.basename(view)
            current = os.lstat(name, dir_fd=folder)
            if (current.st_dev, current.st_ino) == (info.st_dev, info.st_ino):
                os.unlink(name, dir_fd=folder)
        except OSError:
            pass
        finally:
            os.close(folder)

    # --- Watching ---------------------------------------------------------------------------

    def op_watch(self, message):
        return self.watches.open(message)

    def op_unwatch(self, message):
        self.watches.close(message.get('wid'))

    # --- The loop ---------------------------------------------------------------------------

    def handle(self, header, payload):
        op = header.get('op')
        if op == 'data':
            self.op_data(header, payload)
            return
        if op in ('credit', 'cancel', 'unwatch'):
            getattr(self, f'op_{op}')(header)  # no reply: Moat does not wait for these
            return
        rid = header.get('rid')
        method = getattr(self, f'op_{op}', None) if isinstance(op, str) else None
        try:
            if method is None:
                raise Failure('invalid', f'unknown operation {op!r}')
            reply = method(header)
        except Failure as failure:
            reply = {'error': {'code': failure.code, 'message': failure.message}}
            if failure.path is not None:
                reply['error']['path'] = failure.path
        except watch.Exhausted as exhausted:
            reply = {'error': {'code': 'exhausted', 'message': str(exhausted)}}
        except OSError as error:
            reply = {'error': {'code': errno_name(error), 'message': error.strerror or ''}}
        except (KeyError, TypeError, ValueError) as error:
            reply = {'error': {'code': 'invalid', 'message': f'bad request: {error}'}}
        if reply is not None:
            reply['rid'] = rid
            frames.send(self.sock, reply)

    def serve(self):
        self.selector.register(self.sock, selectors.EVENT_READ, ('requests', None))
        reader = frames.Reader()
        busy = False
        while True:
            for key, _ in self.selector.select(0 if busy else None):
                kind, wid = key.data
                if kind == 'requests':
                    chunk = os.read(self.sock, 1 << 20)
                    if not chunk:
                        return
                    for header, payload in reader.feed(chunk):
                        self.handle(header, payload)
                else:
                    self.watches.read(wid)
            busy = self.pump_reads()


def remove_tree(parent, name, working):
    """rm -r of `name` in the opened folder `parent`, never following a symlink; calls
    `working` as it goes."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.ENOTDIR, errno.ELOOP):
            os.unlink(name, dir_fd=parent)
            return
        raise
    try:
        for child in os.listdir(fd_path(fd)):
            try:
                info = os.lstat(child, dir_fd=fd)
            except FileNotFoundError:
                continue
            if st.S_ISDIR(info.st_mode):
                remove_tree(fd, child, working)
            else:
                os.unlink(child, dir_fd=fd)
            working()
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def copy_all(source, target, working):
    """Appends all of `source` to `target` (the kernel copies where it can); calls `working`
    after each chunk."""
    while True:
        working()
        try:
            copied = os.copy_file_range(source, target, COPY_CHUNK)
        except OSError as error:
            if error.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            data = os.read(source, COPY_CHUNK)
            copied = len(data)
            view = memoryview(data)
            while view:
                view = view[os.write(target, view) :]
        if copied == 0:
            return


def serve(sock, root, home, user_name, unconfined):
    Agent(sock, root, home, user_name, unconfined).serve()
