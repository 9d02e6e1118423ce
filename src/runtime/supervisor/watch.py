"""Folder watches for the file role: inotify events as envd's event types.

One inotify descriptor per watch. `{"op":"watch","rid","wid","path","recursive","includeEntry"}`
answers `{"rid","path"}` once the folder (and with `recursive` its subfolders) is watched; then
`{"wid","events":[{"name","type","entry"?}]}` frames carry what happened, and
`{"wid","error":{"code","message"}}` ends a watch whose folder went away or that grew past its
bounds. Names are relative to the watched folder.

Mapping: a new name is CREATE (a regular file that arrives with content also WRITE), a change of
content WRITE, a change of mode CHMOD, a name renamed within the watch RENAME (and CREATE of the
new name), a name deleted or moved out of the watch REMOVE. Moat's temporary upload files are
hidden: an upload shows as CREATE and WRITE of its target (WRITE alone when it replaced one).
"""
import os
import posixpath
import stat as st

import frames
import sysapi

MAX_FOLDERS = 1_000
MAX_ENTRIES = 100_000
TEMPORARY_PREFIX = '.moat-'
FOLDER_MASK = (
    sysapi.IN_CREATE
    | sysapi.IN_DELETE
    | sysapi.IN_MODIFY
    | sysapi.IN_ATTRIB
    | sysapi.IN_MOVED_FROM
    | sysapi.IN_MOVED_TO
    | sysapi.IN_DELETE_SELF
    | sysapi.IN_MOVE_SELF
    | sysapi.IN_ONLYDIR
    | sysapi.IN_EXCL_UNLINK
)


class Exhausted(Exception):
    pass


def is_temporary(rel):
    return posixpath.basename(rel).startswith(TEMPORARY_PREFIX)


class Watch:
    """One watched folder (and with `recursive` its subfolders), known by path only.

    No descriptor of a watched folder is kept open: inotify reports a folder's removal only
    once nothing holds it. Folders are opened for a moment, by their path in the sandbox's
    view, whenever their entries are looked at.
    """

    def __init__(self, agent, wid, view, recursive, include_entry):
        self.agent = agent
        self.wid = wid
        self.view = view
        self.recursive = recursive
        self.include_entry = include_entry
        self.fd = sysapi.inotify_init()
        self.folders = {}  # wd -> rel of the folder
        self.known = {}  # rel -> (ino, mode) of every entry seen
        try:
            self.add_folder('', announce=False)
        except BaseException:
            os.close(self.fd)
            raise

    def open_folder(self, rel):
        return self.agent.open(posixpath.join(self.view, rel), os.O_PATH | os.O_DIRECTORY)

    def add_folder(self, rel, announce, events=None):
        """Watches folder `rel` and records (optionally announces) its entries."""
        if len(self.folders) >= MAX_FOLDERS:
            raise Exhausted(f'more than {MAX_FOLDERS} folders to watch')
        try:
            fd = self.open_folder(rel)
        except OSError:
            if rel == '':
                raise
            return  # gone again already: its parent's watch reports that
        try:
            try:
                # Through the magic link of the opened folder: the watch is on that very folder.
                wd = sysapi.inotify_add_watch(self.fd, f'/proc/self/fd/{fd}', FOLDER_MASK)
            except OSError:
                if rel == '':
                    raise
                return
            self.folders[wd] = rel
            try:
                names = sorted(os.listdir(f'/proc/self/fd/{fd}'))
            except OSError:
                return
            for name in names:
                child = posixpath.join(rel, name) if rel else name
                try:
                    info = os.lstat(name, dir_fd=fd)
                except OSError:
                    continue
                fresh = child not in self.known
                self.track(child, info)
                if announce and fresh and not is_temporary(child):
                    events.append(self.event(child, 'EVENT_TYPE_CREATE', fd, name, info))
                if self.recursive and st.S_ISDIR(info.st_mode):
                    self.add_folder(child, announce, events)
        finally:
            os.close(fd)

    def track(self, rel, info):
        if rel not in self.known and len(self.known) >= MAX_ENTRIES:
            raise Exhausted(f'more than {MAX_ENTRIES} entries to watch')
        self.known[rel] = (info.st_ino, info.st_mode)

    def forget(self, rel):
        """Forgets `rel` and everything below it, dropping the watches of its folders."""
        prefix = rel + '/'
        for name in [k for k in self.known if k == rel or k.startswith(prefix)]:
            del self.known[name]
        for wd, folder in list(self.folders.items()):
            if folder == rel or folder.startswith(prefix):
                sysapi.inotify_rm_watch(self.fd, wd)
                del self.folders[wd]

    def event(self, rel, kind, folder_fd, name, info=None):
        event = {'name': rel, 'type': kind}
        if self.include_entry and kind != 'EVENT_TYPE_REMOVE' and kind != 'EVENT_TYPE_RENAME':
            try:
                info = info or os.lstat(name, dir_fd=folder_fd)
                view = posixpath.join(self.view, rel)
                event['entry'] = self.agent.entry(folder_fd, name, view, info)
            except OSError:
                pass
        return event

    def read(self):
        """Turns what inotify queued into events; returns (events, error or None)."""
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return [], None
        raw = list(sysapi.inotify_events(data))
        events = []
        moved_from = {cookie: name for _, mask, cookie, name in raw if mask & sysapi.IN_MOVED_FROM}
        moved_to = {cookie for _, mask, cookie, _ in raw if mask & sysapi.IN_MOVED_TO}
        opened = {}  # rel of a folder -> its descriptor, for this batch
        try:
            for wd, mask, cookie, name in raw:
                if mask & sysapi.IN_Q_OVERFLOW:
                    return events, ('exhausted', 'too many changes at once; the watch lost events')
                rel_folder = self.folders.get(wd)
                if rel_folder is None:
                    continue
                if mask & (sysapi.IN_DELETE_SELF | sysapi.IN_MOVE_SELF | sysapi.IN_IGNORED) and rel_folder == '':
                    return events, ('ENOENT', f"the watched folder '{self.view}' was removed")
                if mask & sysapi.IN_IGNORED:
                    del self.folders[wd]
                    continue
                if not name:
                    continue
                if rel_folder not in opened:
                    try:
                        opened[rel_folder] = self.open_folder(rel_folder)
                    except OSError:
                        opened[rel_folder] = None
                folder_fd = opened[rel_folder]
                rel = posixpath.join(rel_folder, name) if rel_folder else name
                self.apply(rel, mask, cookie, folder_fd, name, moved_from, moved_to, events)
        finally:
            for fd in opened.values():
                if fd is not None:
                    os.close(fd)
        # Consecutive duplicates (a write in several parts) read as one.
        merged = []
        for event in events:
            if not merged or (merged[-1]['name'], merged[-1]['type']) != (event['name'], event['type']):
                merged.append(event)
        return merged, None

    def apply(self, rel, mask, cookie, folder_fd, name, moved_from, moved_to, events):
        temporary = is_temporary(rel)
        if mask & sysapi.IN_MOVED_FROM:
            if temporary:
                self.forget(rel)
                return
            renamed = cookie in moved_to
            self.forget(rel)
            events.append({'name': rel, 'type': 'EVENT_TYPE_RENAME' if renamed else 'EVENT_TYPE_REMOVE'})
            return
        if mask & sysapi.IN_DELETE:
            if rel in self.known:
                self.forget(rel)
                if not temporary:
                    events.append({'name': rel, 'type': 'EVENT_TYPE_REMOVE'})
            return
        if temporary or folder_fd is None:
            return
        try:
            info = os.lstat(name, dir_fd=folder_fd)
        except OSError:
            return
        before = self.known.get(rel)
        if mask & sysapi.IN_MOVED_TO:
            from_temporary = moved_from.get(cookie, '').startswith(TEMPORARY_PREFIX)
            replaced = before is not None
            if replaced:
                self.forget(rel)
            self.track(rel, info)
            if from_temporary and replaced:
                events.append(self.event(rel, 'EVENT_TYPE_WRITE', folder_fd, name, info))
            else:
                events.append(self.event(rel, 'EVENT_TYPE_CREATE', folder_fd, name, info))
                if from_temporary:
                    events.append(self.event(rel, 'EVENT_TYPE_WRITE', folder_fd, name, info))
            # A folder moved in keeps its content unannounced.
            if self.recursive and st.S_ISDIR(info.st_mode):
                self.add_folder(rel, False, events)
            return
        if mask & sysapi.IN_CREATE:
            if before is not None and before[0] == info.st_ino:
                return
            self.track(rel, info)
            events.append(self.event(rel, 'EVENT_TYPE_CREATE', folder_fd, name, info))
            if self.recursive and st.S_ISDIR(info.st_mode):
                self.add_folder(rel, True, events)
            return
        if mask & sysapi.IN_MODIFY:
            self.track(rel, info)
            if not st.S_ISDIR(info.st_mode):
                events.append(self.event(rel, 'EVENT_TYPE_WRITE', folder_fd, name, info))
            return
        if mask & sysapi.IN_ATTRIB:
            self.track(rel, info)
            if before is None or st.S_IMODE(before[1]) != st.S_IMODE(info.st_mode):
                events.append(self.event(rel, 'EVENT_TYPE_CHMOD', folder_fd, name, info))

    def close(self):
        self.folders.clear()
        os.close(self.fd)


class Watches:
    """The watches of one file agent, by the id Moat gave each."""

    def __init__(self, agent, selector):
        self.agent = agent
        self.selector = selector
        self.by_id = {}

    def open(self, message):
        wid = message.get('wid')
        if not isinstance(wid, str) or wid in self.by_id:
            raise ValueError('watch id missing or in use')
        path = self.agent.absolute(message.get('path'))
        fd = self.agent.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            if not st.S_ISDIR(os.fstat(fd).st_mode):
                raise NotADirectoryError(20, 'not a directory', path)
            view = self.agent.view_of(fd)
        finally:
            os.close(fd)
        watch = Watch(self.agent, wid, view, bool(message.get('recursive')), bool(message.get('includeEntry')))
        self.by_id[wid] = watch
        self.selector.register(watch.fd, 1, ('watch', wid))
        return {'path': view, 'folders': len(watch.folders)}

    def close(self, wid):
        watch = self.by_id.pop(wid, None)
        if watch is not None:
            self.selector.unregister(watch.fd)
            watch.close()

    def read(self, wid):
        watch = self.by_id.get(wid)
        if watch is None:
            return
        try:
            events, error = watch.read()
        except Exhausted as exhausted:
            events, error = [], ('exhausted', str(exhausted))
        if events:
            frames.send(self.agent.sock, {'wid': wid, 'events': events})
        if error is not None:
            frames.send(self.agent.sock, {'wid': wid, 'error': {'code': error[0], 'message': error[1]}})
            self.close(wid)
